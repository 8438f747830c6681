/**
 * A site's tensors of one run laid out for the probe as blocks × rows × cols, with each block's batch item and
 * head and each row's n. Plain-op sites give logits [..., H, Tq, Tk] (or [B·H, Tq, Tk]); fused operators give
 * their query in the operator's layout ([B,S,N·H], [B,N,S,H], packed QKV, or the query columns of a weight),
 * with n from the operator's n plan evaluated on the run's actual input shapes and lengths.
 */
import { FusedSite } from '../detect/fused';
import { HIDDEN_GAP, STRONG_MASK } from '../detect/mask-form';
import { inputAt, NPlan, opSpec, queryInput, QueryPlan, Term } from '../graph/attention-ops';
import { planFor } from '../rewrite/fused';
import { NMode } from '../policy/n-mode';
import { ProbeView } from './probe';
import { ProbeOutputs } from './probe-model';
import { Outputs, OutputTensor } from './run';
import { readsLogits, VerifySite } from './sites';
import { elementCount } from './tensors';
import { windowN, WindowSpec } from '../policy/window';

/**
 * One run's views of a site from the probe copy's outputs: its logits (the last row only, when the copy brought
 * out only that), or its fused operator's query, with the parts that must be unchanged.
 */
export function siteViews(site: VerifySite, w: ProbeOutputs, out: Outputs, run: { id: string; seq: number }, lastRow: boolean): FusedViews | string {
  const before = out[w.before], after = out[w.after];
  const heads = site.s.length > 1 ? site.s.length : 1;
  if (site.fused && !readsLogits(site)) {
    return fusedView({
      run: run.id, site: site.fused, mode: site.record.n, before, after, heads, terms: termValues(site.fused, w, out),
      expanded: Boolean(site.record.expanded),
      bias: w.bias ? { before: out[w.bias.before], after: out[w.bias.after] } : undefined,
    });
  }
  const shape = w.keys ? out[w.keys] : undefined;
  const v = logitsView({
    run: run.id, before, after, masked: w.masked ? out[w.masked] : undefined, hidden: w.hidden ? out[w.hidden] : undefined,
    content: w.content ? out[w.content] : undefined, mode: site.record.n, heads, ...(lastRow ? { lastRow: { seq: run.seq } } : {}),
    ...windowOf(site, w),
    ...(shape ? { keys: shape.data[shape.data.length - 1] } : {}),
  });
  return typeof v === 'string' ? v : { views: [v], unchanged: [] };
}

export interface LogitsInput {
  run: string;
  before: OutputTensor;
  after: OutputTensor;
  /** The logits the Softmax reads, for n counted from masks. */
  masked?: OutputTensor;
  /** A factor on the query: the content logits the masks are added to, in the masked logits' layout. */
  content?: OutputTensor;
  /** 1 where a mild Where fill hides a key, else 0, in the masked logits' layout: the counts come from it. */
  hidden?: OutputTensor;
  mode: string;
  /** Heads of a [B·H, Tq, Tk] view (per-head s); 4-D logits carry their own. */
  heads: number;
  /** The tensors hold only the last row of logits with `seq` rows. */
  lastRow?: { seq: number };
  /** The tensors are the query rows of a QK product with this many keys (not logits). */
  keys?: number;
  /** The sliding window the site's n counts through (causal mode: n = the keys it leaves). */
  window?: WindowSpec;
}

