/**
 * RoPE rescaled in the graph (policy/rope.ts): the constant of frequencies is multiplied by θ'_i / θ_i before the
 * node that reads it, and for YaRN every reader of the Cos and Sin reads them times its factor. The constant itself
 * is left as it was, so revert (the journal) restores the model exactly, and verification can undo the rescaling by
 * setting the multipliers to 1.
 *
 * Rotary caches (tables cos(p·θ_i), sin(p·θ_i) an operator reads by position) are first written in that form: new
 * caches Cos and Sin of positions × the frequencies fitted to the tables (detect/rope.ts), which the operators read
 * instead; the rescaling then applies to them as above. The new caches may have more rows than the old (room for the
 * context the rescaling is for); onnxruntime folds them to constants when the session starts.
 */
import { InputError } from '../errors';
import { Graph, nodeLabel } from '../graph/graph';
import { RopeFrequencies, RopeTable } from '../detect/rope';
import { DataType, NodeProto } from '../io/onnx';
import { PART } from '../identity';
import { ropeFrequencies, RopeSpec } from '../policy/rope';
import { Builder } from './builder';

/** What the record keeps of one rescaled constant: the names verification reads. */
export interface RopeSiteRecord {
  /** The constant of frequencies, unchanged. */
  constant: string;
  /** The initializer of the multipliers θ'_i / θ_i. */
  factor: string;
  /** The Mul of the constant by them (by node name). */
  apply: string;
  /** YaRN: the initializer of its factor on cos and sin. */
  mscale?: string;
  /** YaRN: the Cos and Sin whose readers read them times that factor (by label). */
  trig?: string[];
  /**
   * Rotary caches recomputed: the original caches (left in the model, read by nothing), their rows, the rows of
   * the new ones, and the frequencies fitted to them (`constant` is then the patch's initializer of those).
   */
  table?: { cos: string; sin: string; rows: number; newRows: number; theta: number[] };
}

/** The original frequencies of a rescaled site: its constant's values in the original graph, or those fitted to its caches. */
export function originalTheta(site: RopeSiteRecord, original: Graph): number[] {
  return site.table?.theta ?? original.constValue(site.constant)?.values.map(Number) ?? [];
}

/** How checks name a rescaled site: its constant, or its caches. */
export function ropeLabel(r: RopeSiteRecord): string {
  return r.table ? `RoPE caches '${r.table.cos}', '${r.table.sin}'` : `RoPE '${r.constant}'`;
}

/** Most rows a recomputed cache gets (room for 16× a 64k context): 2^20 positions. */
const MAX_ROWS = 1 << 20;

/** The rows of a recomputed cache: the old ones, or the context the rescaling is for (`scale`·L, L = the old rows without --train-len). */
export function tableRows(t: RopeTable, spec: RopeSpec): number {
  return Math.max(t.rows, Math.min(MAX_ROWS, Math.ceil(spec.scale * (spec.trainLen ?? t.rows))));
}

/**
 * The caches of `t` written as Cos and Sin of positions × its fitted frequencies (repeated as the tables' columns
 * repeat them, reshaped to the tables' leading dims), read by its readers instead: the in-graph form insertRope
 * rescales, returned as such (the frequencies' reader is the Gather that repeats them).
 */
export function recomputeTables(b: Builder, t: RopeTable, rows: number): RopeFrequencies {
  const K = t.theta.length;
  const theta = b.constant(PART.ropeTheta, DataType.FLOAT, [K], t.theta);
  const columns = b.op('Gather', [theta, b.int64('rope_columns', t.column)], {}, 'rope_columns');
  const reader = b.last!;
  const positions = b.constant(PART.ropePositions, DataType.FLOAT, [rows, 1], Array.from({ length: rows }, (_, p) => p));
  const angles = b.op('Mul', [positions, columns], {}, 'rope_angles');
  const dims = [...t.dims.slice(0, -2), rows, t.dims[t.dims.length - 1]];
  const trig = (op: 'Cos' | 'Sin', part: string): { node: NodeProto; out: string } => {
    const out = b.op(op, [angles], {}, part);
    const node = b.last!;
    const typed = t.type === DataType.FLOAT ? out : b.op('Cast', [out], { to: t.type }, `${part}_cast`);
    return { node, out: dims.length === 2 ? typed : b.op('Reshape', [typed, b.int64('rope_dims', dims)], {}, `${part}_shaped`) };
  };
  const made = { cos: trig('Cos', PART.ropeCos), sin: trig('Sin', PART.ropeSin) };
  for (const r of t.readers) b.editor.setInput(r.node, r.input, made[r.table].out);
  return { constant: theta, theta: t.theta, dims: [K], type: DataType.FLOAT, reader: { node: reader, input: 0 }, trig: [made.cos.node, made.sin.node] };
}

export function insertRope(b: Builder, f: RopeFrequencies, spec: RopeSpec): RopeSiteRecord {
  const next = ropeFrequencies(spec, f.theta);
  const factor = b.constant(PART.ropeFactor, f.type, f.dims, next.theta.map((t, i) => t / f.theta[i]));
  const scaled = b.op('Mul', [f.constant, factor], {}, PART.rope);
  const apply = b.last!.name;
  b.editor.setInput(f.reader.node, f.reader.input, scaled);
  if (next.mscale === 1) return { constant: f.constant, factor, apply };
  const mscale = b.constant(PART.ropeMscale, f.type, [], [next.mscale]);
  for (const trig of f.trig) {
    const out = trig.output[0];
    if (b.graph.proto.output.some((o) => o.name === out)) throw new InputError(`'${nodeLabel(trig)}' is a graph output: YaRN's factor on it would change the model's interface`, 'cannot-patch');
    const readers = [...b.graph.consumersOf(out)];
    const times = b.op('Mul', [out, mscale], {}, PART.ropeMscaled);
    for (const r of readers) r.input.forEach((x, i) => { if (x === out) b.editor.setInput(r, i, times); });
  }
  return { constant: f.constant, factor, apply, mscale, trig: f.trig.map((t) => nodeLabel(t)) };
}
