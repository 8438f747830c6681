/**
 * The semantic probe: at every patched site, the logits after the factor must equal the logits before it times
 * c = s_h·ln(n_i), for every batch item, head h and row i, with n_i from the site's n mode (keys: n = Tk;
 * causal: n_i = Tk − Tq + i + 1, which also covers KV-cache decoding; modes that count n from masks: the keys the
 * row's Softmax input leaves visible, entries above −9000). Entries are compared as
 * after ≈ c·before, never by dividing, so logits near 0 cannot produce a false ratio. When a site fails, the
 * probe names the wiring its numbers do match: the other n mode, n = Tq, per-head s reversed, the factor
 * indexed by key, another layer's s, or no factor at all.
 */
import { bfloat16ToNumber, float16ToNumber, float32ToBfloat16Bits, float32ToFloat16Bits } from '../graph/tensor';
import { DataType } from '../io/onnx';
import { SiteRecord } from '../rewrite/record';
import { OutputTensor } from './run';

export interface ProbeSiteResult {
  layer: number;
  n: string;
  s: number | number[];
  runs: number;
  entries: number;
  /** Largest relative error of after against c·before, over entries not near 0. */
  maxRelError: number;
  passed: boolean;
  /** One line saying what is wrong, with an example row. */
  message?: string;
  /** The wirings the numbers match instead, when the site fails. */
  matches?: string[];
}

/** Relative rounding of a dot product at the scale of its row's largest entry (float32, a few ulps). */
const ROW_EPS = 1e-6;

interface Hypothesis {
  name: string;
  /** Factor for block g (batch·head), row i, key j of logits with Tq rows and Tk keys. */
  factor: (g: number, i: number, j: number, tq: number, tk: number) => number;
  fits: boolean;
}

interface RowFailure {
  score: number;
  text: string;
}

/** Collects probe tensors of one site over every run, then judges them. */
export class SiteProbe {
  private readonly s: number[];
  private readonly rtol: number;
  private readonly floor: number;
  private readonly hypotheses: Hypothesis[];
  private runs = 0;
  private entries = 0;
  private maxRel = 0;
  private worst: RowFailure | null = null;
  private varying: RowFailure | null = null;
  private shapeError: string | null = null;
  /** Visible keys per row of the current run, for n counted from masks. */
  private counts: Int32Array | null = null;

  constructor(private readonly site: SiteRecord, otherLayers: SiteRecord[]) {
    // Only sites with a factor are probed (see probeable): s is set.
    this.s = Array.isArray(site.s) ? site.s : [site.s!];
    const half = site.factorType === DataType.FLOAT16;
    const bf16 = site.factorType === DataType.BFLOAT16;
    this.rtol = half ? 2e-3 : bf16 ? 1.6e-2 : 1e-5;
    this.floor = half ? 1e-7 : 1e-30;
    this.hypotheses = this.alternatives(otherLayers);
  }

  /** c as onnxruntime computes it: float32 s times float32 ln n, rounded to the logits' type. */
  private c(sValue: number, n: number): number {
    return roundTo(this.site.factorType ?? DataType.FLOAT, Math.fround(Math.fround(sValue) * Math.fround(Math.log(n))));
  }

  private sAt(g: number, s: number[] = this.s): number {
    return s[g % s.length];
  }

  private nDeclared(i: number, tq: number, tk: number, g = 0): number {
    if (this.counts) return Math.max(this.counts[g * tq + i], 1);
    return this.site.n === 'causal' ? tk - tq + i + 1 : tk;
  }

