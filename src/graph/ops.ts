/**
 * What this tool knows about each op, in one table every stage reads:
 *   shape     how the output shapes follow from the inputs (shape-rules.ts; the shape pass and ranks);
 *   type      the output element type when it is not input 0's (the dtype of inserted ops);
 *   typed     which outputs have that type (default: output 0; every output of Split);
 *   logits    inputs through which attention logits flow toward the Softmax (detection, finding a patch);
 *   logitsIf  when the op carries logits only under a condition on its shapes (an Expand that keeps rows and keys);
 *   probs     carries attention probabilities on to the product with the values (detection);
 *   keepsAxes the output's axes are input 0's, element for element (tracing the head axis);
 *   position  a position index stays a position through it (the longest context a model can run);
 *   view      the same values, maybe in another shape or type (following token ids to their embedding);
 *   shapeOnly reads the shape of its input, never the values (dependency queries stop there);
 *   product   a product of two operands that can compute query·keyᵀ or probabilities·values;
 *   positionTable  an input whose rows are indexed by position inside the op (a position embedding, a rotary
 *             cos/sin cache): no position beyond its row count exists, so none of the model's lengths does either.
 *   inputsAt  the default-domain opset from which these int-list attributes became inputs 1, 2, … (the form of
 *             the nodes the tool inserts: formAt).
 * An op in the table without a type rule keeps input 0's element type. Ops not in the table are opaque: unknown
 * shape, unknown type (an embedding op reads int ids and writes floats: guessing input 0's type would make a
 * well-typed patch look mis-typed), no role.
 */
import { DataType, isDefaultDomain, NodeProto } from '../io/onnx';
import { GROUP_QUERY_ATTENTION } from './attention-ops/group-query-attention';
import type { ConstantReader } from './view';
import { attr, attrInt } from './node';
import { constantOf, Poly, show } from './poly';
import * as R from './shape-rules';

const GQA = GROUP_QUERY_ATTENTION.inputs;

export type TypeRule = 'bool' | 'int64' | ((node: NodeProto, typeOf: (name: string) => number | undefined, graph: ConstantReader) => number | undefined);

export interface OpInfo {
  shape?: R.ShapeRule;
  type?: TypeRule;
  typed?: number[] | 'all';
  logits?: number[];
  logitsIf?: (node: NodeProto, shapes: DimReader, producer: ReadonlyMap<string, NodeProto>) => boolean;
  probs?: boolean;
  keepsAxes?: boolean;
  position?: boolean;
  view?: boolean;
  shapeOnly?: boolean;
  product?: boolean;
  positionTable?: (node: NodeProto) => PositionTable | undefined;
  inputsAt?: { opset: number; attrs: string[] };
}

/**
 * An op's input of [positions, …] rows; the input that gives the op its position ids, if it takes one (absent, the
 * op counts positions itself); for a rotary cos cache, the input of its sine cache (the two are RoPE's cos and sin of
 * position × frequency, which `--rope` recomputes). The op's rule gives none where the op reads no table (the rotary
 * cache of GroupQueryAttention only with do_rotary; ONNX's RotaryEmbedding only with position ids).
 */
export interface PositionTable {
  input: number;
  what: string;
  positionIds?: number;
  sin?: number;
}

/** The table of positions the node reads, if any (OpInfo.positionTable). */
export function positionTableOf(node: NodeProto): PositionTable | undefined {
  return opInfo(node).positionTable?.(node);
}

/**
 * RotaryEmbedding: com.microsoft's takes (input, position_ids, cos_cache, sin_cache); ONNX's (opset 23) takes
 * (X, cos_cache, sin_cache, position_ids), and without position ids its caches are [batch, sequence, …] already gathered.
 */
function rotaryTable(node: NodeProto): PositionTable | undefined {
  const what = 'rotary cos cache';
  if (node.domain === 'com.microsoft') return { input: 2, sin: 3, positionIds: 1, what };
  return node.input[3] ? { input: 1, sin: 2, positionIds: 3, what } : undefined;
}

