/**
 * RoPE's frequencies as exporters write them, in two forms:
 * - in the graph: Cos and Sin of angles = positions × a constant of frequencies (θ_i = base^(−2i/d), a geometric
 *   series), the angles maybe concatenated with themselves, cast or transposed on the way;
 * - as tables: the cos and sin caches [P, K] a rotary operator reads by position (RotaryEmbedding, GroupQueryAttention
 *   with do_rotary; ops.ts's positionTable), cos(p·θ_i) and sin(p·θ_i), from which θ is fitted and checked entry by entry.
 * Other forms are named so that `--rope` can refuse them: caches fed at run time, tables of anything else, Cos/Sin of
 * anything else.
 */
import { Graph, nodeLabel } from '../graph/graph';
import { positionTableOf } from '../graph/ops';
import { Scope } from '../graph/scopes';
import { ConstTensor } from '../graph/tensor';
import { DataType, NodeProto } from '../io/onnx';

export interface RopeFrequencies {
  /** The constant of frequencies, as the graph names it (an initializer or a Constant's output). */
  constant: string;
  /** Its values, in order, and dims. */
  theta: number[];
  dims: number[];
  type: number;
  /** The node that reads it (the angles' Mul or MatMul) and at which input. */
  reader: { node: NodeProto; input: number };
  /** The Cos and Sin whose angles it sets. */
  trig: NodeProto[];
}

/** Ops the angles pass through between their product and the Cos or Sin (a Concat: every input is followed). */
const PASS = new Set(['Concat', 'Cast', 'Transpose', 'Reshape', 'Unsqueeze', 'Squeeze', 'Identity', 'Expand']);

/** Ops between the constant of frequencies and the product (its input 0 is the frequencies). */
const SHAPE = new Set(['Cast', 'Unsqueeze', 'Reshape', 'Transpose', 'Expand', 'Identity', 'Squeeze']);

/** The products of positions and frequencies: the angles. */
const PRODUCT = new Set(['Mul', 'MatMul', 'FusedMatMul', 'Einsum']);

/**
 * A pair of rotary caches, cos(p·θ_i) and sin(p·θ_i) for p < rows, of dims [1…, rows, C], and the nodes that read
 * them: a rotary operator (both), or two Gathers or Slices alike but for the table (PyTorch's `cos_cached[positions]`).
 */
export interface RopeTable {
  cos: string;
  sin: string;
  /** The frequencies fitted to the tables (a geometric series every entry matches). */
  theta: number[];
  /** Column j of the tables holds frequency column[j]: K columns, or 2K (θ repeated as halves, or in pairs). */
  column: number[];
  dims: number[];
  rows: number;
  type: number;
  readers: { node: NodeProto; input: number; table: 'cos' | 'sin' }[];
}

/** The scope's RoPE in both forms, or why it cannot be rescaled there. */
export function findRope(scope: Scope): { frequencies: RopeFrequencies[]; tables: RopeTable[] } | string {
  const tables = findRopeTables(scope.graph);
  if (typeof tables === 'string') return tables;
  const frequencies = findRopeFrequencies(scope);
  if (typeof frequencies === 'string') return frequencies;
  if (!tables.length && !frequencies.length) return 'no Cos or Sin of positions × a constant of frequencies, and no cos/sin caches of positions: the model has no RoPE this reads';
  return { frequencies, tables };
}

/** The names of the constant tables that are RoPE's cos and sin caches (those --rope recomputes). */
export function ropeTableNames(g: Graph): Set<string> {
  const tables = findRopeTables(g);
  return new Set(typeof tables === 'string' ? [] : tables.flatMap((t) => [t.cos, t.sin]));
}

type TablePair = { cos: string; sin: string; readers: RopeTable['readers']; label: string };

/** The rotary caches of the graph, fitted; why, where a rotary operator's cannot be recomputed. */
function findRopeTables(g: Graph): RopeTable[] | string {
  const pairs = operatorTables(g);
  if (typeof pairs === 'string') return pairs;
  const out: RopeTable[] = [];
  for (const pair of [...pairs, ...gatheredTables(g)]) {
    const c = g.constValue(pair.cos)!, s = g.constValue(pair.sin)!;
    const fit = fitRotaryTables(c, s);
    if (typeof fit === 'string') {
      if (pair.label) return `${pair.label}: its caches '${pair.cos}', '${pair.sin}' ${fit}`;
      continue; // two tables read alike that are not RoPE's: not a form this rescales, and nothing to refuse
    }
    out.push({ cos: pair.cos, sin: pair.sin, ...fit, dims: c.dims, rows: rowsOf(c.dims), type: c.dataType, readers: pair.readers });
  }
  return out;
}