  private alternatives(otherLayers: SiteRecord[]): Hypothesis[] {
    const H = this.s.length;
    const reversed = [...this.s].reverse();
    const causal = (i: number, tq: number, tk: number): number => tk - tq + i + 1;
    const list: Hypothesis[] = [
      { name: 'the declared factor', factor: (g, i, _j, tq, tk) => this.c(this.sAt(g), this.nDeclared(i, tq, tk, g)), fits: true },
      this.site.n === 'causal'
        ? { name: 'n = Tk (keys mode) although the record says causal', factor: (g, _i, _j, _tq, tk) => this.c(this.sAt(g), tk), fits: true }
        : { name: 'causal n_i = Tk − Tq + i + 1 although the record says keys', factor: (g, i, _j, tq, tk) => this.c(this.sAt(g), causal(i, tq, tk)), fits: true },
      { name: 'n = Tq (the query length, not the key count)', factor: (g, _i, _j, tq) => this.c(this.sAt(g), tq), fits: true },
      { name: 'the factor indexed by key position j instead of row i (varies along keys)', factor: (g, _i, j, tq, tk) => this.c(this.sAt(g), this.nDeclared(j, tq, tk)), fits: true },
      { name: 'no factor (c = 1)', factor: () => 1, fits: true },
    ];
    if (H > 1 && reversed.some((v, h) => v !== this.s[h])) {
      list.push({ name: 'per-head s in reverse order', factor: (g, i, _j, tq, tk) => this.c(this.sAt(g, reversed), this.nDeclared(i, tq, tk, g)), fits: true });
    }
    for (const other of otherLayers) {
      if (other.s === undefined) continue;
      const s = Array.isArray(other.s) ? other.s : [other.s];
      if (other.layer === this.site.layer || s.join() === this.s.join()) continue;
      list.push({ name: `s of layer ${other.layer}`, factor: (g, i, _j, tq, tk) => this.c(s[g % s.length], this.nDeclared(i, tq, tk, g)), fits: true });
    }
    return list;
  }

  observe(run: string, before: OutputTensor, after: OutputTensor, masked?: OutputTensor): void {
    this.runs++;
    if (before.dims.join() !== after.dims.join()) {
      this.shapeError ??= `logits before the factor are [${before.dims.join(', ')}], after it [${after.dims.join(', ')}] (${run})`;
      return;
    }
    const r = before.dims.length;
    const tk = r >= 1 ? before.dims[r - 1] : 1;
    const tq = r >= 2 ? before.dims[r - 2] : 1;
    const blocks = tk * tq === 0 ? 0 : before.data.length / (tk * tq);
    this.counts = masked ? this.visibleCounts(run, masked, before.data.length, tk) : null;
    // Heads are axis −3 of 4-D logits; in [B·H, Tq, Tk] logits block g is head g mod H.
    const heads = r >= 4 ? before.dims[r - 3] : this.s.length > 1 ? this.s.length : 0;
    const label = (g: number, i: number): string => (heads
      ? `head ${g % heads} row ${i} (${run}, batch item ${Math.floor(g / heads)})`
      : `row ${i} (${run}, block ${g})`);
    for (let g = 0; g < blocks; g++) {
      for (let i = 0; i < tq; i++) this.observeRow(before.data, after.data, (g * tq + i) * tk, g, i, tq, tk, label);
    }
  }

  /**
   * Keys each row may see, read off the logits the Softmax receives: masks (−inf, finfo.min, −10000) leave
   * entries at or below −9000, position biases stay above. Heads broadcast over a mask view are repeated.
   */
  private visibleCounts(run: string, masked: OutputTensor, size: number, tk: number): Int32Array | null {
    if (masked.data.length !== size) {
      this.shapeError ??= `the masked logits [${masked.dims.join(', ')}] do not line up with the probed logits (${run})`;
      return null;
    }
    const counts = new Int32Array(size / tk);
    for (let row = 0; row < counts.length; row++) {
      let n = 0;
      for (let j = 0; j < tk; j++) if (masked.data[row * tk + j] > -9000) n++;
      counts[row] = n;
    }
    return counts;
  }