/** The logits view of a plain-op site, or a one-line problem. */
export function logitsView(x: LogitsInput): ProbeView | string {
  const { before, after } = x;
  if (before.dims.join() !== after.dims.join()) return `logits before the factor are [${before.dims.join(', ')}], after it [${after.dims.join(', ')}] (${x.run})`;
  const r = before.dims.length;
  const cols = r >= 1 ? before.dims[r - 1] : 1;
  const tk = x.keys ?? cols;
  const rows = r >= 2 ? before.dims[r - 2] : 1;
  const blocks = cols * rows === 0 ? 0 : before.data.length / (cols * rows);
  const heads = r >= 4 ? before.dims[r - 3] : Math.max(1, x.heads);
  const tq = x.lastRow ? x.lastRow.seq : rows;
  const row = (i: number): number => (x.lastRow ? tq - 1 : i);
  let counts: Float64Array | null = null;
  if (x.masked) {
    if (x.masked.data.length !== blocks * rows * tk) return `the masked logits [${x.masked.dims.join(', ')}] do not line up with the probed tensors (${x.run})`;
    counts = x.hidden?.data.length === x.masked.data.length ? shownCounts(x.hidden.data, tk)
      : x.content?.data.length === x.masked.data.length ? visibleCounts(termsOf(x.masked.data, x.content.data), tk)
        : x.keys === undefined && x.after.data.length === x.masked.data.length
          ? visibleCounts(termsOf(x.masked.data, x.after.data), tk)
          : maskedCounts(x.masked.data, tk);
  }
  const w = x.window;
  const causal = (i: number): number => (w ? windowN(w, tk - tq + row(i)) : tk - tq + row(i) + 1);
  const declared = (g: number, i: number): number => (counts ? Math.max(counts[g * rows + i], 1) : x.mode === 'causal' ? causal(i) : tk);
  const alternatives = miscounts(declared);
  if (!x.lastRow) {
    alternatives.push(x.mode === 'causal'
      ? { name: 'n = Tk (keys mode) although the record says causal', n: () => tk }
      : { name: 'causal n_i = Tk − Tq + i + 1 although the record says keys', n: (_g, i) => causal(i) });
    alternatives.push({ name: 'n = Tq (the query length, not the key count)', n: () => tq });
  }
  const perHead = r >= 4 || x.heads > 1;
  return {
    run: x.run, blocks, rows, cols, before: before.data, after: after.data, colsAreKeys: x.keys === undefined, n: declared, alternatives,
    head: (g) => g % heads, pos: (_g, i) => tk - tq + row(i),
    where: (g, i) => (perHead ? `head ${g % heads} row ${row(i)} (${x.run}, batch item ${Math.floor(g / heads)})` : `row ${row(i)} (${x.run}, block ${g})`),
  };
}

/** The n a patch that counts keys wrongly would use: twice n, or one more. */
function miscounts(n: (g: number, i: number) => number): ProbeView['alternatives'] {
  return [{ name: 'n doubled (2n)', n: (g, i) => 2 * n(g, i) }, { name: 'n off by one (n + 1)', n: (g, i) => n(g, i) + 1 }];
}

/**
 * The terms added to the scaled logits before the Softmax (masks, biases): the masked logits less the content. The
 * masked logits alone cannot be read by the patch's rule: peaked content logits are themselves 30 apart.
 */
function termsOf(masked: ArrayLike<number>, content: ArrayLike<number>): Float64Array {
  return Float64Array.from(masked, (m, i) => m - content[i]);
}

/** Keys the terms on the logits leave visible per row, by the patch's rule: an entry HIDDEN_GAP below its row's largest hides. */
function visibleCounts(terms: ArrayLike<number>, tk: number): Float64Array {
  return countRows(terms, tk, (max) => max - HIDDEN_GAP);
}

/** Keys per row that a Where's condition leaves shown (`hidden` 0), as the patch counts them for a Where mask. */
function shownCounts(hidden: ArrayLike<number>, tk: number): Float64Array {
  const counts = new Float64Array(hidden.length / tk);
  for (let i = 0; i < hidden.length; i++) if (hidden[i] === 0) counts[Math.floor(i / tk)]++;
  return counts;
}

/**
 * Where the content is not exposed (the factor on the query), keys the masked logits leave visible. Masks of −10000,
 * finfo.min or −inf are far from any content logit: where the logits hold one, only entries at or below STRONG_MASK
 * count as hidden (peaked content logits, T5's, are 30 apart themselves). Otherwise (Swin's −100) an entry HIDDEN_GAP
 * below its row's largest and below −HIDDEN_GAP is hidden. Either way a row masked alike on every key hides none, as
 * in the patch; a mix of mild and strong masks would make the probe fail, not pass.
 */