/** The caches rotary operators read (ops.ts's position table with its sine cache), one entry per pair. */
function operatorTables(g: Graph): TablePair[] | string {
  const found = new Map<string, TablePair>();
  for (const node of g.nodes) {
    const t = positionTableOf(node);
    if (t?.sin === undefined) continue;
    const [cos, sin] = [node.input[t.input], node.input[t.sin]];
    const label = `'${nodeLabel(node)}' (${node.opType})`;
    if (!cos || !sin) return `${label} has no cos/sin caches`;
    const fed = [cos, sin].find((x) => g.inputs.has(x) || !g.constValue(x));
    if (fed) return `${label} reads its rotary cache '${fed}' ${g.inputs.has(fed) ? 'as a model input' : 'computed at run time'}: --rope recomputes constant caches only (feed caches computed for the rescaled frequencies instead)`;
    const entry = found.get(`${cos}|${sin}`) ?? { cos, sin, readers: [], label };
    entry.readers.push({ node, input: t.input, table: 'cos' }, { node, input: t.sin, table: 'sin' });
    found.set(`${cos}|${sin}`, entry);
  }
  return [...found.values()];
}

/**
 * Tables gathered or sliced by position: two constants of one shape, one with row 0 all 1 (cos 0) and one all 0
 * (sin 0), each read by Gathers or Slices that are alike but for the table (same op, same other inputs).
 */
function gatheredTables(g: Graph): TablePair[] {
  const groups = new Map<string, Map<string, { node: NodeProto; input: number }[]>>();
  for (const node of g.nodes) {
    if ((node.opType !== 'Gather' && node.opType !== 'Slice') || (node.domain ?? '') !== '') continue;
    const table = node.input[0];
    const dims = g.initializers.get(table)?.dims.map(Number) ?? (g.producer.get(table)?.opType === 'Constant' ? g.constValue(table)?.dims : undefined);
    if (!dims || rowsOf(dims) < 2 || g.inputs.has(table)) continue;
    const key = `${node.opType}|${node.input.slice(1).join('|')}|${node.attribute.map((a) => `${a.name}=${Number(a.i ?? 0)}`).join()}|${dims.join('x')}`;
    const group = groups.get(key) ?? new Map<string, { node: NodeProto; input: number }[]>();
    group.set(table, [...(group.get(table) ?? []), { node, input: 0 }]);
    groups.set(key, group);
  }
  const pairs: TablePair[] = [];
  for (const group of groups.values()) {
    if (group.size !== 2) continue;
    const [a, b] = [...group.keys()];
    const start = [a, b].map((x) => g.constValue(x)!.values.slice(0, g.constValue(x)!.dims.at(-1)));
    const ones = (v: number[]): boolean => v.every((x) => Math.abs(x - 1) < 1e-3), zeros = (v: number[]): boolean => v.every((x) => Math.abs(x) < 1e-3);
    const [cos, sin] = ones(start[0]) && zeros(start[1]) ? [a, b] : ones(start[1]) && zeros(start[0]) ? [b, a] : [];
    if (!cos || !sin) continue;
    const readers = [...group.get(cos)!.map((r) => ({ ...r, table: 'cos' as const })), ...group.get(sin)!.map((r) => ({ ...r, table: 'sin' as const }))];
    pairs.push({ cos, sin, readers, label: '' });
  }
  return pairs;
}

/** The rows of a table [1…, rows, C] (0 where its dims are not of that form). */
function rowsOf(dims: readonly number[]): number {
  return dims.length >= 2 && dims.slice(0, -2).every((d) => d === 1) ? dims[dims.length - 2] : 0;
}

/**
 * θ of tables cos(p·θ_i), sin(p·θ_i) [1…, P, C]: the columns hold K frequencies once, or twice (as halves, or in
 * pairs, as rotate-half and interleaved RoPE write them). Each frequency's angle unwrapped along the rows (RoPE's
 * θ_i ≤ 1 < π turns less than half a circle per row) gives θ_i from its last row; a geometric series is fitted to
 * those and must reproduce every entry, within the tables' rounding (fp16's, or fp32's angle p·θ).
 */
