/**
 * Every node the patch inserted has inputs of the element types its op requires, checked on the patched model
 * with a fresh type pass before anything is written: a mis-typed patch (an fp32 factor on an fp16 tensor, say) is
 * an internal error, never a file no runtime loads.
 */
import { inputAt, MULTI_HEAD_ATTENTION } from '../graph/attention-ops';
import { nodeLabel } from '../graph/graph';
import { modelScopes } from '../graph/scopes';
import { DataType, ModelProto, NodeProto } from '../io/onnx';
import { isPatchNode } from '../identity';

/** Input positions that must share one element type, per op (ops not listed are not checked). */
const SAME: Record<string, number[]> = {
  Add: [0, 1], Sub: [0, 1], Mul: [0, 1], Div: [0, 1], Max: [0, 1], Min: [0, 1], Pow: [0, 1], Equal: [0, 1], Less: [0, 1],
  Greater: [0, 1], LessOrEqual: [0, 1], GreaterOrEqual: [0, 1], Where: [1, 2], MatMul: [0, 1], FusedMatMul: [0, 1], Range: [0, 1, 2],
  Concat: [],
  // MultiHeadAttention's inputs of type T (the expansion of com.microsoft Attention inserts one).
  [MULTI_HEAD_ATTENTION.opType]: (['query', 'key', 'value', 'bias', 'attention_bias', 'past_key', 'past_value'] as const)
    .map((r) => inputAt(MULTI_HEAD_ATTENTION, r)),
};
/** Inputs that must be of one given type. */
const FIXED: Record<string, Record<number, number[]>> = {
  Where: { 0: [DataType.BOOL] }, And: { 0: [DataType.BOOL], 1: [DataType.BOOL] }, Or: { 0: [DataType.BOOL], 1: [DataType.BOOL] },
  Not: { 0: [DataType.BOOL] }, Reshape: { 1: [DataType.INT64] }, Expand: { 1: [DataType.INT64] }, Unsqueeze: { 1: [DataType.INT64] },
  Squeeze: { 1: [DataType.INT64] }, ReduceSum: { 1: [DataType.INT64] }, ReduceMax: { 1: [DataType.INT64] },
  Slice: { 1: [DataType.INT64, DataType.INT32], 2: [DataType.INT64, DataType.INT32] }, Gather: { 1: [DataType.INT64, DataType.INT32] },
  Softmax: { 0: [DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16] },
  Log: { 0: [DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16] },
};

/** Throws an internal error naming the first inserted node whose inputs break its op's type constraints. */
export function checkInsertedTypes(model: ModelProto): void {
  for (const scope of modelScopes(model)) {
    for (const node of scope.graph.nodes) {
      if (!isPatchNode(node) || (node.domain && node.domain !== 'com.microsoft')) continue;
      const problem = typeProblem(node, (name) => scope.shapes.type(name));
      if (problem) throw new Error(`internal error: inserted node '${nodeLabel(node)}' (${node.opType}) ${problem} in ${scope.path}`);
    }
  }
}

function typeProblem(node: NodeProto, typeOf: (name: string) => number | undefined): string | null {
  const present = (i: number): boolean => Boolean(node.input[i]);
  const same = SAME[node.opType];
  if (same) {
    const indices = same.length ? same.filter(present) : node.input.map((_, i) => i).filter(present);
    const types = indices.map((i) => typeOf(node.input[i]));
    const known = types.filter((t): t is number => t !== undefined);
    if (new Set(known).size > 1) return `mixes element types ${indices.map((i, k) => `input ${i}: ${types[k] ?? '?'}`).join(', ')}`;
  }
  for (const [i, allowed] of Object.entries(FIXED[node.opType] ?? {})) {
    const t = present(Number(i)) ? typeOf(node.input[Number(i)]) : undefined;
    if (t !== undefined && !allowed.includes(t)) return `reads element type ${t} at input ${i}, where it needs ${allowed.join(' or ')}`;
  }
  return null;
}
