/**
 * How an op's output shapes follow from its inputs, as symbolic dims (see poly.ts), including the values of the
 * small integer tensors exporters build shapes with (Shape → Gather → Unsqueeze → Concat → Reshape). A rule
 * returns what it knows: an undefined shape (rank unknown) or undefined dims (rank known, size not); the shape
 * pass gives every unknown dim a fresh symbol. The table in ops.ts says which rule each op uses.
 */
import { NodeProto } from '../io/onnx';
import type { ConstantReader } from './view';
import { attr, attrInt, attrInts, attrString } from './node';
import { readTensor } from './tensor';
import { add, broadcast, constantOf, div, mul, num, Poly, product, sliceLength } from './poly';

/** What is known of one tensor: its shape, and for small integer tensors (rank ≤ 1) their values. */
export interface Sym {
  shape?: Poly[];
  value?: Poly[];
}

/** A rule's answer for one output: dims may be unknown where the rank is known. */
export interface OutSym {
  shape?: (Poly | undefined)[];
  value?: Poly[];
}

export type ShapeRule = (node: NodeProto, ins: Sym[], graph: ConstantReader) => OutSym[];

const unknownDims = (rank: number | undefined): (Poly | undefined)[] | undefined =>
  rank === undefined || !Number.isInteger(rank) || rank < 0 || rank > 64 ? undefined : Array.from({ length: rank }, () => undefined);

/** A constant integer list read from an attribute or from a constant input. */
function listOf(node: NodeProto, graph: ConstantReader, attr: string, input: number): number[] | undefined {
  return attrInts(node, attr) ?? (node.input[input] ? graph.constValue(node.input[input])?.values : undefined);
}

const normAxis = (a: number, rank: number): number => (a < 0 ? a + rank : a);

/** Same shape as input 0; Cast and Identity keep its values too. */
export const unary: ShapeRule = (node, ins) => [{
  shape: ins[0]?.shape, value: node.opType === 'Cast' || node.opType === 'Identity' ? ins[0]?.value : undefined,
}];

/** SkipLayerNormalization: output 0 and the sum of input and skip (output 3) have input 0's shape. */
export const skipNorm: ShapeRule = (_node, ins) => [{ shape: ins[0]?.shape }, {}, {}, { shape: ins[0]?.shape }];

/** Same rank as input 0, sizes not known (Pad). */
export const sameRank: ShapeRule = (_node, ins) => [{ shape: unknownDims(ins[0]?.shape?.length) }];

/** Numpy broadcasting of every input; Add/Sub/Mul/Div also compute small integer values. */
export const elementwise: ShapeRule = (node, ins) => {
  const shapes = ins.map((i) => i.shape);
  const shape = shapes.length > 0 && shapes.every(Boolean) ? broadcast(shapes as Poly[][]) : undefined;
  const [a, b] = [ins[0]?.value, ins[1]?.value];
  const f = { Add: (x: Poly, y: Poly) => add(x, y), Sub: (x: Poly, y: Poly) => add(x, y, -1), Mul: mul, Div: intDiv }[node.opType as 'Add'];
  let value: Poly[] | undefined;
  if (f && a && b && (a.length === b.length || a.length === 1 || b.length === 1)) {
    const at = (v: Poly[], i: number): Poly => v[v.length === 1 ? 0 : i];
    // A single value broadcasts to the other's length, an empty list's too.
    const vals = Array.from({ length: a.length === 1 ? b.length : a.length }, (_, i) => f(at(a, i), at(b, i)));
    if (vals.every(Boolean)) value = vals as Poly[];
  }
  return [{ shape, value }];
};

/**
 * Equal of shape values: two constants compare; a dim is never negative, so it differs from a negative constant
 * (torch's `expand(n, -1, -1)` writes Where(Equal(shape, −1), 1, shape)).
 */