/** What a condition of the table reads of the shape pass (Shapes): symbolic dims, and the values of shape tensors. */
export interface DimReader { dim(name: string, axis: number): Poly | undefined; values(name: string): Poly[] | undefined }

/** Two dims known and equal (symbolically). */
export const sameDim = (a: Poly | undefined, b: Poly | undefined): boolean => a !== undefined && b !== undefined && show(a) === show(b);

/**
 * An Expand on the logits may broadcast over batch or heads (each row's keys unchanged); one that broadcast the
 * rows or keys axis would change what n counts, so it carries logits only where both axes are known to be kept:
 * the same symbolic dims in and out, a target of 1 on both, or a target that is the input's own Shape.
 */
function keepsRowsAndKeys(node: NodeProto, shapes: DimReader, producer: ReadonlyMap<string, NodeProto>): boolean {
  const [x, target] = node.input;
  const from = producer.get(target);
  if (from?.opType === 'Shape' && from.input[0] === x && from.attribute.length === 0) return true;
  const ones = shapes.values(target)?.slice(-2);
  if (ones?.length === 2 && ones.every((d) => constantOf(d) === 1)) return true;
  return [-1, -2].every((axis) => sameDim(shapes.dim(x, axis), shapes.dim(node.output[0], axis)));
}

const unary: OpInfo = { shape: R.unary };
const elementwise: OpInfo = { shape: R.elementwise };
const compare: OpInfo = { shape: R.elementwise, type: 'bool' };
function axesAt(opset: number): OpInfo['inputsAt'] {
  return { opset, attrs: ['axes'] };
}
function reduce(opset: number): OpInfo {
  return { shape: R.reduce, inputsAt: axesAt(opset) };
}

export const OPS: Readonly<Record<string, OpInfo>> = {
  // Carriers of logits, probabilities, heads and positions.
  Cast: { shape: R.unary, type: (n) => attrInt(n, 'to'), logits: [0], probs: true, keepsAxes: true, position: true, view: true },
  CastLike: { shape: R.unary, type: (n, typeOf) => typeOf(n.input[1]) },
  Identity: { shape: R.unary, logits: [0], probs: true, keepsAxes: true, position: true, view: true },
  Reshape: { shape: R.reshape, logits: [0], probs: true, position: true, view: true },
  Squeeze: { shape: R.squeeze, logits: [0], probs: true, position: true, view: true, inputsAt: axesAt(13) },
  Unsqueeze: { shape: R.unsqueeze, logits: [0], probs: true, position: true, view: true, inputsAt: axesAt(13) },
  Flatten: { shape: R.flatten, position: true, view: true },
  Dropout: { shape: R.unary, probs: true },
  // Static quantisation's pairs on activations (QDQ models): int8 (the zero point's type) and back to float (the
  // scale's); logits and probabilities pass on through them, as does their head axis.
  QuantizeLinear: { shape: R.unary, type: (n, typeOf) => attrInt(n, 'output_dtype') || (n.input[2] ? typeOf(n.input[2]) : DataType.UINT8), logits: [0], probs: true, keepsAxes: true },
  DequantizeLinear: { shape: R.unary, type: (n, typeOf) => attrInt(n, 'output_dtype') || typeOf(n.input[1]), logits: [0], probs: true, keepsAxes: true },
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
  Slice: { shape: R.slice, keepsAxes: true, position: true, inputsAt: { opset: 10, attrs: ['starts', 'ends', 'axes'] } },
  Gather: { shape: R.gather, position: true },
  // Probabilities broadcast over batch or heads are still each row's (torch's matmul lowering: Expand → Reshape → bmm).
  Expand: { shape: R.expand, logits: [0], logitsIf: keepsRowsAndKeys, probs: true, position: true },
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
  FusedMatMul: { shape: R.fusedMatmul, product: true },
  Einsum: { shape: R.einsum, product: true },
  // Shape and type only.
  Softmax: unary, LogSoftmax: unary, Relu: unary, Gelu: unary, FastGelu: unary, Sigmoid: unary, Erf: unary, Sqrt: unary,
  Exp: unary, Log: unary, Abs: unary, Reciprocal: unary, LayerNormalization: unary, SimplifiedLayerNormalization: unary,
  RotaryEmbedding: { shape: R.unary, positionTable: rotaryTable }, Softplus: unary,
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
  Split: { shape: R.split, typed: 'all', inputsAt: { opset: 13, attrs: ['split'] } },
  // Output 3 is the sum of the input and the skip, in the input's type (outputs 1 and 2, mean and 1/σ, are float).
  SkipLayerNormalization: { shape: R.skipNorm, typed: [0, 3] }, SkipSimplifiedLayerNormalization: { shape: R.skipNorm, typed: [0, 3] },
  // ReduceSum's axes became an input at opset 13, the other reductions' at 18.
  ReduceMean: reduce(18), ReduceSum: reduce(13), ReduceMax: reduce(18), ReduceMin: reduce(18), ReduceProd: reduce(18), ReduceL2: reduce(18),
  NonZero: { shape: R.nonZero, type: 'int64' },
  ArgMax: { type: 'int64' }, ArgMin: { type: 'int64' },
  // Type: input 0's (the query of the attention operators, the activations of the others); com.microsoft Attention's and MultiHeadAttention's shapes too.
  Attention: { shape: R.msAttention }, MultiHeadAttention: { shape: R.msMultiHeadAttention }, DecoderMaskedMultiHeadAttention: {}, PackedAttention: {},
  GroupQueryAttention: {
    positionTable: (n) => (attrInt(n, 'do_rotary') === 1 ? { input: GQA.cos_cache, sin: GQA.sin_cache, what: 'rotary cos cache', positionIds: GQA.position_ids } : undefined),
  },
  PackedMultiHeadAttention: {}, BiasGelu: {}, QuickGelu: {}, BiasAdd: {}, Conv: {}, MaxPool: {}, AveragePool: {},
  GlobalAveragePool: {}, RemovePadding: {}, RestorePadding: {}, Compress: {},
  // Ids in, embeddings out: the type of the word embedding table (input 2).
  EmbedLayerNormalization: { type: (n, typeOf) => typeOf(n.input[2]), positionTable: () => ({ input: 3, what: 'position embedding', positionIds: 8 }) },
};

