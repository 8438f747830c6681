/**
 * Symbolic shapes: each dim as a polynomial over the graph's dynamic dims (`sequence`, `past_sequence+sequence`,
 * ...), propagated through the ops exporters put on attention paths, including the small shape tensors
 * (Shape → Gather → Unsqueeze → Concat → Reshape) they use to reshape heads. Two sites whose query length and key
 * length have the same expression see the same n at run time, so they can share one ln(n) computation.
 * Where a rule does not apply, a dim gets a fresh symbol named after its tensor and axis: still exact, never shared
 * by accident.
 */
import { NodeProto, toNumber } from '../io/onnx';
import { attrInt, attrInts, Graph } from './graph';
import { inferRanks } from './ranks';

/** Monomial key ('' for the constant term) → integer coefficient. */
export type Poly = ReadonlyMap<string, number>;

const mono = (symbols: string[]): string => [...symbols].sort().join('*');
const split = (key: string): string[] => (key ? key.split('*') : []);

export const num = (n: number): Poly => new Map(n === 0 ? [] : [['', n]]);
export const sym = (name: string): Poly => new Map([[name, 1]]);

export function add(a: Poly, b: Poly, sign = 1): Poly {
  if (a.size + b.size > 4 * MAX_TERMS) throw new RangeError('symbolic dim too large');
  const out = new Map(a);
  for (const [k, c] of b) {
    const v = (out.get(k) ?? 0) + sign * c;
    if (v === 0) out.delete(k);
    else out.set(k, v);
  }
  return out;
}

/** Past these sizes a dim is left unknown: shape arithmetic in real graphs is small, and a corrupt graph must not blow up. */
const MAX_TERMS = 32;
const MAX_DEGREE = 12;

export function mul(a: Poly, b: Poly): Poly {
  if (a.size * b.size > MAX_TERMS) throw new RangeError('symbolic dim too large');
  let out: Poly = new Map();
  for (const [ka, ca] of a) {
    for (const [kb, cb] of b) {
      const symbols = [...split(ka), ...split(kb)];
      if (symbols.length > MAX_DEGREE || !Number.isSafeInteger(ca * cb)) throw new RangeError('symbolic dim too large');
      out = add(out, new Map([[mono(symbols), ca * cb]]));
    }
  }
  return out;
}

/** a / b when b is one monomial that divides every term of a exactly; undefined otherwise. */
export function div(a: Poly, b: Poly): Poly | undefined {
  if (b.size !== 1) return undefined;
  const [[kb, cb]] = [...b];
  const out = new Map<string, number>();
  for (const [ka, ca] of a) {
    if (ca % cb !== 0) return undefined;
    const rest = split(ka);
    for (const s of split(kb)) {
      const i = rest.indexOf(s);
      if (i < 0) return undefined;
      rest.splice(i, 1);
    }
    out.set(mono(rest), ca / cb);
  }
  return out;
}

export const constantOf = (p: Poly): number | undefined => (p.size === 0 ? 0 : p.size === 1 && p.has('') ? p.get('') : undefined);

export function show(p: Poly): string {
  if (p.size === 0) return '0';
  return [...p].sort(([a], [b]) => a.localeCompare(b)).map(([k, c]) => (k === '' ? `${c}` : c === 1 ? k : `${c}*${k}`)).join('+');
}

const product = (dims: Poly[]): Poly => dims.reduce((acc, d) => mul(acc, d), num(1));

interface Sym {
  shape?: Poly[];
  /** Values of a small integer tensor (rank 0 or 1), as used to build shapes. */
  value?: Poly[];
}

const passThrough = new Set([
  'Cast', 'Identity', 'Softmax', 'LogSoftmax', 'Dropout', 'Relu', 'Gelu', 'FastGelu', 'Tanh', 'Sigmoid', 'Erf', 'Sqrt',
  'Exp', 'Log', 'Neg', 'Abs', 'Reciprocal', 'LayerNormalization', 'SimplifiedLayerNormalization', 'IsNaN', 'IsInf',
  'Not', 'Softplus', 'Trilu', 'CumSum', 'Clip', 'Round', 'Floor', 'Ceil', 'Sin', 'Cos', 'CastLike',
  'SkipLayerNormalization', 'SkipSimplifiedLayerNormalization', 'RotaryEmbedding',
]);
const elementwise = new Set(['Add', 'Sub', 'Mul', 'Div', 'Pow', 'Where', 'Equal', 'Less', 'Greater', 'LessOrEqual',
  'GreaterOrEqual', 'And', 'Or', 'Max', 'Min', 'Mod']);