export const equal: ShapeRule = (node, ins, graph) => {
  const [out] = elementwise(node, ins, graph);
  const [a, b] = [ins[0]?.value, ins[1]?.value];
  if (!a?.length || !b?.length || (a.length !== b.length && a.length !== 1 && b.length !== 1)) return [out];
  const same = (x: Poly, y: Poly): Poly | undefined => {
    const [cx, cy] = [constantOf(x), constantOf(y)];
    if (cx !== undefined && cy !== undefined) return num(cx === cy ? 1 : 0);
    if ((cx !== undefined && cx < 0 && nonNegative(y)) || (cy !== undefined && cy < 0 && nonNegative(x))) return num(0);
    return undefined;
  };
  const vals = Array.from({ length: Math.max(a.length, b.length) }, (_, i) => same(a[a.length === 1 ? 0 : i], b[b.length === 1 ? 0 : i]));
  return [{ ...out, value: vals.every(Boolean) ? vals as Poly[] : undefined }];
};

/** A polynomial with no negative coefficient: non-negative for any dims. */
const nonNegative = (p: Poly): boolean => [...p.values()].every((c) => c > 0);

/** Where over shape values whose condition is known: each element picked from its branch. */
export const where: ShapeRule = (node, ins, graph) => {
  const [out] = elementwise(node, ins, graph);
  const [c, x, y] = [ins[0]?.value, ins[1]?.value, ins[2]?.value];
  const length = Math.max(c?.length ?? 0, x?.length ?? 0, y?.length ?? 0);
  const fits = (v: Poly[] | undefined): v is Poly[] => v !== undefined && (v.length === length || v.length === 1);
  if (!fits(c) || !fits(x) || !fits(y) || c.some((v) => constantOf(v) === undefined)) return [out];
  const at = (v: Poly[], i: number): Poly => v[v.length === 1 ? 0 : i];
  return [{ ...out, value: Array.from({ length }, (_, i) => (constantOf(at(c, i)) ? at(x, i) : at(y, i))) }];
};

/** Div of shape values (integers): truncating for constants (torch's chunk computes (E + 2) / 3), exact otherwise. */
function intDiv(x: Poly, y: Poly): Poly | undefined {
  const [a, b] = [constantOf(x), constantOf(y)];
  return a !== undefined && b !== undefined && b !== 0 ? num(Math.trunc(a / b)) : div(x, y);
}

export const shapeOf: ShapeRule = (node, ins) => {
  const s = ins[0]?.shape;
  if (!s) return [{ shape: [undefined] }];
  const value = s.slice(attrInt(node, 'start') ?? 0, attrInt(node, 'end'));
  return [{ shape: [num(value.length)], value }];
};

export const size: ShapeRule = (_node, ins) => [{ shape: [], value: ins[0]?.shape ? [product(ins[0].shape)] : undefined }];

export const gather: ShapeRule = (node, [data, idx], graph) => {
  const s = data?.shape, is = idx?.shape;
  const axis = normAxis(attrInt(node, 'axis') ?? 0, s?.length ?? 0);
  const indices = graph.constValue(node.input[1]);
  let value: Poly[] | undefined;
  if (data?.value && indices && axis === 0) {
    const picked = indices.values.map((i) => data.value![i < 0 ? data.value!.length + i : i]);
    // An index past the values (a shape declared shorter than it is) leaves them unknown.
    if (picked.every(Boolean)) value = picked;
  }
  return [{ shape: s && is ? [...s.slice(0, axis), ...is, ...s.slice(axis + 1)] : undefined, value }];
};

export const unsqueeze: ShapeRule = (node, ins, graph) => {
  const s = ins[0]?.shape;
  const axes = listOf(node, graph, 'axes', 1);
  if (!s || !axes) return [{ value: ins[0]?.value }];
  const rank = s.length + axes.length;
  const norm = axes.map((a) => normAxis(a, rank));
  const shape: Poly[] = [];
  for (let i = 0, j = 0; i < rank; i++) shape.push(norm.includes(i) ? num(1) : s[j++]);
  return [{ shape, value: ins[0].value }];
};