function maskedCounts(masked: ArrayLike<number>, tk: number): Float64Array {
  const strong = Array.prototype.some.call(masked, (v: number) => v <= STRONG_MASK);
  return countRows(masked, tk, (max) => Math.min(max - HIDDEN_GAP, strong ? STRONG_MASK : -HIDDEN_GAP));
}


/**
 * Keys per row above the row's limit; NaN for a row holding NaN or +Inf, whose Softmax is NaN in the original
 * too (a mask of 0 divided into the logits): its attention sees no number of keys, so there is no n to check.
 */
function countRows(values: ArrayLike<number>, tk: number, limitOf: (max: number) => number): Float64Array {
  const counts = new Float64Array(values.length / tk);
  for (let row = 0; row < counts.length; row++) {
    let max = -Infinity, nan = false;
    for (let j = 0; j < tk; j++) {
      const v = values[row * tk + j];
      if (Number.isNaN(v)) nan = true;
      else if (v > max) max = v;
    }
    if (nan || max === Infinity) {
      counts[row] = NaN;
      continue;
    }
    const limit = limitOf(max);
    let n = 0;
    for (let j = 0; j < tk; j++) if (values[row * tk + j] > limit) n++;
    counts[row] = n;
  }
  return counts;
}

// ---- fused operators --------------------------------------------------------------------------------------

/**
 * Values a fused site's n plan reads, by term: an input's shape, or an input's values, by role; `at` gives a
 * role's position, which messages name.
 */
export interface TermValues {
  shape(role: string): number[] | undefined;
  value(role: string): number[] | undefined;
  at(role: string): number;
}

/** The shapes and values the probe copy brought out for a fused site's n plan. */
function termValues(site: FusedSite, w: ProbeOutputs, out: Outputs): TermValues {
  const read = (m?: Map<string, string>) => (role: string): number[] | undefined => {
    const name = m?.get(role);
    return name && out[name] ? [...out[name].data] : undefined;
  };
  const spec = opSpec(site.op);
  return { shape: read(w.shapes), value: read(w.values), at: (role) => inputAt(spec, role) };
}

export interface FusedInput {
  run: string;
  site: FusedSite;
  /** The record's n mode: the plan the patch chose from the operator's (keys or causal). */
  mode: string;
  before: OutputTensor;
  after: OutputTensor;
  /** The operator's bias before and after the patch, when the patch folded its query part into the query. */
  bias?: { before: OutputTensor; after: OutputTensor };
  terms: TermValues;
  /** Heads when the operator does not state them (one s for all: 1). */
  heads: number;
  /** The operator was expanded: before and after are its projected query [B, S, N·H] (or [B, S, N, H]). */
  expanded?: boolean;
}

export interface Unchanged { before: Float64Array; after: Float64Array; what: string }

export interface FusedViews {
  views: ProbeView[];
  /** The parts that must be left as they were (keys and values of packed QKV, key/value columns of a weight). */
  unchanged: Unchanged[];
}