export class SymbolicShapes {
  private readonly syms = new Map<string, Sym>();
  private readonly ranks: Map<string, number>;

  constructor(private readonly graph: Graph) {
    this.ranks = inferRanks(graph);
    for (const v of graph.proto.input) {
      const dims = v.type?.tensorType?.shape?.dim;
      if (dims) {
        this.syms.set(v.name, {
          shape: dims.map((d, i) => (d.dimParam ? sym(d.dimParam) : toNumber(d.dimValue) > 0 ? num(toNumber(d.dimValue)) : sym(`${v.name}:${i}`))),
        });
      }
    }
    for (const node of graph.nodes) this.visit(node);
  }

  shape(name: string): Poly[] | undefined {
    return this.get(name).shape;
  }

  /** Symbolic size of one axis (negative axes count from the end). */
  dim(name: string, axis: number): Poly | undefined {
    const s = this.shape(name);
    if (!s) return undefined;
    return s[axis < 0 ? s.length + axis : axis];
  }

  private get(name: string): Sym {
    if (!name) return {};
    const known = this.syms.get(name);
    if (known) return known;
    const init = this.graph.initializers.get(name);
    const c = init && init.dims.length > 1 ? undefined : this.graph.constValue(name);
    const dims = init ? init.dims.map(toNumber) : c?.dims;
    if (!dims) return {};
    const entry: Sym = { shape: dims.map(num) };
    if (c && c.dims.length <= 1 && c.values.length <= 16) entry.value = c.values.map(num);
    this.syms.set(name, entry);
    return entry;
  }

  private visit(node: NodeProto): void {
    if (node.opType === 'Constant') return; // read lazily through Graph.constValue
    let out: Sym[];
    try {
      out = this.rule(node);
    } catch {
      out = [];
    }
    node.output.forEach((o, i) => {
      if (!o) return;
      const s = out[i] ?? {};
      // Unknown dims get a fresh symbol tied to this tensor, so they never equal anything else by accident.
      const rank = s.shape?.length ?? this.ranks.get(o);
      this.syms.set(o, { shape: s.shape ?? (rank !== undefined ? Array.from({ length: rank }, (_, a) => sym(`${o}:${a}`)) : undefined), value: s.value });
    });
  }

  private rule(node: NodeProto): Sym[] {
    const ins = node.input.map((i) => this.get(i));
    const op = node.opType;
    if (op === 'Constant') return [];
    if (passThrough.has(op)) return [{ shape: ins[0].shape, value: op === 'Cast' || op === 'Identity' ? ins[0].value : undefined }];
    if (elementwise.has(op)) return [this.elementwise(node, ins)];
    switch (op) {
      case 'Shape': {
        const s = ins[0].shape;
        if (!s) return [];
        const start = attrInt(node, 'start') ?? 0;
        const end = attrInt(node, 'end');
        const value = s.slice(start, end);
        return [{ shape: [num(value.length)], value }];
      }
      case 'Gather': return [this.gather(node, ins)];
      case 'Unsqueeze': case 'Squeeze': return [this.squeeze(node, ins)];
      case 'Concat': return [this.concat(node, ins)];
      case 'MatMul': case 'FusedMatMul': return [this.matmul(ins)];
      case 'Gemm': {
        const [a, b] = [ins[0].shape, ins[1].shape];
        if (!a || !b) return [];
        return [{ shape: [a[attrInt(node, 'transA') ? 1 : 0], b[attrInt(node, 'transB') ? 0 : 1]] }];
      }
      case 'Transpose': {
        const s = ins[0].shape;
        const perm = attrInts(node, 'perm') ?? s?.map((_, i) => s.length - 1 - i);
        return [{ shape: s && perm ? perm.map((p) => s[p]) : undefined }];
      }
      case 'Reshape': return [{ shape: this.reshape(ins[0].shape, ins[1].value, attrInt(node, 'allowzero') ?? 0) }];
      case 'Expand': return [{ shape: ins[1].value && ins[0].shape ? broadcast([ins[0].shape, ins[1].value]) : undefined }];
      case 'ConstantOfShape': return [{ shape: ins[0].value }];
      case 'Range': {
        const [start, limit, delta] = ins.map((i) => i.value?.[0]);
        return [{ shape: start && limit && delta && constantOf(delta) === 1 ? [add(limit, start, -1)] : undefined }];
      }
      case 'Slice': return [this.slice(node, ins)];
      case 'ReduceMean': case 'ReduceSum': case 'ReduceMax': case 'ReduceMin': case 'ReduceProd': case 'ReduceL2':
        return [this.reduce(node, ins)];
      case 'Split': return this.splitOp(node, ins);
      case 'Tile': {
        const s = ins[0].shape, r = ins[1].value;
        return [{ shape: s && r && r.length === s.length ? s.map((d, i) => mul(d, r[i])) : undefined }];
      }
      default: return [];
    }
  }

