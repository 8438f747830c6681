/**
 * What this tool knows about each op, in one table every stage reads:
 *   shape     how the output shapes follow from the inputs (shape-rules.ts; the shape pass and ranks);
 *   type      the output element type when it is not input 0's (the dtype of inserted ops);
 *   typed     which outputs have that type (default: output 0; every output of Split);
 *   logits    inputs through which attention logits flow toward the Softmax (detection, finding a patch);
 *   probs     carries attention probabilities on to the product with the values (detection);
 *   keepsAxes the output's axes are input 0's, element for element (tracing the head axis);
 *   position  a position index stays a position through it (the longest context a model can run);
 *   view      the same values, maybe in another shape or type (following token ids to their embedding);
 *   shapeOnly reads the shape of its input, never the values (dependency queries stop there);
 *   product   a product of two operands that can compute query·keyᵀ or probabilities·values.
 * An op in the table without a type rule keeps input 0's element type. Ops not in the table are opaque: unknown
 * shape, unknown type (an embedding op reads int ids and writes floats: guessing input 0's type would make a
 * well-typed patch look mis-typed), no role.
 */
import { DataType, NodeProto } from '../io/onnx';
import type { Graph } from './graph';
import { attr, attrInt } from './node';
import * as R from './shape-rules';

export type TypeRule = 'bool' | 'int64' | ((node: NodeProto, typeOf: (name: string) => number | undefined, graph: Graph) => number | undefined);

export interface OpInfo {
  shape?: R.ShapeRule;
  type?: TypeRule;
  typed?: number[] | 'all';
  logits?: number[];
  probs?: boolean;
  keepsAxes?: boolean;
  position?: boolean;
  view?: boolean;
  shapeOnly?: boolean;
  product?: boolean;
}

const unary: OpInfo = { shape: R.unary };
const elementwise: OpInfo = { shape: R.elementwise };
const compare: OpInfo = { shape: R.elementwise, type: 'bool' };

