/**
 * The semantic probe of one site: what the factor multiplied (logits before it, or a fused operator's query
 * before it) against what the model computes with (after), over every run:
 *
 *   after[b,h,i,j] = c(b,h,i) · (before[b,h,i,j] + prior(b,h,i,j))
 *
 * with c from the preset's own formula (factorValue), s of head h as the model's initializer holds it, and n of
 * batch item b and row i from the site's n mode (keys: n = Tk; causal: n_i = Tk − Tq + i + 1, also with a
 * cache; modes counted from masks: the keys the row's Softmax input leaves visible; fused operators: the n plan
 * of the operator's inputs). `prior` is the positional prior B the patch adds (BAM's formula with θ as the model
 * holds it); a prior added to a fused operator's bias is probed as after = before + c·B (preset none, prior c·B).
 * Entries are compared as after ≈ c·before, never by dividing, so logits near 0 cannot produce a false ratio.
 * When a site fails, the probe names the wiring its numbers do match: the other n mode, n = Tq, 2n, n + 1,
 * per-head s reversed, the factor indexed by key, another layer's s, the factor applied twice, or no factor.
 */
import { factorValue, Preset } from '../policy/factor';

export interface ProbeSiteResult {
  layer: number;
  /** The graph the site is in, when not the main graph. */
  scope?: string;
  /** How messages name the site. */
  site: string;
  n: string;
  s: number | number[];
  runs: number;
  entries: number;
  /** Largest relative error of after against c·before, over entries not near 0. */
  maxRelError: number;
  /**
   * Largest |after − c·before| over |c| times the row's largest |before|: the error on the row's scale, which the
   * rounding of a float16 entry near 0 cannot inflate as it inflates a relative error.
   */
  maxScaledError: number;
  passed: boolean;
  /** One line saying what is wrong, with an example row. */
  message?: string;
  /** The wirings the numbers match instead, when the site fails. */
  matches?: string[];
  /** This result is of the site's positional prior (after its Add = before + c·B), not of its factor. */
  prior?: boolean;
  /** This result is of the site's sliding window (after its Add = before + its bias), not of its factor. */
  window?: boolean;
  /** Rows not probed: the original's logits there hold NaN or +Inf, so its attention row is NaN and sees no n. */
  rowsWithoutN?: number;
}

/** One run's tensors of a site arranged as blocks × rows × cols (index (g·rows + i)·cols + j). */
export interface ProbeView {
  run: string;
  blocks: number;
  rows: number;
  cols: number;
  before: ArrayLike<number>;
  after: ArrayLike<number>;
  /** The head of block g (0 when heads are not in view). */
  head(g: number): number;
  /** n of (block, local row) as the site's n mode defines it. */
  n(g: number, i: number): number;
  /** Other n the patch might have computed instead, for naming what a failing site matches. */
  alternatives: { name: string; n(g: number, i: number): number }[];
  /** cols index keys (logits), so a factor laid along them can be named; otherwise the head dimension. */
  colsAreKeys: boolean;
  /** How a block is named in messages (`head 3`, or `block 2` when heads are out of view). */
  where(g: number, i: number): string;
  /** The query's absolute position (past length + row) of block g's row i, where a prior needs it. */
  pos?(g: number, i: number): number;
}

interface Hypothesis {
  name: string;
  /** Factor for block g, local row i, column j. */
  factor: (v: ProbeView, g: number, i: number, j: number) => number;
  fits: boolean;
}

interface RowFailure {
  score: number;
  text: string;
}

export interface ProbeSubject {
  layer: number;
  scope?: string;
  label: string;
  n: string;
  s: number[];
  /** An additive term the patch adds to the logits before its factor, per block, row and key of a view. */
  prior?: (v: ProbeView, g: number, i: number, j: number) => number;
  /**
   * The subject is an Add (after = before + prior): a positional prior's (c·B) or a sliding window's bias. Failures
   * are described by what was added, `expected` naming the term and `from` what it was recomputed from.
   */
  additive?: { kind: 'prior' | 'window'; expected: string; from: string };
}

/** Collects a site's tensors over every run, then judges them. */
export class SiteProbe {
  private readonly hypotheses: Hypothesis[];
  private runs = 0;
  private entries = 0;
  private rowsWithoutN = 0;
  private maxRel = 0;
  private maxScaled = 0;
  private worst: RowFailure | null = null;
  private varying: RowFailure | null = null;
  private problem: string | null = null;
  /** Alternative n offered by some run, and those a run ruled out: named only when every run that offered them fits. */
  private readonly tried = new Set<string>();
  private readonly rejected = new Set<string>();
  /** rtol: one rounding of an entry; rowEps: of a dot product, relative to its row's largest entry (a factor on the query is a separately rounded product). */
  private tol = { rtol: 1e-5, rowEps: 1e-6 };