  private elementwise(node: NodeProto, ins: Sym[]): Sym {
    const shapes = (node.opType === 'Where' ? ins : ins.slice(0, 2)).map((i) => i.shape);
    const shape = shapes.every(Boolean) ? broadcast(shapes as Poly[][]) : undefined;
    const [a, b] = [ins[0].value, ins[1]?.value];
    let value: Poly[] | undefined;
    if (a && b && (a.length === b.length || a.length === 1 || b.length === 1)) {
      const n = Math.max(a.length, b.length);
      const at = (v: Poly[], i: number): Poly => v[v.length === 1 ? 0 : i];
      const f = { Add: (x: Poly, y: Poly) => add(x, y), Sub: (x: Poly, y: Poly) => add(x, y, -1), Mul: mul, Div: div }[node.opType as 'Add'];
      if (f) {
        const vals = Array.from({ length: n }, (_, i) => f(at(a, i), at(b, i)));
        if (vals.every(Boolean)) value = vals as Poly[];
      }
    }
    return { shape, value };
  }

  private gather(node: NodeProto, ins: Sym[]): Sym {
    const [data, idx] = ins;
    const axis = attrInt(node, 'axis') ?? 0;
    const indices = this.graph.constValue(node.input[1]);
    let value: Poly[] | undefined;
    if (data.value && indices && axis === 0) value = indices.values.map((i) => data.value![i < 0 ? data.value!.length + i : i]);
    const s = data.shape, is = idx.shape;
    const shape = s && is ? [...s.slice(0, axis), ...is, ...s.slice(axis + 1)] : undefined;
    return { shape, value };
  }

  private squeeze(node: NodeProto, ins: Sym[]): Sym {
    const s = ins[0].shape;
    const axes = attrInts(node, 'axes') ?? (node.input[1] ? this.graph.constValue(node.input[1])?.values : undefined);
    if (!s) return { value: ins[0].value };
    if (node.opType === 'Squeeze') {
      const drop = (axes ?? s.flatMap((d, i) => (constantOf(d) === 1 ? [i] : []))).map((a) => (a < 0 ? a + s.length : a));
      return { shape: s.filter((_, i) => !drop.includes(i)), value: ins[0].value };
    }
    if (!axes) return { value: ins[0].value };
    const rank = s.length + axes.length;
    const norm = axes.map((a) => (a < 0 ? a + rank : a));
    const shape: Poly[] = [];
    let j = 0;
    for (let i = 0; i < rank; i++) shape.push(norm.includes(i) ? num(1) : s[j++]);
    return { shape, value: ins[0].value };
  }

  private concat(node: NodeProto, ins: Sym[]): Sym {
    const axis = attrInt(node, 'axis') ?? 0;
    const value = ins.every((i) => i.value) ? ins.flatMap((i) => i.value!) : undefined;
    const shapes = ins.map((i) => i.shape);
    if (!shapes.every(Boolean)) return { value };
    const first = shapes[0]!;
    const a = axis < 0 ? axis + first.length : axis;
    const shape = first.map((d, i) => (i === a ? shapes.reduce((acc, s) => add(acc, s![i]), num(0)) : d));
    return { shape, value };
  }

  private matmul(ins: Sym[]): Sym {
    const [a, b] = [ins[0].shape, ins[1].shape];
    if (!a || !b || a.length < 2 || b.length < 2) return {};
    const batch = broadcast([a.slice(0, -2), b.slice(0, -2)]);
    return { shape: [...batch, a[a.length - 2], b[b.length - 1]] };
  }