const OPAQUE: OpInfo = { type: () => undefined };

/** What the table says about a node's op (ops of other domains than the default and com.microsoft are opaque). */
export function opInfo(node: NodeProto): OpInfo {
  if (!isDefaultDomain(node.domain) && node.domain !== 'com.microsoft') return OPAQUE;
  return Object.prototype.hasOwnProperty.call(OPS, node.opType) ? OPS[node.opType] : OPAQUE;
}

/** Attribute values of a node being built: an int list may become an input (formAt). */
type Attrs<V> = Record<string, V | number[]>;

/**
 * A default-domain node the tool inserts, in the form `opset` has: its int-list attributes given as attributes
 * (the oldest form), moved to inputs from the opset that made them inputs, each through `constant` (an int64
 * tensor's name). Several attributes become consecutive inputs (Slice: starts, ends, axes); an absent one is an
 * empty input name unless it is the last. A node built with those inputs already is an error below that opset.
 */
export function formAt<V>(opType: string, opset: number, inputs: string[], attrs: Attrs<V>,
  constant: (attr: string, values: number[]) => string): { inputs: string[]; attrs: Attrs<V> } {
  const moved = Object.prototype.hasOwnProperty.call(OPS, opType) ? OPS[opType].inputsAt : undefined;
  if (!moved) return { inputs, attrs };
  if (opset < moved.opset) {
    if (inputs.length > 1) throw new Error(`internal: ${opType} built with ${inputs.length} inputs at opset ${opset} (it takes ${moved.attrs.join(', ')} as attributes before ${moved.opset})`);
    return { inputs, attrs };
  }
  const rest: Attrs<V> = { ...attrs };
  const extra = moved.attrs.map((a) => {
    const v = rest[a];
    delete rest[a];
    return v === undefined ? '' : constant(a, v as number[]);
  });
  while (extra.length && extra[extra.length - 1] === '') extra.pop();
  return { inputs: [...inputs, ...extra], attrs: rest };
}