export const OPS: Readonly<Record<string, OpInfo>> = {
  // Carriers of logits, probabilities, heads and positions.
  Cast: { shape: R.unary, type: (n) => attrInt(n, 'to'), logits: [0], probs: true, keepsAxes: true, position: true, view: true },
  CastLike: { shape: R.unary, type: (n, typeOf) => typeOf(n.input[1]) },
  Identity: { shape: R.unary, logits: [0], probs: true, keepsAxes: true, position: true, view: true },
  Reshape: { shape: R.reshape, logits: [0], probs: true, position: true, view: true },
  Squeeze: { shape: R.squeeze, logits: [0], probs: true, position: true, view: true },
  Unsqueeze: { shape: R.unsqueeze, logits: [0], probs: true, position: true, view: true },
  Flatten: { shape: R.flatten, position: true, view: true },
  Dropout: { shape: R.unary, probs: true },
  Where: { shape: R.where, type: (n, typeOf) => typeOf(n.input[1]) ?? typeOf(n.input[2]), logits: [1, 2], probs: true },
  Mul: { shape: R.elementwise, logits: [0, 1], probs: true, keepsAxes: true, position: true },
  Div: { shape: R.elementwise, logits: [0], keepsAxes: true },
  Add: { shape: R.elementwise, logits: [0, 1], keepsAxes: true, position: true },
  Sub: { shape: R.elementwise, logits: [0], keepsAxes: true, position: true },
  Max: { shape: R.elementwise, logits: [0, 1] },
  Min: { shape: R.elementwise, logits: [0, 1] },
  Tanh: { shape: R.unary, logits: [0] },
  Clip: { shape: R.unary, logits: [0] },
  Neg: { shape: R.unary, keepsAxes: true },
  Concat: { shape: R.concat, keepsAxes: true, position: true },
  Slice: { shape: R.slice, keepsAxes: true, position: true },
  Gather: { shape: R.gather, position: true },
  // Probabilities broadcast over batch or heads are still each row's (torch's matmul lowering: Expand → Reshape → bmm).
  Expand: { shape: R.expand, probs: true, position: true },
  Tile: { shape: R.tile, position: true },
  CumSum: { shape: R.unary, position: true },
  Range: { shape: R.range, position: true },
  Constant: { type: (n, _t, g) => g.constValue(n.output[0])?.dataType, position: true },
  ConstantOfShape: { shape: R.constantOfShape, type: (n) => attr(n, 'value')?.t?.dataType ?? DataType.FLOAT, position: true },
  Shape: { shape: R.shapeOf, type: 'int64', position: true, shapeOnly: true },
  // A branch's output type, where the branch declares it (not its condition's bool).
  If: { type: (n) => attr(n, 'then_branch')?.g?.output[0]?.type?.tensorType?.elemType || undefined },
  Size: { shape: R.size, type: 'int64', shapeOnly: true },
  MatMul: { shape: R.matmul, product: true },
  FusedMatMul: { shape: R.matmul, product: true },
  Einsum: { shape: R.einsum, product: true },
  // Shape and type only.
  Softmax: unary, LogSoftmax: unary, Relu: unary, Gelu: unary, FastGelu: unary, Sigmoid: unary, Erf: unary, Sqrt: unary,
  Exp: unary, Log: unary, Abs: unary, Reciprocal: unary, LayerNormalization: unary, SimplifiedLayerNormalization: unary,
  RotaryEmbedding: unary, Softplus: unary,
  Trilu: unary, Round: unary, Floor: unary, Ceil: unary, Sin: unary, Cos: unary, HardSigmoid: unary, Mish: unary,
  ScatterND: unary, ScatterElements: unary,
  IsNaN: { shape: R.unary, type: 'bool' }, IsInf: { shape: R.unary, type: 'bool' }, Not: { shape: R.unary, type: 'bool' },
  Pow: elementwise, Mod: elementwise, BitShift: elementwise, Sum: elementwise, Mean: elementwise, PRelu: elementwise,
  Equal: { shape: R.equal, type: 'bool' }, Less: compare, Greater: compare, LessOrEqual: compare, GreaterOrEqual: compare, And: compare,
  Or: compare, Xor: compare,
  Transpose: { shape: R.transpose },
  Pad: { shape: R.sameRank },
  GatherElements: { shape: R.likeInput1 },
  Gemm: { shape: R.gemm },
  Split: { shape: R.split, typed: 'all' },
  // Output 3 is the sum of the input and the skip, in the input's type (outputs 1 and 2, mean and 1/σ, are float).
  SkipLayerNormalization: { shape: R.skipNorm, typed: [0, 3] }, SkipSimplifiedLayerNormalization: { shape: R.skipNorm, typed: [0, 3] },
  ReduceMean: { shape: R.reduce }, ReduceSum: { shape: R.reduce }, ReduceMax: { shape: R.reduce }, ReduceMin: { shape: R.reduce },
  ReduceProd: { shape: R.reduce }, ReduceL2: { shape: R.reduce },
  NonZero: { shape: R.nonZero, type: 'int64' },
  ArgMax: { type: 'int64' }, ArgMin: { type: 'int64' },
  // Type only: input 0's (the query of the attention operators, the activations of the others).
  Attention: {}, MultiHeadAttention: {}, GroupQueryAttention: {}, DecoderMaskedMultiHeadAttention: {}, PackedAttention: {},
  PackedMultiHeadAttention: {}, BiasGelu: {}, QuickGelu: {}, BiasAdd: {}, Conv: {}, MaxPool: {}, AveragePool: {},
  GlobalAveragePool: {}, RemovePadding: {}, RestorePadding: {}, Compress: {},
  // Ids in, embeddings out: the type of the word embedding table (input 2).
  EmbedLayerNormalization: { type: (n, typeOf) => typeOf(n.input[2]) },
};

const OPAQUE: OpInfo = { type: () => undefined };

/** What the table says about a node's op (ops of other domains than the default and com.microsoft are opaque). */
export function opInfo(node: NodeProto): OpInfo {
  if (node.domain && node.domain !== 'ai.onnx' && node.domain !== 'com.microsoft') return OPAQUE;
  return Object.prototype.hasOwnProperty.call(OPS, node.opType) ? OPS[node.opType] : OPAQUE;
}