/** Without axes Squeeze drops the dims that are 1 at run time: known only when every dim is a constant. */
export const squeeze: ShapeRule = (node, ins, graph) => {
  const s = ins[0]?.shape;
  const axes = listOf(node, graph, 'axes', 1);
  if (!s || (!axes && s.some((d) => constantOf(d) === undefined))) return [{ value: ins[0]?.value }];
  const drop = (axes ?? s.flatMap((d, i) => (constantOf(d) === 1 ? [i] : []))).map((a) => normAxis(a, s.length));
  return [{ shape: s.filter((_, i) => !drop.includes(i)), value: ins[0].value }];
};

export const concat: ShapeRule = (node, ins) => {
  const value = ins.every((i) => i.value) ? ins.flatMap((i) => i.value!) : undefined;
  const shapes = ins.map((i) => i.shape);
  if (!shapes.every(Boolean) || shapes.length === 0) return [{ shape: unknownDims(shapes.find(Boolean)?.length), value }];
  const first = shapes[0]!;
  const a = normAxis(attrInt(node, 'axis') ?? 0, first.length);
  return [{ shape: first.map((d, i) => (i === a ? shapes.reduce((acc, s) => add(acc, s![i]), num(0)) : d)), value }];
};

/** MatMul with numpy semantics, 1-D operands included. */
export const matmul: ShapeRule = (_node, ins) => {
  let [a, b] = [ins[0]?.shape, ins[1]?.shape];
  if (!a || !b || a.length === 0 || b.length === 0) return [{}];
  const vecA = a.length === 1, vecB = b.length === 1;
  if (vecA) a = [num(1), a[0]];
  if (vecB) b = [b[0], num(1)];
  const out = [...broadcast([a.slice(0, -2), b.slice(0, -2)]), a[a.length - 2], b[b.length - 1]];
  if (vecB) out.splice(out.length - 1, 1);
  if (vecA) out.splice(out.length - (vecB ? 1 : 2), 1);
  return [{ shape: out }];
};

/**
 * com.microsoft FusedMatMul: MatMul of its operands with the last two axes of each swapped where transA / transB say
 * (FusedMatMul(q, k, transB=1) is q·kᵀ: its last axis is k's keys, not k's head dim). transBatchA / transBatchB move
 * batch axes too: unknown.
 */
export const fusedMatmul: ShapeRule = (node, ins, graph) => {
  if (attrInt(node, 'transBatchA') || attrInt(node, 'transBatchB')) return [{}];
  const swapped = (i: number, attr: string): Sym => {
    const s = ins[i]?.shape;
    if (!attrInt(node, attr) || !s) return ins[i];
    return { ...ins[i], shape: s.length >= 2 ? [...s.slice(0, -2), s[s.length - 1], s[s.length - 2]] : undefined };
  };
  return matmul(node, [swapped(0, 'transA'), swapped(1, 'transB')], graph);
};

export const gemm: ShapeRule = (node, ins) => {
  const [a, b] = [ins[0]?.shape, ins[1]?.shape];
  return [{ shape: [a?.[attrInt(node, 'transA') ? 1 : 0], b?.[attrInt(node, 'transB') ? 0 : 1]] }];
};

export const transpose: ShapeRule = (node, ins) => {
  const s = ins[0]?.shape;
  const perm = attrInts(node, 'perm') ?? s?.map((_, i) => s.length - 1 - i);
  return [{ shape: s && perm ? perm.map((p) => s[p]) : unknownDims(perm?.length) }];
};

