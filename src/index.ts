/**
 * Library API of ssmax-patch: the same pipeline the CLI runs, stage by stage. Every type reachable from here is
 * exported from here (api-extractor checks it: `npm run api`).
 */

// Model I/O.
export { readModel, parseModel, writeModel, serializeModel } from './io/model-file';
export type { WriteOptions, WriteReport, ExternalDataMode, ParseOptions, SerializeOptions, Placement } from './io/model-file';
export type { Stray } from './io/sink';
export { terminalProgress } from './io/progress';
export type { Progress, ProgressOptions } from './io/progress';
export { cloneModel } from './io/model-file';
export type {
  ModelProto, GraphProto, NodeProto, TensorProto, AttributeProto, FunctionProto, ValueInfoProto, TypeProto, Dimension, OperatorSetId, StringStringEntry,
  Int64,
} from './io/onnx';

// The graph index.
export { Graph } from './graph/graph';
export type { GraphOptions, NameRegistry } from './graph/graph';
export { topoSort } from './graph/toposort';
export { validateGraph } from './graph/validate';
export type { GraphFindings } from './graph/validate';
export { modelScopes } from './graph/scopes';
export type { FunctionCall, Scope } from './graph/scopes';
export type { CallShapes, ShapeOptions, Shapes } from './graph/shapes';
export type { Query, Visit } from './graph/query';
export type { ConstTensor } from './graph/tensor';
export type { Poly } from './graph/poly';
export type { AncestryReader, ConstantReader, ValueReads } from './graph/view';

// What is known of a model before anything changes, computed once and handed to patch and verify.
export { analyseModel } from './analysis/analyse';
export type { Analysis, AnalyseOptions } from './analysis/analyse';

// Attention detection, as named rules.
export { findAttentionSoftmax, detectAttention, explainNode } from './detect/find-attention';
export type { AttentionSite, CallSite, Detection, DetectOptions, SkippedSoftmax, Explanation } from './detect/find-attention';
export { RULES } from './detect/rules';
export type { Rule, RuleContext, Found, Stop, CandidateTrace, RuleAttempt } from './detect/rules';
export type { FusedSite, FusedMatch } from './detect/fused';
export { PATCHED_OPS, REFUSED_OPS } from './graph/attention-ops';
export type {
  FusedOp, NPlan, QueryPlan, Term, AxisTerm, HeadInfo, MaskVerdict, AttentionOp, PatchedOp, RefusedOp, OpBase, QkOutput, QkReading, OpMatch,
  NodeView, Contracts, LengthFill,
} from './graph/attention-ops';
export type { Step } from './detect/trace';

// The factor, s and n.
export { scaleFromTrainLen } from './policy/scale';
export type { SValue, LayerScale } from './policy/scale';
export type { PresetName } from './policy/factor';
export type { PriorName, Theta, ThetaName } from './policy/prior';
export type { LayerSelection } from './policy/layers';
export type { NOption, NMode } from './policy/n-mode';

// The patch and its record.
export { patchModel } from './rewrite/patch';
export type { PatchOptions, PatchReport, PatchResult, PatchedSite } from './rewrite/patch';
export type { LengthReport } from './analysis/reach';
export type { Target } from './rewrite/insert-scale';
export type { CacheLayout, FusedAttention } from './rewrite/sites';
export type { CacheSplit } from './rewrite/ms-attention';
export type { PlanOptions } from './policy/plan';
export type { ScaleOptions } from './policy/scale';
export type { PriorOptions } from './policy/prior';
export type { WindowOptions, WindowSpec } from './policy/window';
export type { RopeMethod, RopeOptions, RopeSpec } from './policy/rope';
export type { RopeSiteRecord } from './rewrite/rope';
export type { PresetOptions } from './policy/factor';
export { readRecord } from './rewrite/record';
export type { PatchRecord, SiteRecord } from './rewrite/record';
export type { Declared, ScopeEdits, Rewire } from './rewrite/journal';
export { revertModel } from './rewrite/revert';
export type { RevertReport, RevertedSite, RevertResult } from './rewrite/revert';
export { findFactors } from './rewrite/existing';
export type { Factor } from './rewrite/existing';

// Verification on onnxruntime.
export { verifyPatch, withUnitFactor } from './verify/verify';
export type { VerifyOptions } from './verify/verify';
export { planVerification } from './verify/verification-plan';
export type { VerificationPlan, SubjectPlan, PlannedRun } from './verify/verification-plan';
export type { VerifyReport, CheckResult, RunResult, Status, InputReport, RunReport, RunIdentity, SessionReport, SkipKind } from './verify/report';
export type { ProbeSiteResult } from './verify/probe';
export type { InputRole } from './analysis/signature';
export type { CheckId } from './verify/plan';
export type { Tolerance, OutputStats } from './verify/compare';
export type { SharpnessCurve, SharpnessPoint } from './verify/sharpness';
export type { RuntimeReport, RuntimeName } from './onnxruntime';
export { readTensorFile } from './verify/tensor-files';
export type { HostTensor, HostType, HostData } from './verify/tensors';
export { sharpnessSvg } from './verify/plot';
export type { PlotLabels } from './verify/plot';

export { InputError, VerificationError, SsmaxError, ERROR_CODES } from './errors';
export type { ErrorCode, InputErrorCode } from './errors';

// Calibration of the slope preset's s from the model's own attention.
export { calibrateSlope } from './calibrate/calibrate';
export type { CalibrateOptions, CalibrationResult } from './calibrate/calibrate';
export type { CalibrationReport, CalibrationGroup, CurvePoint, MatchStatistic, SearchState } from './calibrate/report';
export type { Granularity } from './calibrate/stats';