/** The query view of a fused site, or a one-line problem. */
export function fusedView(x: FusedInput): FusedViews | string {
  const { site } = x;
  if (x.before.dims.join() !== x.after.dims.join()) return `the query before the factor is [${x.before.dims.join(', ')}], after it [${x.after.dims.join(', ')}] (${x.run})`;
  const plan = planFor(site, x.mode as NMode);
  const S = x.terms.shape(site.queryLength.role)?.[site.queryLength.axis];
  if (S === undefined) return `the query length of ${x.run} was not read`;
  const n = planRows(plan, x.terms, S, batchOf(site, x.terms));
  if (typeof n === 'string') return n;
  // An expanded operator's probed query is its projection [B, S, N·H] (or [B, S, N, H]).
  const layout: QueryPlan = x.expanded ? { layout: 'bsd', input: queryInput(site.query) } : site.query;
  const N = site.heads.heads ?? x.heads;
  if (layout.layout === 'weights') return weightColumns(x, N, n, layout.qWidth);
  const before = withBias(x.before, x.bias?.before), after = withBias(x.after, x.bias?.after);
  const d = x.expanded ? [x.before.dims[0], x.before.dims[1], elementCount(x.before.dims.slice(2))] : x.before.dims;
  let split: Split;
  switch (layout.layout) {
    case 'bsd': split = rowsOf(d[0], d[1], d[2], d[2], N, (b, i, col) => (b * d[1] + i) * d[2] + col); break;
    case 'packed': split = rowsOf(d[0], d[1], d[2], (d[2] / layout.parts) * layout.qParts, N, (b, i, col) => (b * d[1] + i) * d[2] + col); break;
    case 'bnsd': split = rowsOf(d[0], d[2], d[1] * d[3], d[1] * d[3], d[1], (b, i, col) => ((b * d[1] + Math.floor(col / d[3])) * d[2] + i) * d[3] + (col % d[3])); break;
    case 'bsn3h': split = rowsOf(d[0], d[1], d[2] * 3 * d[4], d[2] * d[4], d[2],
      (b, i, col) => ((((b * d[1] + i) * d[2] + Math.floor(col / d[4])) * 3) * d[4]) + (col % d[4]), (b, i, col) => {
        const per = 2 * d[4];
        const h = Math.floor(col / per), rest = col % per;
        return (((b * d[1] + i) * d[2] + h) * 3 + 1) * d[4] + rest;
      }); break;
  }
  return assemble(x.run, split, before, after, n, plan);
}

type Rows = (b: number, i: number) => number;

/** How a fused query splits into scaled rows (B × S rows of N heads × Hd) and an unchanged rest. */
interface Split {
  B: number; S: number; N: number; Hd: number;
  /** Flat index of query element (b, i, head·Hd + d). */
  at(b: number, i: number, col: number): number;
  /** Flat indices of the parts that must not change, when any. */
  rest: number[] | null;
}

function rowsOf(B: number, S: number, width: number, qWidth: number, N: number, at: Split['at'], restAt?: Split['at']): Split {
  const heads = Math.max(1, N);
  const rest: number[] = [];
  const other = restAt ?? ((b, i, c): number => at(b, i, qWidth + c));
  for (let b = 0; b < B; b++) for (let i = 0; i < S; i++) for (let c = 0; c < width - qWidth; c++) rest.push(other(b, i, c));
  return { B, S, N: heads, Hd: qWidth / heads, at, rest: rest.length ? rest : null };
}

function assemble(run: string, split: Split, before: ArrayLike<number>, after: ArrayLike<number>, n: Rows, plan: NPlan): FusedViews {
  const { B, S, N, Hd } = split;
  const b2 = new Float64Array(B * N * S * Hd), a2 = new Float64Array(B * N * S * Hd);
  for (let b = 0; b < B; b++) for (let h = 0; h < N; h++) for (let i = 0; i < S; i++) for (let d = 0; d < Hd; d++) {
    const k = ((b * N + h) * S + i) * Hd + d;
    const at = split.at(b, i, h * Hd + d);
    b2[k] = before[at];
    a2[k] = after[at];
  }
  const view: ProbeView = {
    run, blocks: B * N, rows: S, cols: Hd, before: b2, after: a2, colsAreKeys: false,
    head: (g) => g % N,
    n: (g, i) => n(Math.floor(g / N), i), alternatives: fusedAlternatives(plan, n, S, N),
    where: (g, i) => `head ${g % N} row ${i} (${run}, batch item ${Math.floor(g / N)})`,
  };
  return { views: [view], unchanged: restOf(split, before, after, 'the key and value parts of the packed input') };
}

function restOf(split: Split, before: ArrayLike<number>, after: ArrayLike<number>, what: string): Unchanged[] {
  if (!split.rest) return [];
  return [{ before: Float64Array.from(split.rest, (k) => before[k]), after: Float64Array.from(split.rest, (k) => after[k]), what }];
}

