/** Library API of ssmax-patch: the same pipeline the CLI runs, stage by stage. */
export { readModel, parseModel, writeModel, serializeModel } from './io/model-file';
export type { ModelProto, GraphProto, NodeProto, TensorProto } from './io/onnx';
export { Graph } from './graph/graph';
export { topoSort } from './graph/toposort';
export { findAttentionSoftmax } from './detect/find-attention';
export type { AttentionSite, Detection, SkippedSoftmax } from './detect/find-attention';
export { resolveScaleSpec, parseScaleJson, scaleFromTrainLen } from './policy/scale';
export type { ScaleSpec, LayerScale } from './policy/scale';
export type { NOption, NMode } from './policy/n-mode';
export { patchModel } from './rewrite/patch';
export type { PatchOptions, PatchReport, PatchResult, PatchedSite } from './rewrite/patch';
export { readRecord } from './rewrite/record';
export { verifyPatch, withUnitFactor } from './verify/verify';
export type { VerifyOptions, VerifyReport, CheckResult, CheckId } from './verify/verify';
export { sharpnessSvg } from './verify/plot';
export { InputError, VerificationError, SsmaxError } from './errors';