export const reshape: ShapeRule = (node, ins) => {
  const input = ins[0]?.shape, target = ins[1]?.value;
  if (!target) return [{ shape: unknownDims(lengthOf(ins[1])) }];
  // A shape tensor flattened to 1-D (torch writes Reshape(Concat(...), [-1])) keeps its values.
  const value = target.length === 1 && (input?.length ?? 2) <= 1 ? ins[0]?.value : undefined;
  if (value) return [{ shape: [num(value.length)], value }];
  const allowZero = attrInt(node, 'allowzero') ?? 0;
  const dims = target.map((t, i) => (constantOf(t) === 0 && !allowZero ? input?.[i] : t));
  const free = target.findIndex((t) => constantOf(t) === -1);
  if (free < 0) return [{ shape: dims }];
  const known = dims.filter((_, i) => i !== free);
  const inferred = input && known.every(Boolean) ? div(product(input), product(known as Poly[])) : undefined;
  return [{ shape: dims.map((d, i) => (i === free ? inferred : d)) }];
};

/** Length of a 1-D tensor (a shape tensor), when known. */
function lengthOf(s: Sym | undefined): number | undefined {
  return s?.shape?.length === 1 ? constantOf(s.shape[0]) : undefined;
}

export const expand: ShapeRule = (_node, ins) => {
  const s = ins[0]?.shape, target = ins[1]?.value;
  if (s && target) return [{ shape: broadcast([s, target]) }];
  const len = lengthOf(ins[1]);
  return [{ shape: s && len !== undefined ? unknownDims(Math.max(len, s.length)) : undefined }];
};

/** Also the values of a small integer fill (torch's expand builds a tensor of ones of the shape's length). */
export const constantOfShape: ShapeRule = (node, ins) => {
  const shape = ins[0]?.value;
  const count = shape?.length === 1 ? constantOf(shape[0]) : undefined;
  const t = attr(node, 'value')?.t;
  const fill = t ? readTensor(t)?.values : [0];
  const small = count !== undefined && count <= 16 && fill?.length === 1 && Number.isInteger(fill[0]);
  const value = small ? Array.from({ length: count }, () => num(fill[0])) : undefined;
  return [{ shape: shape ?? unknownDims(lengthOf(ins[0])), value }];
};

export const range: ShapeRule = (_node, ins) => {
  const [start, limit, delta] = ins.map((i) => i.value?.[0]);
  return [{ shape: [start && limit && delta && constantOf(delta) === 1 ? add(limit, start, -1) : undefined] }];
};

export const slice: ShapeRule = (node, ins, graph) => {
  const s = ins[0]?.shape;
  const starts = ins[1]?.value, ends = ins[2]?.value;
  const axes = node.input[3] ? graph.constValue(node.input[3])?.values : undefined;
  const steps = node.input[4] ? graph.constValue(node.input[4])?.values : undefined;
  if (!starts || !ends || (steps && steps.some((x) => x !== 1))) return [{ shape: unknownDims(s?.length) }];
  if (ins[0].value && s?.length === 1 && (!axes || axes[0] === 0) && starts.length && ends.length) {
    const [st, en] = [constantOf(starts[0]), constantOf(ends[0])];
    if (st !== undefined && en !== undefined) return [{ shape: [num(ins[0].value.slice(st, en).length)], value: ins[0].value.slice(st, en) }];
  }
  if (!s) return [{}];
  const shape: (Poly | undefined)[] = [...s];
  for (const [k, start] of starts.entries()) {
    const axis = axes ? normAxis(axes[k], s.length) : k;
    // A corrupt model may name any axis: only real ones are sliced.
    if (!Number.isInteger(axis) || axis < 0 || axis >= s.length || !ends[k]) return [{ shape: unknownDims(s.length) }];
    shape[axis] = sliceLength(s[axis], start, ends[k]);
  }
  return [{ shape }];
};

export const reduce: ShapeRule = (node, ins, graph) => {
  const s = ins[0]?.shape;
  if (!s) return [{}];
  const axes = listOf(node, graph, 'axes', 1);
  const keep = (attrInt(node, 'keepdims') ?? 1) === 1;
  if (!axes && node.input[1] && keep) return [{ shape: unknownDims(s.length) }];
  const norm = (axes ?? s.map((_, i) => i)).map((a) => normAxis(a, s.length));
  if (keep) return [{ shape: s.map((d, i) => (norm.includes(i) ? num(1) : d)) }];
  return [{ shape: s.filter((_, i) => !norm.includes(i)) }];
};