function fusedAlternatives(plan: NPlan, n: Rows, S: number, N: number): ProbeView['alternatives'] {
  const list = miscounts((g, i) => n(Math.floor(g / N), i));
  if (S > 1) list.push({ name: 'n = S (the query length, not the key count)', n: () => S });
  if (plan.kind === 'causal' || plan.kind === 'causal-offset') {
    list.push({ name: 'n = the last row\'s n for every row (keys) although causal', n: (g) => n(Math.floor(g / N), S - 1) });
  } else if (S > 1) {
    list.push({ name: 'a causal n per row although keys', n: (g, i) => n(Math.floor(g / N), S - 1) - S + i + 1 });
  }
  return list;
}

/**
 * com.microsoft Attention: the query columns of the weight [in, W] and of the bias [W] per head, one factor for
 * all rows (n = Tk). Each head's columns make one block; the key and value columns must not change.
 */
function weightColumns(x: FusedInput, N: number, n: Rows, qWidth?: number): FusedViews {
  const pairs: [OutputTensor, OutputTensor, string][] = [[x.before, x.after, 'weights']];
  if (x.bias) pairs.push([x.bias.before, x.bias.after, 'bias']);
  const out: FusedViews = { views: [], unchanged: [] };
  for (const [before, after, what] of pairs) {
    const width = before.dims[before.dims.length - 1];
    const rows = before.data.length / width;
    const split = rowsOf(1, rows, width, qWidth ?? width / 3, N, (_b, r, col) => r * width + col);
    const Hd = split.Hd;
    const b2 = new Float64Array(N * rows * Hd), a2 = new Float64Array(N * rows * Hd);
    for (let h = 0; h < N; h++) for (let r = 0; r < rows; r++) for (let d = 0; d < Hd; d++) {
      b2[(h * rows + r) * Hd + d] = before.data[r * width + h * Hd + d];
      a2[(h * rows + r) * Hd + d] = after.data[r * width + h * Hd + d];
    }
    out.views.push({
      run: x.run, blocks: N, rows: 1, cols: rows * Hd, before: b2, after: a2, colsAreKeys: false,
      head: (g) => g, n: () => n(0, 0),
      alternatives: miscounts(() => n(0, 0)),
      where: (g) => `head ${g} query columns of the ${what} (${x.run})`,
    });
    out.unchanged.push(...restOf(split, before.data, after.data, `the key and value columns of the ${what}`));
  }
  return out;
}

/** The query plus the operator's bias over the columns it covers: what the kernel's logits are computed from. */
function withBias(t: OutputTensor, bias?: OutputTensor): ArrayLike<number> {
  if (!bias) return t.data;
  const width = t.dims[t.dims.length - 1];
  const cover = Math.min(width, bias.data.length);
  const out = Float64Array.from(t.data);
  for (let k = 0; k < out.length; k++) {
    const col = k % width;
    if (col < cover) out[k] += bias.data[col];
  }
  return out;
}

/** The batch size of this run: axis 0 of the input the query length is read from (1 when it was not read). */
function batchOf(site: FusedSite, v: TermValues): number {
  return v.shape(site.queryLength.role)?.[0] ?? 1;
}

/**
 * n per batch item and row from an operator's n plan and the run's inputs, as the kernel counts keys (see
 * graph/attention-ops): the same formulas the patch builds in the graph, evaluated here on the actual values.
 */
export function planRows(plan: NPlan, v: TermValues, S: number, B: number): Rows | string {
  switch (plan.kind) {
    case 'keys': case 'causal': {
      const tk = termTotal(plan.tk, v);
      return typeof tk === 'string' ? tk : plan.kind === 'keys' ? () => tk : (_b, i) => tk - S + i + 1;
    }
    case 'causal-offset': {
      const p = termTotal(plan.offset, v);
      return typeof p === 'string' ? p : (_b, i) => p + i + 1;
    }
    case 'lengths': {
      const lengths = v.value(plan.lengths);
      if (!lengths) return `the lengths input ${v.at(plan.lengths)} of the operator was not read`;
      const prompt = plan.promptTotal !== undefined && v.value(plan.promptTotal)?.[0] === S;
      const clamp = (x: number): number => Math.max(1, plan.window !== undefined ? Math.min(x, plan.window) : x);
      return (b, i) => {
        const T = lengths[b] + (plan.plusOne ? 1 : 0);
        if (!plan.causal) return clamp(T);
        return clamp((prompt ? 0 : T - S) + i + 1);
      };
    }
    case 'mask-index': {
      const tk = termTotal(plan.tk, v);
      if (typeof tk === 'string') return tk;
      const keep = plan.mask === undefined ? () => true : maskIndexKeep(v.value(plan.mask), plan.maskRank ?? 2, B, S, tk);
      if (typeof keep === 'string') return keep;
      const P = tk - S;
      return (b, i) => {
        let n = 0;
        for (let j = 0; j < tk; j++) if (keep(b, i, j) && (!plan.causal || j <= P + i)) n++;
        return Math.max(1, n);
      };
    }
  }
}

