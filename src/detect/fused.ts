/**
 * Fused attention operators (com.microsoft MultiHeadAttention, GroupQueryAttention, DecoderMaskedMultiHeadAttention,
 * Attention; ONNX Attention from opset 23), one rule each: the Softmax is inside the kernel, so the SSMax factor
 * goes on the query (scaling query row i by c_i scales logits row i by c_i, also through RoPE, which is linear).
 * Each operator's spec (graph/attention-ops) says where the query is, how n is read from the operator's inputs,
 * and where the equivalence breaks (a deviation: refused unless the user forces the site); its rule here asks the
 * spec about the node, answering its questions from the graph.
 */
import { FusedOp, inputAt, inputOf, isOp, NodeView, PATCHED_OPS, PatchedOp, queryInput, REFUSED_OPS } from '../graph/attention-ops';
import { attrFloat, attrInt, attrInts } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { Shapes } from '../graph/shapes';
import { isDefaultDomain, NodeProto } from '../io/onnx';
import { isApplyNode, isPatchNode } from '../identity';
import { declaredDim } from './heads';
import { classifyMasks } from './mask';
import type { FusedMatch, Rule } from './site';

export type { FusedMatch, FusedSite } from './site';

const MS = 'com.microsoft';

/** Attention operators this tool recognises but cannot patch, with the reason. */
const unsupported: Record<string, string> = {
  ...Object.fromEntries(REFUSED_OPS.map((s) => [s.opType, s.refused])),
  SparseAttention: 'block-sparse kernel: n is the number of keys its block layout leaves, which the tool does not reproduce; patch the dense model instead',
  PagedAttention: 'paged KV cache: n needs the block tables; patch the model exported with a contiguous KV cache instead',
  LongformerAttention: 'sliding-window plus global attention: n differs per row in ways the inputs do not state; patch the model exported in plain ops (before it was fused into LongformerAttention) instead',
  QAttention: 'quantized kernel (int8 query weights): patch the float model, then quantize it',
  QOrderedAttention: 'quantized kernel (int8 query weights): patch the float model, then quantize it',
  QOrderedLongformerAttention: 'quantized kernel (int8 query weights): patch the float model, then quantize it',
  DecoderAttention: 'legacy DecoderAttention: Q is computed inside from weights with a per-step cache layout; patch the model before it was fused into DecoderAttention instead',
  DecoderMaskedSelfAttention: 'Q is computed inside from weights with a shared cache buffer; patch the model before it was fused into DecoderMaskedSelfAttention instead',
  FlexAttention: 'onnxruntime has no kernel for it, so a patch could not be checked against the original, and its score_mod may change '
    + 'the logits arbitrarily; expand it into its function body (the model\'s `_expanded` form, or onnx\'s function inliner) and patch that: '
    + 'the plain-op rules put the factor on the content logits there',
};

/**
 * A fused-operator rule from the operator's spec: its matcher on the node, then its deviation from exact SSMax
 * refused unless forced.
 */
function fusedRule(spec: PatchedOp): Rule {
  return {
    name: spec.rule,
    applies: (node, ctx) => isOp(spec, node) && (spec.sinceOpset === undefined || ctx.scope.opset >= spec.sinceOpset),
    match: (ctx, node) => {
      const found = spec.match(nodeView(ctx.scope, spec, node));
      if ('reason' in found) return { at: node, reason: found.reason, steps: 0, attention: true };
      const m: Omit<FusedMatch, 'queryType'> = { node, op: spec.id as FusedOp, ...found };
      if (m.deviation && !ctx.forced) return { at: node, reason: `${m.op.replace(`${MS}.`, '')}: ${m.deviation}`, steps: 1, attention: true, forcible: true };
      const query = inputOf(spec, node, queryInput(m.query));
      // An earlier run's factor on the query: the first inserted `apply` node up its chain of inserted nodes.
      const patchedBy = ctx.scope.graph.query.first('ssmax-apply', query, (_t, p) => (!p || !isPatchNode(p) ? null
        : isApplyNode(p) ? p : undefined));
      const queryType = ctx.scope.shapes.type(query) ?? fusedElementType(ctx.scope.shapes, spec, node);
      return { kind: 'fused', site: { ...m, queryType, forced: Boolean(m.deviation), patchedBy } };
    },
  };
}

/** The graph's answers to a spec's questions about one node. */
function nodeView(ctx: Scope, spec: PatchedOp, node: NodeProto): NodeView<string, string> {
  const has = (role: string): boolean => Boolean(node.input[inputAt(spec, role)]);
  return {
    has,
    hasOutput: (role) => Boolean(node.output[spec.outputs[role]]),
    rank: (role) => (has(role) ? ctx.shapes.rank(inputOf(spec, node, role)) : undefined),
    declaredDim: (role, axis) => declaredDim(ctx.graph, inputOf(spec, node, role), axis),
    int: (name) => attrInt(node, name),
    float: (name) => attrFloat(node, name),
    ints: (name) => attrInts(node, name),
    masks: (roles, why) => classifyMasks(ctx.graph, roles.filter(has).map((r) => inputOf(spec, node, r)), `no mask (${why})`),
  };
}

/**
 * The element type T of a fused attention operator: the inputs its spec names share it (query, key, value; input,
 * weights, bias), so any of them tells it when another comes from an op of unknown output type.
 */
export function fusedElementType(shapes: Shapes, spec: { id: string; inputs: Readonly<Record<string, number>>; elementType: readonly string[] },
  node: NodeProto): number | undefined {
  const given = spec.elementType.map((r) => inputAt(spec, r)).filter((at) => at < node.input.length);
  return given.map((at) => shapes.type(node.input[at])).find((t) => t !== undefined);
}

/** One rule per patched operator, in the order of its spec list. */
export const fusedRules: readonly Rule[] = PATCHED_OPS.map(fusedRule);

/** Attention operators of other domains this tool recognises but cannot patch: refused with the reason. */
export const unsupportedFused: Rule = {
  name: 'fused/unsupported',
  applies: (node) => !isDefaultDomain(node.domain) && node.opType in unsupported,
  match: (_ctx, node) => ({ at: node, reason: `fused ${node.opType}: not patched (${unsupported[node.opType]})`, steps: 0, attention: true }),
};