  private observeRow(b: ArrayLike<number>, a: ArrayLike<number>, offset: number, g: number, i: number, tq: number, tk: number,
    label: (g: number, i: number) => string): void {
    let top = -1, topAbs = 0;
    for (let j = 0; j < tk; j++) {
      const v = Math.abs(b[offset + j]);
      if (Number.isFinite(v) && v > topAbs) { topAbs = v; top = j; }
    }
    const declared = this.hypotheses[0];
    let rowFails = false;
    for (let j = 0; j < tk; j++) {
      const x = b[offset + j], y = a[offset + j];
      if (!Number.isFinite(x)) continue;
      this.entries++;
      for (const h of this.hypotheses) {
        if (!h.fits && h !== declared) continue;
        const c = h.factor(g, i, j, tq, tk);
        const expected = c * x;
        // A factor on the query makes `after` a separately rounded product: allow rounding at the row's scale.
        const ok = Math.abs(y - expected) <= this.rtol * Math.abs(expected) + ROW_EPS * Math.abs(c) * topAbs + this.floor;
        if (h === declared) {
          if (!ok) rowFails = true;
          if (Math.abs(x) >= 1e-3 * topAbs && expected !== 0) this.maxRel = Math.max(this.maxRel, Math.abs(y - expected) / Math.abs(expected));
        } else if (!ok) h.fits = false;
      }
    }
    if (rowFails) declared.fits = false;
    if (top < 0) return;
    const where = label(g, i);
    const c = declared.factor(g, i, top, tq, tk);
    const ratio = a[offset + top] / b[offset + top];
    const n = this.nDeclared(i, tq, tk, g);
    const sText = `s=${fmt(this.sAt(g))}, n=${n}`;
    let lo = ratio, hi = ratio, loJ = top, hiJ = top;
    for (let j = 0; j < tk; j++) {
      const x = b[offset + j];
      if (!(Math.abs(x) >= 1e-2 * topAbs)) continue;
      const q = a[offset + j] / x;
      if (q < lo) { lo = q; loJ = j; }
      if (q > hi) { hi = q; hiJ = j; }
    }
    const spread = (hi - lo) / Math.max(Math.abs(ratio), 1e-12);
    if (spread > 10 * this.rtol + 1e-6 && (!this.varying || spread > this.varying.score)) {
      this.varying = { score: spread, text: `${where}: ratio varies along keys from ${fmt(lo)} (key ${loJ}) to ${fmt(hi)} (key ${hiJ}), expected ${fmt(c)} for the whole row (${sText})` };
    }
    if (rowFails) {
      // Rows where both ratios are positive make the clearest example; rows with ln n = 0 the least clear.
      const score = c > 0 && ratio > 0 ? 1 + Math.abs(Math.log(ratio / c)) : 0.5;
      if (!this.worst || score > this.worst.score) this.worst = { score, text: `${where}: ratio ${fmt(ratio)} expected ${fmt(c)} (${sText})` };
    }
  }

  result(): ProbeSiteResult {
    const base = { layer: this.site.layer, n: this.site.n, s: this.site.s!, runs: this.runs, entries: this.entries, maxRelError: this.maxRel };
    const layer = `layer ${this.site.layer}`;
    if (this.shapeError) return { ...base, passed: false, message: `${layer}: ${this.shapeError}` };
    if (this.entries === 0) return { ...base, passed: false, message: `${layer}: no finite logits to check` };
    if (this.hypotheses[0].fits) return { ...base, passed: true };
    const matches = this.hypotheses.slice(1).filter((h) => h.fits).map((h) => h.name);
    const example = this.varying?.text ?? this.worst?.text ?? 'mismatch';
    const pattern = matches.length ? `matches ${matches.join(' or ')}`
      : this.varying ? 'the factor varies along keys: it must be constant within a row (a [Tq,1] column, not a [1,Tk] row)'
        : 'no simple wiring error matches';
    return { ...base, passed: false, matches, message: `${layer} ${example}; ${pattern}` };
  }
}

function roundTo(type: number, f: number): number {
  if (type === DataType.FLOAT16) return float16ToNumber(float32ToFloat16Bits(f));
  return type === DataType.BFLOAT16 ? bfloat16ToNumber(float32ToBfloat16Bits(f)) : f;
}

function fmt(x: number): string {
  if (!Number.isFinite(x) || x === 0) return String(x);
  return Math.abs(x) >= 1e-3 && Math.abs(x) < 1e4 ? x.toFixed(Math.abs(x) >= 100 ? 1 : 3) : x.toExponential(2);
}