/** The sum of a plan's terms (input shapes and values) in this run, or which input was not read. */
function termTotal(terms: Term[], v: TermValues): number | string {
  let sum = 0;
  for (const t of terms) {
    const x = 'value' in t ? v.value(t.role)?.[0] : v.shape(t.role)?.[t.axis];
    if (x === undefined) return `input ${v.at(t.role)} of the operator was not read`;
    sum += x;
  }
  return sum;
}

/**
 * Which keys com.microsoft Attention's mask_index leaves visible to row i of item b, from the operator's
 * definition (contrib-op docs): [B] end positions ([3B + 2] starts with them), [2B] end and start positions,
 * [B|1, T] 1 = attend (a [B|1, 1] when T ≠ 1 is the no-mask dummy), [B|1, S, T], and Megatron's [B|1, 1, M, M]
 * whose rows T − S … T − 1 apply.
 */
function maskIndexKeep(m: number[] | undefined, rank: number, B: number, S: number, T: number): ((b: number, i: number, j: number) => boolean) | string {
  if (!m) return 'the mask_index of the operator was not read';
  const per = (b: number, size: number): number => (m.length === size ? 0 : b * size);
  switch (rank) {
    case 1:
      // [3B + 2] begins with the key ends, as [B] does.
      if (m.length === B || m.length === 3 * B + 2) return (b, _i, j) => j < m[b];
      if (m.length === 2 * B) return (b, _i, j) => j < m[b] && j >= m[B + b];
      return `a 1-D mask_index of ${m.length} values for batch ${B}`;
    case 2:
      if (m.length === B * T || m.length === T) return (b, _i, j) => m[per(b, T) + j] > 0;
      return () => true;
    case 3:
      return (b, i, j) => m[per(b, S * T) + i * T + j] > 0;
    default: {
      // [B|1, 1, M, M]: one square per item, or one for all.
      const items = Number.isInteger(Math.sqrt(m.length / B)) ? B : 1;
      const M = Math.round(Math.sqrt(m.length / items));
      return (b, i, j) => m[(items === 1 ? 0 : b) * M * M + (T - S + i) * M + j] > 0;
    }
  }
}

// ---- the positional prior ---------------------------------------------------------------------------------

/**
 * One run's view of a site's prior: what its Add read (before) and what it made (after), as the site's logits
 * (plain ops, with the factor probe's n) or as the fused operator's additive bias [B|1, H, S, T], with each
 * row's absolute query position, so the probe can recompute c·B.
 */
export function priorView(site: VerifySite, w: ProbeOutputs, out: Outputs, run: { id: string }): ProbeView | string {
  const p = w.prior!;
  const after = out[p.after];
  const before = p.before ? out[p.before] : undefined;
  if (!after || (p.before && !before)) return `the prior's tensors were not produced (${run.id})`;
  const heads = site.theta!.alpha.length;
  if (site.fused && !readsLogits(site)) return biasView(site, w, out, run.id, before, after);
  return logitsView({
    run: run.id, before: before!, after, masked: w.masked ? out[w.masked] : undefined, mode: site.record.n, heads,
    ...windowOf(site, w),
  });
}

/** The sliding window the probe copy runs the site with (probe-model.ts probeWindow), if it has one. */
function windowOf(site: VerifySite, w: ProbeOutputs): { window?: WindowSpec } {
  const spec = w.window?.spec ?? site.window;
  return spec ? { window: spec } : {};
}