export const split: ShapeRule = (node, ins, graph) => {
  const s = ins[0]?.shape;
  if (!s) return [];
  const a = normAxis(attrInt(node, 'axis') ?? 0, s.length);
  if (a < 0 || a >= s.length) return [];
  const sizes = listOf(node, graph, 'split', 1);
  const each = sizes ? undefined : div(s[a], num(node.output.length));
  return node.output.map((_, k) => ({ shape: s.map((d, i) => (i === a ? (sizes ? num(sizes[k]) : each) : d)) }));
};

export const tile: ShapeRule = (_node, ins) => {
  const s = ins[0]?.shape, r = ins[1]?.value;
  return [{ shape: s && r && r.length === s.length ? s.map((d, i) => mul(d, r[i])) : unknownDims(s?.length) }];
};

export const flatten: ShapeRule = (node, ins) => {
  const s = ins[0]?.shape;
  if (!s) return [{ shape: [undefined, undefined] }];
  const axis = normAxis(attrInt(node, 'axis') ?? 1, s.length);
  return [{ shape: [product(s.slice(0, axis)), product(s.slice(axis))] }];
};

export const nonZero: ShapeRule = (_node, ins) => [{ shape: [ins[0]?.shape ? num(ins[0].shape.length) : undefined, undefined] }];

/** Einsum without ellipsis: each output letter takes its size from an operand holding it. */
export const einsum: ShapeRule = (node, ins) => {
  const eq = attrString(node, 'equation');
  const [lhs, rhs] = eq ? eq.replace(/\s+/g, '').split('->') : [];
  if (rhs === undefined || /\./.test(lhs + rhs)) return [{}];
  const terms = lhs.split(',');
  const dimOf = (letter: string): Poly | undefined => {
    for (const [k, term] of terms.entries()) {
      const axis = term.indexOf(letter);
      if (axis >= 0 && ins[k]?.shape) return ins[k].shape![axis];
    }
    return undefined;
  };
  return [{ shape: [...rhs].map(dimOf) }];
};

/** GatherElements: the shape of the indices. */
export const likeInput1: ShapeRule = (_node, ins) => [{ shape: ins[1]?.shape }];

/**
 * com.microsoft Attention: output [B, S, V] (V the last of qkv_hidden_sizes, else a third of the weights' width);
 * present [2, B, N, P + S, H] from a past [2, B, N, P, H] (not a shared buffer, whose present is the buffer's
 * shape). Known, the layers of a decoder share the sequence length, and the patch one mask and n for all of them.
 */
export const msAttention: ShapeRule = (node, ins) => {
  const x = ins[0]?.shape, w = ins[1]?.shape, past = ins[4]?.shape;
  const sizes = attrInts(node, 'qkv_hidden_sizes');
  const width = sizes?.length === 3 ? num(sizes[2]) : w?.length === 2 && w[1] ? div(w[1], num(3)) : undefined;
  const S = x?.length === 3 ? x[1] : undefined;
  const total = past?.length === 5 && past[3] && S && !node.input[6] ? add(past[3], S) : undefined;
  const present = past?.length === 5 ? [past[0], past[1], past[2], total, past[4]] : undefined;
  return [{ shape: x?.length === 3 ? [x[0], x[1], width] : undefined }, { shape: present }];
};

/** com.microsoft MultiHeadAttention with a query [B, S, D]: output [B, S, V], V from value [B, L, V] or [B, N, L, H]. */
export const msMultiHeadAttention: ShapeRule = (_node, ins) => {
  const q = ins[0]?.shape, v = ins[2]?.shape;
  if (q?.length !== 3) return [{}];
  const width = v?.length === 3 ? v[2] : v?.length === 4 && v[1] && v[3] ? mul(v[1], v[3]) : undefined;
  return [{ shape: [q[0], q[1], width] }];
};
