/**
 * The fused attention operators the tool knows, one spec each (types.ts says what a spec holds). Adding an
 * operator is its spec file, its line here and its tests; detection makes a rule of every patched spec, in this
 * order.
 */
import { isDefaultDomain, type NodeProto } from '../../io/onnx';
import { MS_ATTENTION } from './attention';
import { DECODER_MASKED_MULTI_HEAD_ATTENTION } from './decoder-masked-multi-head-attention';
import { GROUP_QUERY_ATTENTION } from './group-query-attention';
import { MULTI_HEAD_ATTENTION } from './multi-head-attention';
import { ONNX_ATTENTION } from './onnx-attention';
import { PACKED_ATTENTION } from './packed-attention';
import { PACKED_MULTI_HEAD_ATTENTION } from './packed-multi-head-attention';
import { AttentionOp, PatchedOp, RefusedOp } from './types';

export { MS_ATTENTION, MULTI_HEAD_ATTENTION, ONNX_ATTENTION };
export { queryInput } from './types';
export type {
  AttentionOp, AxisTerm, Contracts, HeadInfo, LengthFill, MaskVerdict, NodeView, NPlan, OpBase, OpMatch, PatchedOp, QkOutput, QkReading,
  QueryPlan, RefusedOp, Term,
} from './types';

/**
 * The operators the tool patches, in the order their detection rules are tried.
 * @internal
 */
export const PATCHED_OPS = [MULTI_HEAD_ATTENTION, GROUP_QUERY_ATTENTION, DECODER_MASKED_MULTI_HEAD_ATTENTION, MS_ATTENTION, ONNX_ATTENTION] as const;

/**
 * The operators the tool recognises and refuses with the reason.
 * @internal
 */
export const REFUSED_OPS: readonly RefusedOp[] = [PACKED_ATTENTION, PACKED_MULTI_HEAD_ATTENTION];

/**
 * How reports name a patched operator.
 * @internal
 */
export type FusedOp = (typeof PATCHED_OPS)[number]['id'];

const ALL: readonly AttentionOp[] = [...PATCHED_OPS, ...REFUSED_OPS];

/** The spec of a patched operator by its id. */
export function opSpec(id: FusedOp): PatchedOp {
  return PATCHED_OPS.find((s) => s.id === id)!;
}

/** The node is of this operator (ONNX's own domain is '' or `ai.onnx`). */
export function isOp(spec: AttentionOp, node: NodeProto): boolean {
  const domain = isDefaultDomain(node.domain) ? '' : node.domain;
  return domain === spec.domain && node.opType === spec.opType;
}

/** The spec of a node's operator, when it is one of these. */
export function specOf(node: NodeProto): AttentionOp | undefined {
  return ALL.find((s) => isOp(s, node));
}

/** The spec of a node's operator, when the tool patches it. */
export function patchedSpecOf(node: NodeProto): PatchedOp | undefined {
  return PATCHED_OPS.find((s) => isOp(s, node));
}

/** The position of an input role; a role the operator does not have is an internal error. */
export function inputAt<I extends string>(spec: { id: string; inputs: Readonly<Record<I, number>> }, role: I): number {
  const at = spec.inputs[role];
  if (at === undefined) throw new Error(`internal error: ${spec.id} has no input '${role}'`);
  return at;
}

/** The tensor a node gives in an input role ('' when it gives none). */
export function inputOf<I extends string>(spec: { id: string; inputs: Readonly<Record<I, number>> }, node: NodeProto, role: I): string {
  return node.input[inputAt(spec, role)] ?? '';
}

/** The tensor a node writes in an output role ('' when it writes none). */
export function outputOf<O extends string>(spec: { outputs: Readonly<Record<O, number>> }, node: NodeProto, role: O): string {
  return node.output[spec.outputs[role]] ?? '';
}

/** The role of an input position, if the operator has one there. */
export function roleAt(spec: AttentionOp, position: number): string | undefined {
  return Object.entries(spec.inputs).find(([, at]) => at === position)?.[0];
}

/** A node's input list from tensors by role: '' for the roles left out before the last one given. */
export function inputList<I extends string>(spec: { id: string; inputs: Readonly<Record<I, number>> }, byRole: Partial<Record<I, string>>): string[] {
  const list: string[] = [];
  for (const [role, tensor] of Object.entries(byRole) as [I, string | undefined][]) {
    if (tensor === undefined) continue;
    const at = inputAt(spec, role);
    while (list.length < at) list.push('');
    list[at] = tensor;
  }
  return list;
}
