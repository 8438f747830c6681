/**
 * Rank (number of axes) of every tensor we can know without running the model: from declared shapes,
 * initializers, and the shape rules of the common ops. Attention detection needs ranks to resolve
 * Softmax axes and to tell 4-D [B,H,Tq,Tk] logits from 3-D [B·H,Tq,Tk].
 */
import { NodeProto } from '../io/onnx';
import { attrInt, attrInts, Graph } from './graph';
import { topoOrder } from './toposort';

const sameAsFirst = new Set([
  'Cast', 'Softmax', 'LogSoftmax', 'Dropout', 'Relu', 'Gelu', 'FastGelu', 'Tanh', 'Sigmoid', 'Erf', 'Sqrt', 'Exp',
  'Log', 'Neg', 'Abs', 'Reciprocal', 'Identity', 'LayerNormalization', 'SimplifiedLayerNormalization', 'IsNaN',
  'IsInf', 'Not', 'Softplus', 'Transpose', 'Slice', 'Trilu', 'CumSum', 'Clip', 'Round', 'Floor', 'Ceil',
  'SkipLayerNormalization', 'SkipSimplifiedLayerNormalization', 'RotaryEmbedding', 'HardSigmoid', 'Mish',
  'Sin', 'Cos', 'Concat', 'Split', 'Expand', 'Tile', 'Pad', 'ScatterND', 'ScatterElements', 'GatherElements',
]);
const broadcasting = new Set([
  'Add', 'Sub', 'Mul', 'Div', 'Pow', 'Where', 'Equal', 'Less', 'Greater', 'LessOrEqual', 'GreaterOrEqual', 'And',
  'Or', 'Xor', 'Max', 'Min', 'Mod', 'BitShift', 'Sum', 'Mean', 'PRelu',
]);

/** `outer`: ranks already known in the enclosing scope, for the names a subgraph reads from it. */
export function inferRanks(graph: Graph, outer?: Map<string, number>): Map<string, number> {
  const ranks = new Map<string, number>(outer ?? []);
  const rank = (name: string): number | undefined => ranks.get(name) ?? graph.declaredRank(name);
  for (const [name, t] of graph.initializers) ranks.set(name, t.dims.length);
  for (const name of graph.inputs) {
    const d = graph.declaredRank(name);
    if (d !== undefined) ranks.set(name, d);
  }
  for (const node of topoOrder(graph.proto)) {
    const r = nodeOutputRank(node, rank, graph);
    if (r !== undefined) for (const o of node.output.slice(0, node.opType === 'Split' ? undefined : 1)) ranks.set(o, r);
    // Keep declared ranks where our rules know nothing.
    for (const o of node.output) {
      const d = graph.declaredRank(o);
      if (d !== undefined) ranks.set(o, d);
    }
  }
  return ranks;
}

