/**
 * The search for one slope s: f(s) = the statistic at n ≈ N with slope s, minus its value at n ≈ L (sign turned
 * for entropy, so f grows with s). f(0) is the original model, whose attention fades (f(0) < 0); the search
 * brackets the root by growing s, then narrows the bracket by false position with the Illinois rule (a
 * bisection whose new point is the secant's: superlinear on a smooth f, never leaving the bracket).
 * Each group (the model, a layer or a head) has its own search; all groups are measured by the same run.
 */

/** Relative residual |f| / |target| at which a group's s counts as found. */
export const TOLERANCE = 0.005;

/** A bracket narrower than this share of its upper end ends the search as well. */
const WIDTH = 1e-3;

export interface Point { s: number; f: number }

export type SearchState = 'searching' | 'found' | 'no fade' | 'out of reach';

export class SlopeSearch {
  private lo: Point;
  private hi?: Point;
  /** Which end the last two points replaced (Illinois: an end kept twice has its f halved). */
  private lastSide = 0;
  readonly points: Point[] = [];
  state: SearchState = 'searching';

  /**
   * `f0`: f at s = 0, the original; `first`: the first s tried (1/ln L); `max`: the largest s tried before the
   * search gives up (the target out of reach).
   */
  constructor(readonly target: number, f0: number, private readonly first: number, private readonly max: number) {
    this.lo = { s: 0, f: f0 };
    this.points.push(this.lo);
    if (f0 >= 0) this.state = 'no fade';
    else this.settle(this.lo);
  }

  /** The next s to measure; the found s (or the best measured one) once the search is over. */
  next(): number {
    if (this.state !== 'searching') return this.best().s;
    if (!this.hi) return this.grow();
    const { lo, hi } = this;
    return lo.s - (lo.f * (hi.s - lo.s)) / (hi.f - lo.f);
  }

  /** A measurement; the group's later ones (while others still search) are not its search's. */
  observe(p: Point): void {
    if (this.state !== 'searching') return;
    this.points.push(p);
    if (p.f < 0) {
      if (this.lastSide === -1 && this.hi) this.hi = { ...this.hi, f: this.hi.f / 2 };
      this.lo = p;
      this.lastSide = -1;
    } else {
      if (this.lastSide === 1) this.lo = { ...this.lo, f: this.lo.f / 2 };
      this.hi = p;
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
    return this.points.reduce((a, b) => (Math.abs(b.f) < Math.abs(a.f) ? b : a));
  }

  /**
   * The s to write: the best measured; 0 where the original does not fade; `fallback` where no s reaches the
   * target (attention close to uniform, which no factor sharpens: the largest s tried would only amplify noise).
   */
  result(fallback: number): number {
    return this.state === 'out of reach' ? fallback : this.best().s;
  }

  /** |f| / |target| of the best point. */
  residual(): number {
    return Math.abs(this.best().f) / Math.abs(this.target);
  }

  private settle(p: Point): void {
    if (Math.abs(p.f) <= TOLERANCE * Math.abs(this.target)) this.state = 'found';
    else if (this.hi && this.hi.s - this.lo.s <= WIDTH * this.hi.s) this.state = 'found';
    else if (!this.hi && p.s >= this.max) this.state = 'out of reach';
  }

  /**
   * No s reaches the target yet: the secant through the last two points, kept between 1.5× and 4× the last s
   * (f is rarely linear in s so far from the root), or the first s.
   */
  private grow(): number {
    const last = this.points[this.points.length - 1];
    if (last.s === 0) return this.first;
    const prev = this.points[this.points.length - 2];
    const slope = (last.f - prev.f) / (last.s - prev.s);
    const secant = slope > 0 ? last.s - last.f / slope : Infinity;
    return Math.min(this.max, Math.max(1.5 * last.s, Math.min(4 * last.s, secant)));
  }
}