/**
 * One run's view of a site's sliding window: what its Add read (before) and made (after), as the site's logits,
 * with each row's absolute position, so the probe can recompute the bias from W and S.
 */
export function windowView(site: VerifySite, w: ProbeOutputs, out: Outputs, run: { id: string }): ProbeView | string {
  const before = out[w.window!.before], after = out[w.window!.after];
  if (!before || !after) return `the window's tensors were not produced (${run.id})`;
  return logitsView({
    run: run.id, before, after, masked: w.masked ? out[w.masked] : undefined, mode: site.record.n, heads: Math.max(1, site.s.length), ...windowOf(site, w),
  });
}

/** A fused operator's bias with the prior added, the bias it had (broadcast; zeros when it had none) and each row's n and position. */
function biasView(site: VerifySite, w: ProbeOutputs, out: Outputs, run: string, before: OutputTensor | undefined, after: OutputTensor): ProbeView | string {
  const f = site.fused!;
  const d = after.dims;
  if (d.length !== 4) return `the bias with the prior is [${d.join(', ')}], not [B|1, H, S, T] (${run})`;
  const [Bb, Hb, S, T] = d;
  const terms = termValues(f, w, out);
  const plan = planFor(f, site.record.n as NMode);
  const n = planRows(plan, terms, S, batchOf(f, terms));
  if (typeof n === 'string') return n;
  const pos = planPositions(plan, terms, S, T);
  if (typeof pos === 'string') return pos;
  const base = before ? broadcast(before, d) : new Float64Array(after.data.length);
  if (typeof base === 'string') return `${base} (${run})`;
  return {
    run, blocks: Bb * Hb, rows: S, cols: T, before: base, after: after.data, colsAreKeys: true, alternatives: [],
    head: (g) => g % Hb,
    n: (g, i) => n(Math.floor(g / Hb), i), pos: (g, i) => pos(Math.floor(g / Hb), i),
    where: (g, i) => `head ${g % Hb} row ${i} of the bias (${run}, batch item ${Math.floor(g / Hb)})`,
  };
}

/** The absolute position of each item's query rows, as the patch places the prior (rewrite/fused.ts priorPositions). */
function planPositions(plan: NPlan, v: TermValues, S: number, T: number): Rows | string {
  switch (plan.kind) {
    case 'keys': case 'causal': return (_b, i) => T - S + i;
    case 'causal-offset': {
      const p = termTotal(plan.offset, v);
      return typeof p === 'string' ? p : (_b, i) => p + i;
    }
    case 'lengths': {
      const lengths = v.value(plan.lengths);
      if (!lengths) return `the lengths input ${v.at(plan.lengths)} of the operator was not read`;
      const prompt = plan.promptTotal !== undefined && v.value(plan.promptTotal)?.[0] === S;
      return (b, i) => (prompt ? 0 : lengths[b] + (plan.plusOne ? 1 : 0) - S) + i;
    }
    case 'mask-index': {
      const tk = termTotal(plan.tk, v);
      return typeof tk === 'string' ? tk : (_b, i) => tk - S + i;
    }
  }
}

/** `t` broadcast to `dims` (numpy rules, aligned on the right). */
function broadcast(t: OutputTensor, dims: number[]): Float64Array | string {
  const src = t.dims;
  if (src.length > dims.length || src.some((x, k) => x !== 1 && x !== dims[dims.length - src.length + k])) {
    return `the bias the prior was added to is [${src.join(', ')}], which does not broadcast to [${dims.join(', ')}]`;
  }
  const total = elementCount(dims);
  const out = new Float64Array(total);
  const pad = dims.length - src.length;
  for (let k = 0; k < total; k++) {
    let rest = k, at = 0, stride = 1;
    for (let a = dims.length - 1; a >= 0; a--) {
      const idx = rest % dims[a];
      rest = Math.floor(rest / dims[a]);
      if (a >= pad && src[a - pad] !== 1) at += idx * stride;
      if (a >= pad) stride *= src[a - pad];
    }
    out[k] = t.data[at];
  }
  return out;
}