  constructor(private readonly subject: ProbeSubject, private readonly preset: Preset, others: { layer: number; s: number[] }[] = []) {
    this.hypotheses = this.alternatives(others);
  }

  get label(): string {
    return this.subject.label;
  }

  /** The rounding the observed tensors' type allows (known once the probe copy is built). */
  setTolerance(t: { rtol: number; rowEps: number }): void {
    this.tol = t;
  }

  private c(h: number, n: number, s: number[] = this.subject.s): number {
    return factorValue(this.preset, s[h % s.length], n);
  }

  private alternatives(others: { layer: number; s: number[] }[]): Hypothesis[] {
    const s = this.subject.s;
    const reversed = [...s].reverse();
    const declared = (v: ProbeView, g: number, i: number): number => this.c(v.head(g), v.n(g, i));
    const list: Hypothesis[] = [
      { name: 'the declared factor', factor: declared, fits: true },
      { name: 'the factor indexed by key position j instead of row i (varies along keys)',
        factor: (v, g, _i, j) => (v.colsAreKeys ? this.c(v.head(g), v.n(g, j)) : NaN), fits: true },
      { name: 'no factor (c = 1)', factor: () => 1, fits: true },
      { name: 'the factor applied twice', factor: (v, g, i) => declared(v, g, i) ** 2, fits: true },
    ];
    if (reversed.some((x, h) => x !== s[h])) {
      list.push({ name: 'per-head s in reverse order', factor: (v, g, i) => this.c(v.head(g), v.n(g, i), reversed), fits: true });
    }
    for (const other of others) {
      if (other.layer === this.subject.layer || other.s.join() === s.join()) continue;
      list.push({ name: `s of layer ${other.layer}`, factor: (v, g, i) => this.c(v.head(g), v.n(g, i), other.s), fits: true });
    }
    return list;
  }

  /** Records a problem that fails the site whatever its numbers (a shape mismatch, a missing tensor). */
  fail(problem: string): void {
    this.problem ??= problem;
  }

  observe(v: ProbeView): void {
    this.runs++;
    if (v.before.length !== v.after.length) {
      this.fail(`the tensors before and after the factor differ in size (${v.run})`);
      return;
    }
    const named = v.alternatives.map((a): Hypothesis => ({ name: a.name, factor: (w, g, i) => this.c(w.head(g), a.n(g, i)), fits: true }));
    const all = [...this.hypotheses, ...named];
    for (let g = 0; g < v.blocks; g++) for (let i = 0; i < v.rows; i++) this.observeRow(v, g, i, all);
    for (const h of named) {
      this.tried.add(h.name);
      if (!h.fits) this.rejected.add(h.name);
    }
  }

  private observeRow(v: ProbeView, g: number, i: number, hypotheses: Hypothesis[]): void {
    const n = v.n(g, i);
    // A row whose logits hold NaN or +Inf in the original (a 0 mask divided into them) is NaN after its Softmax there.
    if (Number.isNaN(n)) {
      this.rowsWithoutN++;
      return;
    }
    // A row without a key to attend to (an empty cache) has no attention for a factor to change.
    if (!(n >= 1)) return;
    const offset = (g * v.rows + i) * v.cols;
    const b = v.before, a = v.after;
    const prior = this.subject.prior;
    const base = (j: number): number => (prior ? b[offset + j] + prior(v, g, i, j) : b[offset + j]);
    let top = -1, topAbs = 0;
    for (let j = 0; j < v.cols; j++) {
      const x = Math.abs(base(j));
      if (Number.isFinite(x) && x > topAbs) { topAbs = x; top = j; }
    }
    const declared = hypotheses[0];
    let rowFails = false;
    for (let j = 0; j < v.cols; j++) {
      const x = base(j), y = a[offset + j];
      if (!Number.isFinite(x)) continue;
      this.entries++;
      // Each term carries its own rounding: a sum that cancels keeps the error of its larger term.
      const magnitude = prior ? Math.abs(b[offset + j]) + Math.abs(x - b[offset + j]) : Math.abs(x);
      for (const h of hypotheses) {
        if (!h.fits && h !== declared) continue;
        const c = h.factor(v, g, i, j);
        const expected = c * x;
        const ok = Math.abs(y - expected) <= this.tol.rtol * Math.abs(c) * magnitude + this.tol.rowEps * Math.abs(c) * topAbs + 1e-30;
        if (h === declared) {
          if (!ok) rowFails = true;
          if (!ok && this.subject.additive) this.describeAddition(v, g, i, j, y - b[offset + j], x - b[offset + j]);
          const rel = Math.abs(y - expected) / Math.abs(expected);
          if (Math.abs(x) >= 1e-3 * topAbs && expected !== 0 && Number.isFinite(y)) this.maxRel = Math.max(this.maxRel, rel);
          if (topAbs > 0 && c !== 0 && Number.isFinite(y)) this.maxScaled = Math.max(this.maxScaled, Math.abs(y - expected) / (Math.abs(c) * topAbs));
        } else if (!ok) h.fits = false;
      }
    }
    if (rowFails) declared.fits = false;
    if (top >= 0 && !this.subject.additive) this.describeRow(v, g, i, top, topAbs, rowFails, base);
  }