export function fitRotaryTables(cos: ConstTensor, sin: ConstTensor): { theta: number[]; column: number[] } | string {
  const P = rowsOf(cos.dims), C = cos.dims[cos.dims.length - 1];
  if (!P || sin.dims.join() !== cos.dims.join()) return `are not two [positions, K] tables of one shape (${cos.dims.join('×')}, ${sin.dims.join('×')})`;
  if (P < 2 || C < 2) return `have ${P} row(s) of ${C}: too few to fit frequencies`;
  const column = layoutOf(cos, P, C);
  const K = Math.max(...column) + 1;
  const raw = Array.from({ length: K }, (_, i) => {
    const j = column.indexOf(i);
    let angle = 0;
    for (let p = 1; p < P; p++) {
      const step = Math.atan2(sin.values[p * C + j], cos.values[p * C + j]) - Math.atan2(sin.values[(p - 1) * C + j], cos.values[(p - 1) * C + j]);
      angle += step - 2 * Math.PI * Math.round(step / (2 * Math.PI));
    }
    return angle / (P - 1);
  });
  if (!raw.every((t) => t > 0)) return 'are not cos and sin of position × positive frequencies';
  const theta = geometricFit(raw);
  const error = (th: readonly number[]): string | undefined => tableError(cos, sin, P, C, column.map((i) => th[i]));
  if (error(theta) === undefined) return { theta, column };
  return error(raw) === undefined ? 'hold frequencies that are not a geometric series base^(−2i/d) (a RoPE already rescaled, as Llama 3\'s is): --rope does not rescale it again'
    : `are not cos and sin of position × frequencies (${error(raw)})`;
}

/** Which frequency each column holds: column j, or j mod C/2 (halves), or ⌊j/2⌋ (pairs), as the cos table's columns repeat. */
function layoutOf(cos: ConstTensor, P: number, C: number): number[] {
  const same = (j: number, k: number): boolean => Array.from({ length: P }, (_, p) => p).every((p) => cos.values[p * C + j] === cos.values[p * C + k]);
  const half = C / 2, cols = Array.from({ length: C }, (_, j) => j);
  if (C % 2 === 0 && cols.slice(0, half).every((j) => same(j, j + half))) return cols.map((j) => j % half);
  if (C % 2 === 0 && cols.slice(0, half).every((i) => same(2 * i, 2 * i + 1))) return cols.map((j) => Math.floor(j / 2));
  return cols;
}

/**
 * The geometric series θ_0·r^i nearest to `raw` in log terms, each ln θ_i weighted by θ_i²: a fitted θ_i is off by
 * about the same angle per row whatever its size, so the small ones are the least sure in log terms.
 */
function geometricFit(raw: readonly number[]): number[] {
  const w = raw.map((t) => t * t), W = w.reduce((a, b) => a + b, 0);
  const logs = raw.map(Math.log);
  const meanI = w.reduce((a, wi, i) => a + wi * i, 0) / W, meanLog = w.reduce((a, wi, i) => a + wi * logs[i], 0) / W;
  let num = 0, den = 0;
  logs.forEach((l, i) => { num += w[i] * (i - meanI) * (l - meanLog); den += w[i] * (i - meanI) ** 2; });
  const slope = num / den, intercept = meanLog - slope * meanI;
  return raw.map((_, i) => Math.exp(intercept + slope * i));
}

/** The first entry the angles per column do not reproduce (rows sampled evenly past 4096), or undefined. */
function tableError(cos: ConstTensor, sin: ConstTensor, P: number, C: number, theta: readonly number[]): string | undefined {
  const tol = cos.dataType === DataType.FLOAT16 ? 2e-3 : cos.dataType === DataType.BFLOAT16 ? 1.6e-2 : 2e-5;
  const stride = Math.max(1, Math.floor(P / 4096));
  for (let p = 0; p < P; p += p < 4096 ? 1 : stride) {
    for (let j = 0; j < C; j++) {
      const a = p * theta[j], slack = tol + 4e-7 * a;
      const [c, s] = [cos.values[p * C + j], sin.values[p * C + j]];
      if (!(Math.abs(c - Math.cos(a)) <= slack && Math.abs(s - Math.sin(a)) <= slack)) return `row ${p}, column ${j}: ${c.toPrecision(4)}, ${s.toPrecision(4)} where cos, sin of ${a.toPrecision(4)} are ${Math.cos(a).toPrecision(4)}, ${Math.sin(a).toPrecision(4)}`;
    }
  }
  return undefined;
}

