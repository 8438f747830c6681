/**
 * The search for one slope s: the statistic at n ≈ N with slope s must equal its value at n ≈ L (the target).
 * How the statistic grows with s differs by model: on trained models it is about linear in s, on random weights
 * its largest probability grows as e^gap, where the gap (`gapOf`: the logit by which one key would have to stand
 * out over the other n − 1 to give the statistic) is linear. So each step interpolates in a blend of the two,
 * value and gap space (each scaled to run from 0 at the original to 1 at the target), weighted so that the last
 * three points lie on a line; two points only: value space, whose secant overshoots a convex curve and so
 * brackets the root at once. The first s is the gap model's prediction from the original's run alone
 * (`predictSlope`); then secants until the root is bracketed, then false position with the Illinois rule (a
 * bisection whose new point is the secant's: superlinear on a smooth curve, never leaving the bracket). Each
 * group (the model, a layer or a head) has its own search; all groups are measured by the same run.
 */
import { MatchStatistic, SearchState } from './report';

/** Relative residual |statistic − target| / |target| at which a group's s counts as found. */
export const TOLERANCE = 0.005;

/** A bracket narrower than this share of its upper end ends the search as well. */
const WIDTH = 1e-3;

/** A measured s and its statistic. */
export interface Point { s: number; value: number }

/**
 * The gap x of the one-key model at n keys: one logit x above n − 1 equal others. Its largest probability is
 * e^x / (e^x + n − 1), so x = ln((n − 1)·p / (1 − p)); its entropy falls monotonically in x ≥ 0 from ln n, so x is
 * found by bisection. Monotone in the statistic (increasing for the largest probability, decreasing for entropy),
 * so a root in gap space is the root of the statistic.
 */