  private reshape(input: Poly[] | undefined, target: Poly[] | undefined, allowZero: number): Poly[] | undefined {
    if (!target) return undefined;
    const dims = target.map((t, i) => (constantOf(t) === 0 && !allowZero ? input?.[i] : t));
    const free = target.findIndex((t) => constantOf(t) === -1);
    if (dims.some((d, i) => i !== free && !d)) return undefined;
    if (free < 0) return dims as Poly[];
    if (!input) return undefined;
    const inferred = div(product(input), product(dims.filter((_, i) => i !== free) as Poly[]));
    return inferred ? dims.map((d, i) => (i === free ? inferred : d!)) : undefined;
  }

  private slice(node: NodeProto, ins: Sym[]): Sym {
    const s = ins[0].shape;
    const starts = ins[1]?.value, ends = ins[2]?.value;
    const axes = node.input[3] ? this.graph.constValue(node.input[3])?.values : undefined;
    const steps = node.input[4] ? this.graph.constValue(node.input[4])?.values : undefined;
    if (!starts || !ends || (steps && steps.some((x) => x !== 1))) return {};
    if (ins[0].value && s?.length === 1 && (!axes || axes[0] === 0)) {
      const [st, en] = [constantOf(starts[0]), constantOf(ends[0])];
      if (st !== undefined && en !== undefined) return { shape: [num(ins[0].value.slice(st, en).length)], value: ins[0].value.slice(st, en) };
    }
    if (!s) return {};
    const shape = [...s];
    for (const [k, start] of starts.entries()) {
      const axis = axes ? (axes[k] < 0 ? axes[k] + s.length : axes[k]) : k;
      // A corrupt model may name any axis: only real ones are sliced.
      if (!Number.isInteger(axis) || axis < 0 || axis >= s.length || !ends[k]) return {};
      shape[axis] = sliceLength(s[axis], start, ends[k]);
    }
    return { shape };
  }

  private reduce(node: NodeProto, ins: Sym[]): Sym {
    const s = ins[0].shape;
    const axes = attrInts(node, 'axes') ?? (node.input[1] ? this.graph.constValue(node.input[1])?.values : undefined);
    if (!s) return {};
    const norm = (axes ?? s.map((_, i) => i)).map((a) => (a < 0 ? a + s.length : a));
    if ((attrInt(node, 'keepdims') ?? 1) === 1) return { shape: s.map((d, i) => (norm.includes(i) ? num(1) : d)) };
    return { shape: s.filter((_, i) => !norm.includes(i)) };
  }

  private splitOp(node: NodeProto, ins: Sym[]): Sym[] {
    const s = ins[0].shape;
    if (!s) return [];
    const axis = attrInt(node, 'axis') ?? 0;
    const a = axis < 0 ? axis + s.length : axis;
    const sizes = attrInts(node, 'split') ?? (node.input[1] ? this.graph.constValue(node.input[1])?.values : undefined);
    const parts = sizes?.map(num) ?? (() => {
      const each = div(s[a], num(node.output.length));
      return each ? node.output.map(() => each) : undefined;
    })();
    if (!parts) return [];
    return parts.map((p) => ({ shape: s.map((d, i) => (i === a ? p : d)) }));
  }
}

const BIG = 2 ** 31;

function sliceLength(dim: Poly, start: Poly, end: Poly): Poly {
  const st = constantOf(start), en = constantOf(end);
  const norm = (v: Poly, c: number | undefined): Poly => (c !== undefined && c < 0 ? add(dim, num(c)) : c !== undefined && c >= BIG ? dim : v);
  return add(norm(end, en), norm(start, st), -1);
}

/** Numpy broadcasting: a 1 takes the other dim; otherwise the dims must agree, and the first is kept. */
function broadcast(shapes: Poly[][]): Poly[] {
  const rank = Math.max(...shapes.map((s) => s.length));
  const out: Poly[] = [];
  for (let i = 0; i < rank; i++) {
    const dims = shapes.map((s) => s[s.length - rank + i]).filter((d): d is Poly => d !== undefined);
    out.push(dims.find((d) => constantOf(d) !== 1) ?? num(1));
  }
  return out;
}