/** Every constant of frequencies of the scope (none where it has no Cos or Sin), or why RoPE cannot be rescaled there. */
export function findRopeFrequencies(scope: Scope): RopeFrequencies[] | string {
  const found = new Map<string, RopeFrequencies>();
  for (const trig of scope.graph.nodes.filter((n) => (n.opType === 'Cos' || n.opType === 'Sin') && (n.domain ?? '') === '')) {
    const products = anglesOf(scope, trig);
    if (typeof products === 'string') return products;
    for (const product of products) {
      const f = frequenciesOf(scope, trig, product);
      if (typeof f === 'string') return f;
      const key = `${nodeLabel(f.reader.node)}|${f.reader.input}`;
      const entry = found.get(key) ?? f;
      if (!entry.trig.includes(trig)) entry.trig.push(trig);
      found.set(key, entry);
    }
  }
  return [...found.values()];
}

/** The products whose angles the Cos or Sin reads, through reshapes and Concats of the angles. */
function anglesOf(scope: Scope, trig: NodeProto): NodeProto[] | string {
  const g = scope.graph;
  const out: NodeProto[] = [];
  const walk = (x: string): string | undefined => {
    const p = g.producer.get(x);
    if (p && PASS.has(p.opType)) {
      for (const i of p.opType === 'Concat' ? p.input : [p.input[0]]) {
        const why = walk(i);
        if (why) return why;
      }
      return undefined;
    }
    if (p && PRODUCT.has(p.opType)) { out.push(p); return undefined; }
    return `'${nodeLabel(trig)}': its angles are not positions × a constant of frequencies (they come from ${p ? `'${nodeLabel(p)}' (${p.opType})` : 'an input'})`;
  };
  return walk(trig.input[0]) ?? out;
}

/** The constant one operand of the product reads (through reshapes and casts), checked to be RoPE's frequencies. */
function frequenciesOf(scope: Scope, trig: NodeProto, product: NodeProto): RopeFrequencies | string {
  const g = scope.graph;
  const roots = product.input.map((i) => rootConstant(scope, product, i));
  const k = roots.findIndex((r) => r !== undefined);
  if (k < 0 || roots.filter((r) => r !== undefined).length !== 1) return `'${nodeLabel(product)}': the angles of '${nodeLabel(trig)}' are not positions × one constant of frequencies`;
  const { constant, reader } = roots[k]!;
  const value = g.constValue(constant)!;
  const theta = value.values.map(Number);
  if (!isGeometric(theta)) return `'${constant}': the frequencies of '${nodeLabel(trig)}' are not a geometric series base^(−2i/d)`;
  return { constant, theta, dims: value.dims, type: value.dataType, reader, trig: [] };
}

/** The initializer or Constant an operand is a reshaped or cast copy of, and the node that reads it on the way. */
function rootConstant(scope: Scope, product: NodeProto, input: string): { constant: string; reader: { node: NodeProto; input: number } } | undefined {
  const g = scope.graph;
  let reader = { node: product, input: product.input.indexOf(input) };
  let x = input;
  for (;;) {
    const p = g.producer.get(x);
    if (!p || p.opType === 'Constant') return g.constValue(x) ? { constant: x, reader } : undefined;
    if (!SHAPE.has(p.opType)) return undefined;
    reader = { node: p, input: 0 };
    x = p.input[0];
  }
}

/** Frequencies RoPE's form θ_i = base^(−2i/d) can be: positive, falling by one ratio (within 1e-4 of it). */
export function isGeometric(theta: readonly number[]): boolean {
  if (theta.length < 2 || !theta.every((t) => t > 0 && Number.isFinite(t))) return false;
  const ratio = theta[1] / theta[0];
  return ratio < 1 && theta.every((t, i) => i === 0 || Math.abs(t / theta[i - 1] - ratio) <= 1e-4 * ratio);
}