export function gapOf(match: MatchStatistic, value: number, n: number): number {
  if (match === 'max-prob') {
    const p = Math.min(Math.max(value, 1e-12), 1 - 1e-12);
    return Math.log(((n - 1) * p) / (1 - p));
  }
  const ln = Math.log(n);
  // An entropy above ln n (rows in the window see a few keys fewer than n): the gap continues below 0.
  if (value >= ln) return ln - value;
  let lo = 0, hi = 60 + ln;
  for (let k = 0; k < 60; k++) {
    const mid = (lo + hi) / 2;
    if (oneKeyEntropy(mid, n) > value) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

function oneKeyEntropy(x: number, n: number): number {
  // p = e^x / Z for the one key, q = 1 / Z for each of the others, Z = e^x + n − 1; H = ln Z − x·p.
  const lnZ = x + Math.log1p((n - 1) * Math.exp(-x));
  return lnZ - x * Math.exp(x - lnZ);
}

/**
 * The s the gap model predicts from the original alone: the gap at N scales with the factor c, so
 * c = gap(target) / gap(original at N), and s = (c − 1) / ln(N / L). `fallback` (1/ln L) where the original's gap
 * gives no prediction (not positive, or a c ≤ 1).
 */
export function predictSlope(gapTarget: number, gapOriginal: number, L: number, N: number, fallback: number, max: number): number {
  const c = gapTarget / gapOriginal;
  if (!(gapOriginal > 0) || !Number.isFinite(c) || c <= 1) return fallback;
  return Math.min(max, (c - 1) / Math.log(N / L));
}

export class SlopeSearch {
  private lo: Point;
  private hi?: Point;
  /** Illinois: the f of an end kept twice in a row is halved (each time again). */
  private loScale = 1;
  private hiScale = 1;
  private lastSide = 0;
  readonly points: Point[] = [];
  state: SearchState = 'searching';
  private readonly gap0: number;
  private readonly gapSpan: number;

  /**
   * `target`: the statistic to reach; `original`: the statistic at s = 0; `gap`: the statistic in gap space
   * (increasing as attention sharpens); `first`: the first s tried; `max`: the largest s tried before the search
   * gives up (the target out of reach).
   */
  constructor(
    readonly target: number, private readonly original: number, private readonly gap: (value: number) => number,
    private readonly first: number, private readonly max: number,
  ) {
    this.lo = { s: 0, value: original };
    this.points.push(this.lo);
    this.gap0 = gap(original);
    this.gapSpan = gap(target) - this.gap0;
    if (!(this.gapSpan > 0)) this.state = 'no fade';
    else this.settle(this.lo);
  }

  /** The next s to measure; the found s (or the best measured one) once the search is over. */
  next(): number {
    if (this.state !== 'searching') return this.best().s;
    const f = this.space();
    if (!this.hi) return this.grow(f);
    const { lo, hi } = this;
    const flo = this.loScale * f(lo), fhi = this.hiScale * f(hi);
    return lo.s - (flo * (hi.s - lo.s)) / (fhi - flo);
  }

  /** A measurement; the group's later ones (while others still search) are not its search's. */
  observe(s: number, value: number): void {
    if (this.state !== 'searching') return;
    const p = { s, value };
    this.points.push(p);
    if (this.valueShare(p) < 1) {
      if (this.lastSide === -1) this.hiScale /= 2;
      this.lo = p;
      this.loScale = 1;
      this.lastSide = -1;
    } else {
      if (this.lastSide === 1) this.loScale /= 2;
      this.hi = p;
      this.hiScale = 1;
      this.lastSide = 1;
    }
    this.settle(p);
  }

  /** Ends the search unreached: the caller knows no s can reach the target. */
  giveUp(): void {
    if (this.state === 'searching') this.state = 'out of reach';
  }

  /** The measured point closest to the target. */
  best(): Point {
    if (this.state === 'no fade') return this.points[0];
    return this.points.reduce((a, b) => (this.residualOf(b) < this.residualOf(a) ? b : a));
  }

  /**
   * The s to write: the best measured; 0 where the original does not fade; `fallback` where no s reaches the
   * target (attention close to uniform, which no factor sharpens: the largest s tried would only amplify noise).
   */
  result(fallback: number): number {
    return this.state === 'out of reach' ? fallback : this.best().s;
  }

  /** |statistic − target| / |target| of the best point. */
  residual(): number {
    return this.residualOf(this.best());
  }

  /** The share of the way from the original to the target, in value space and in gap space (1 at the target). */
  private valueShare(p: Point): number {
    return (p.value - this.original) / (this.target - this.original);
  }

  private gapShare(p: Point): number {
    return (this.gap(p.value) - this.gap0) / this.gapSpan;
  }

  /**
   * f(p) = share − 1 in the blend w·gap + (1 − w)·value, w making the last three points collinear (its nearer end
   * where no blend does), w = 0 with fewer points.
   */
  private space(): (p: Point) => number {
    const w = this.points.length < 3 ? 0 : blendWeight(this.points.slice(-3), (p) => this.valueShare(p), (p) => this.gapShare(p));
    return (p) => w * this.gapShare(p) + (1 - w) * this.valueShare(p) - 1;
  }

  private residualOf(p: Point): number {
    return Math.abs(p.value - this.target) / Math.abs(this.target);
  }

  private settle(p: Point): void {
    if (this.residualOf(p) <= TOLERANCE) this.state = 'found';
    else if (this.hi && this.hi.s - this.lo.s <= WIDTH * this.hi.s) this.state = 'found';
    else if (!this.hi && p.s >= this.max) this.state = 'out of reach';
  }

  /**
   * No s reaches the target yet: the first s, then the secant through the last two points, kept between 1.05× and
   * 4× the last s (a secant from points far below the root can still fall short, or shoot far beyond it); a
   * secant beyond the largest s goes there at once, which either brackets the root or shows it out of reach.
   */
  private grow(f: (p: Point) => number): number {
    const last = this.points[this.points.length - 1];
    if (last.s === 0) return this.first;
    const prev = this.points[this.points.length - 2];
    const slope = (f(last) - f(prev)) / (last.s - prev.s);
    const secant = slope > 0 ? last.s - f(last) / slope : Infinity;
    if (secant >= this.max) return this.max;
    return Math.max(1.05 * last.s, Math.min(4 * last.s, secant));
  }
}

/**
 * The weight w in [0, 1] of space b in the blend w·b + (1 − w)·a along which three points are collinear: the
 * blend's change of slope, linear in w, is zero there.
 */
function blendWeight(points: Point[], a: (p: Point) => number, b: (p: Point) => number): number {
  const [p, q, r] = [...points].sort((x, y) => x.s - y.s);
  const bend = (h: (p: Point) => number): number => (h(r) - h(q)) / (r.s - q.s) - (h(q) - h(p)) / (q.s - p.s);
  const ka = bend(a), kb = bend(b);
  if (!Number.isFinite(ka) || !Number.isFinite(kb)) return 0;
  if (ka === kb) return Math.abs(ka) <= Math.abs(kb) ? 0 : 1;
  return Math.min(1, Math.max(0, ka / (ka - kb)));
}