  private describeAddition(v: ProbeView, g: number, i: number, j: number, added: number, expected: number): void {
    const score = Math.abs(added - expected) / Math.max(Math.abs(expected), 1e-12);
    if (this.worst && score <= this.worst.score) return;
    const d = v.pos ? `, d = j − i = ${j - v.pos(g, i)}` : '';
    const a = this.subject.additive!;
    this.worst = { score, text: `${v.where(g, i)} key ${j}: the ${a.kind} added ${fmt(added)}, expected ${a.expected} = ${fmt(expected)} (n = ${v.n(g, i)}${d})` };
  }

  private describeRow(v: ProbeView, g: number, i: number, top: number, topAbs: number, rowFails: boolean, base: (j: number) => number): void {
    const offset = (g * v.rows + i) * v.cols;
    const where = v.where(g, i);
    const c = this.c(v.head(g), v.n(g, i));
    const ratio = v.after[offset + top] / base(top);
    const sText = `s=${fmt(this.subject.s[v.head(g) % this.subject.s.length])}, n=${v.n(g, i)}`;
    let lo = ratio, hi = ratio, loJ = top, hiJ = top;
    for (let j = 0; j < v.cols; j++) {
      const x = base(j);
      if (!(Math.abs(x) >= 1e-2 * topAbs)) continue;
      const q = v.after[offset + j] / x;
      if (q < lo) { lo = q; loJ = j; }
      if (q > hi) { hi = q; hiJ = j; }
    }
    const along = v.colsAreKeys ? 'key' : 'column';
    const spread = (hi - lo) / Math.max(Math.abs(ratio), 1e-12);
    if (spread > 10 * this.tol.rtol + 1e-6 && (!this.varying || spread > this.varying.score)) {
      this.varying = { score: spread, text: `${where}: ratio varies along ${along}s from ${fmt(lo)} (${along} ${loJ}) to ${fmt(hi)} (${along} ${hiJ}), expected ${fmt(c)} for the whole row (${sText})` };
    }
    if (rowFails) {
      // Rows where both ratios are positive make the clearest example; rows with ln n = 0 the least clear.
      const score = c > 0 && ratio > 0 ? 1 + Math.abs(Math.log(ratio / c)) : 0.5;
      if (!this.worst || score > this.worst.score) this.worst = { score, text: `${where}: ratio ${fmt(ratio)} expected ${fmt(c)} (${sText})` };
    }
  }

  result(): ProbeSiteResult {
    const { layer, scope, label, n } = this.subject;
    const s = this.subject.s.length === 1 ? this.subject.s[0] : this.subject.s;
    const base = { layer, ...(scope && scope !== 'main' ? { scope } : {}), site: label, n, s, runs: this.runs, entries: this.entries, maxRelError: this.maxRel,
      maxScaledError: this.maxScaled,
      ...(this.subject.additive ? { [this.subject.additive.kind]: true } : {}), ...(this.rowsWithoutN ? { rowsWithoutN: this.rowsWithoutN } : {}) };
    if (this.problem) return { ...base, passed: false, message: `${label}: ${this.problem}` };
    if (this.entries === 0) return { ...base, passed: false, message: `${label}: no finite values to check` };
    if (this.hypotheses[0].fits) return { ...base, passed: true };
    const alternatives = [...this.tried].filter((name) => !this.rejected.has(name));
    const matches = [...alternatives, ...this.hypotheses.slice(1).filter((h) => h.fits).map((h) => h.name)];
    if (this.subject.additive) return { ...base, passed: false, message: `${label}: ${this.worst?.text ?? 'mismatch'}; ${this.subject.additive.expected} recomputed from ${this.subject.additive.from}` };
    const example = this.varying?.text ?? this.worst?.text ?? 'mismatch';
    const pattern = matches.length ? `matches ${matches.join(' or ')}`
      : this.varying ? 'the factor varies along a row: it must be constant within a row (a [Tq,1] column, not a [1,Tk] row)'
        : 'no simple wiring error matches';
    return { ...base, passed: false, matches, message: `${label} ${example}; ${pattern}` };
  }
}

export function fmt(x: number): string {
  if (!Number.isFinite(x) || x === 0) return String(x);
  return Math.abs(x) >= 1e-3 && Math.abs(x) < 1e4 ? x.toFixed(Math.abs(x) >= 100 ? 1 : 3) : x.toExponential(2);
}