function nodeOutputRank(node: NodeProto, rank: (n: string) => number | undefined, graph: Graph): number | undefined {
  const inRanks = node.input.map((n) => (n ? rank(n) : undefined));
  const op = node.opType;
  if (sameAsFirst.has(op)) return inRanks[0];
  // An SSMax factor is built never to broadcast past what it multiplies (its s may be an untyped function input).
  if (op === 'Mul' && /^ssmax\/L\d+\/apply(_\d+)?$/.test(node.name)) return inRanks[0];
  if (broadcasting.has(op)) {
    if (inRanks.some((r) => r === undefined)) return undefined;
    return Math.max(...(inRanks as number[]));
  }
  switch (op) {
    case 'MatMul': case 'FusedMatMul': {
      const [a, b] = inRanks;
      if (a === undefined || b === undefined) return undefined;
      return Math.max(a, b, 2) - (a === 1 || b === 1 ? 1 : 0);
    }
    case 'Gemm': return 2;
    case 'Shape': case 'NonZero': return op === 'Shape' ? 1 : 2;
    case 'Size': return 0;
    case 'Range': return 1;
    case 'Reshape': {
      const shape = graph.constValue(node.input[1]);
      if (shape) return shape.values.length;
      const sr = shapeTensorLength(node.input[1], graph);
      return sr;
    }
    case 'Unsqueeze': {
      const axes = attrInts(node, 'axes') ?? graph.constValue(node.input[1])?.values;
      return inRanks[0] !== undefined && axes ? inRanks[0] + axes.length : undefined;
    }
    case 'Squeeze': {
      const axes = attrInts(node, 'axes') ?? (node.input[1] ? graph.constValue(node.input[1])?.values : undefined);
      return inRanks[0] !== undefined && axes ? inRanks[0] - axes.length : undefined;
    }
    case 'Gather': {
      const [d, i] = inRanks;
      return d !== undefined && i !== undefined ? d - 1 + i : undefined;
    }
    case 'Flatten': return 2;
    case 'ReduceMean': case 'ReduceSum': case 'ReduceMax': case 'ReduceMin': case 'ReduceProd': {
      if (inRanks[0] === undefined) return undefined;
      if ((attrInt(node, 'keepdims') ?? 1) === 1) return inRanks[0];
      const axes = attrInts(node, 'axes') ?? (node.input[1] ? graph.constValue(node.input[1])?.values : undefined);
      return axes ? inRanks[0] - axes.length : 0;
    }
    case 'ConstantOfShape': {
      const shape = graph.constValue(node.input[0]);
      return shape ? shape.values.length : shapeTensorLength(node.input[0], graph);
    }
    case 'Constant': return graph.constValue(node.output[0])?.dims.length;
    case 'Einsum': {
      const eq = node.attribute.find((a) => a.name === 'equation')?.s;
      const rhs = eq ? Buffer.from(eq).toString().split('->')[1] : undefined;
      return rhs !== undefined ? rhs.trim().replace(/\.\.\./g, '').length : undefined;
    }
    default: return undefined;
  }
}

/** Length of a 1-D shape tensor built by Concat of pieces (how exporters build dynamic Reshape targets). */
function shapeTensorLength(name: string, graph: Graph): number | undefined {
  const c = graph.constValue(name);
  if (c) return c.values.length;
  const node = graph.producer.get(name);
  if (!node) return undefined;
  if (node.opType === 'Concat') {
    let total = 0;
    for (const i of node.input) {
      const n = pieceLength(i, graph);
      if (n === undefined) return undefined;
      total += n;
    }
    return total;
  }
  if (node.opType === 'Shape') {
    const r = graph.declaredRank(node.input[0]);
    return r;
  }
  return undefined;
}

function pieceLength(name: string, graph: Graph): number | undefined {
  const c = graph.constValue(name);
  if (c) return c.values.length;
  const node = graph.producer.get(name);
  if (node?.opType === 'Unsqueeze') return 1;
  if (node?.opType === 'Cast' || node?.opType === 'Identity') return pieceLength(node.input[0], graph);
  if (node?.opType === 'Shape') {
    // Shape-15 with start/end: a slice of the input's shape.
    const start = attrInt(node, 'start');
    const end = attrInt(node, 'end');
    if (start !== undefined && end !== undefined && Math.sign(start) === Math.sign(end)) return Math.max(end - start, 0);
    const r = graph.declaredRank(node.input[0]);
    if (r === undefined) return undefined;
    const clamp = (v: number): number => Math.min(Math.max(v < 0 ? v + r : v, 0), r);
    return Math.max(clamp(end ?? r) - clamp(start ?? 0), 0);
  }
  if (node?.opType === 'Slice' || node?.opType === 'Gather') {
    const idx = node.opType === 'Gather' ? graph.constValue(node.input[1]) : null;
    if (idx) return idx.dims.length === 0 ? 0 : idx.values.length;
    const starts = graph.constValue(node.input[1]);
    const ends = graph.constValue(node.input[2]);
    if (starts && ends && starts.values.length === 1 && ends.values[0] < 1e9 && starts.values[0] >= 0) {
      return ends.values[0] - starts.values[0];
    }
  }
  return undefined;
}
