/**
 * `calibrate --match loss`: the slope's s chosen to minimise the model's own next-token loss past L on the user's
 * token ids, the tokens themselves being the only labels. One run of N tokens per candidate s scores every row
 * past L at once (row t predicts token t + 1 from t + 1 keys). The search (LossSearch) starts from the original
 * (s = 0) and s = 1/ln L, doubles s while the loss falls, then narrows the bracket around the lowest loss by golden
 * section. The s written is the best one measured, never an interpolated one.
 */
import { InputError, opt } from '../errors';
import { OutputTensor } from '../verify/run';
import { HostTensor } from '../verify/tensors';

/** One s measured: the mean loss (nats per token) of the rows past L, and per span of keys seen. */
export interface LossPoint { s: number; loss: number; spans: number[] }

/** The spans of keys seen (t + 1) the loss is reported in: (L, 2L], (2L, 4L], …, the last ending at N − 1. */
export function lossSpans(L: number, N: number): [number, number][] {
  const out: [number, number][] = [];
  for (let hi = 2 * L; hi / 2 < N - 1; hi *= 2) out.push([hi / 2 + 1, Math.min(hi, N - 1)]);
  return out;
}

/**
 * Mean cross entropy (nats) of token t + 1 under the logits of row t, over rows whose keys seen t + 1 fall in
 * (L, N − 1] and over the batch, and the same per span. `logits` is [B, T, V]; `ids` [B, ≥ T] the tokens fed.
 */
export function nextTokenLoss(logits: OutputTensor, ids: HostTensor, L: number, spans: [number, number][]): { loss: number; spans: number[] } {
  const [B, T, V] = logits.dims;
  const width = ids.dims[1];
  const sums = spans.map(() => 0), counts = spans.map(() => 0);
  let sum = 0, count = 0;
  for (let b = 0; b < B; b++) {
    for (let t = L; t < T - 1; t++) {
      const nll = rowLoss(logits.data, (b * T + t) * V, V, Number(ids.data[b * width + t + 1]));
      sum += nll;
      count++;
      const k = spans.findIndex(([lo, hi]) => t + 1 >= lo && t + 1 <= hi);
      if (k >= 0) { sums[k] += nll; counts[k]++; }
    }
  }
  return { loss: sum / count, spans: sums.map((x, k) => x / counts[k]) };
}

/**
 * −ln softmax(row)[target] of the row of V logits at `base`. Its own function: called once a row, it is compiled
 * after a few rows; the same loops inside nextTokenLoss, called once a run, ran unoptimised through most of a search (4× the time).
 */
function rowLoss(data: Float32Array | Float64Array, base: number, V: number, target: number): number {
  let max = -Infinity;
  for (let k = base; k < base + V; k++) if (data[k] > max) max = data[k];
  let z = 0;
  for (let k = base; k < base + V; k++) z += Math.exp(data[k] - max);
  return Math.log(z) + max - data[base + target];
}

/**
 * The model's logits: the one output of shape [B, T, V] (V ≥ 2) in floating point, or the one of those named
 * `logits`. Anything else is refused: the loss needs to know which output predicts the next token.
 */
export function findLogits(outputs: Record<string, OutputTensor>, batch: number, seq: number): string {
  const fits = Object.entries(outputs)
    .filter(([, t]) => t.dims.length === 3 && t.dims[0] === batch && t.dims[1] === seq && t.dims[2] >= 2).map(([name]) => name);
  if (fits.length === 1) return fits[0];
  const named = fits.filter((n) => n === 'logits');
  if (named.length === 1) return named[0];
  const shapes = Object.entries(outputs).map(([n, t]) => `${n} [${t.dims.join(', ')}]`).join(', ');
  throw new InputError(fits.length === 0
    ? `${opt('match', 'loss')} needs next-token logits [batch, T, vocabulary] as an output; the model's outputs at T = ${seq} are ${shapes}`
    : `${opt('match', 'loss')}: ${fits.length} outputs are [batch, T, V] (${fits.join(', ')}) and none is named 'logits': which one predicts the next token is unknown`, 'cannot-verify');
}

/**
 * The bracket (a share of the best s, or of first) within which the parabola's promise is trusted. Wider, a curve
 * steeper on one side than the other misleads it; 0.75 keeps the loss of the LM benchmark's 16 curves (2 models × 8
 * held-out files, s on a grid of 0.025) within 0.44 % of the grid's best in 4.2 runs on average (0.5: 5.0 runs
 * before the vertex rule for a best at the largest s, against 4.6 at 0.75).
 */
const NARROW = 0.75;

export type LossState = 'found' | 'no gain' | 'out of reach' | 'searching';

/**
 * The search for the s of lowest loss in [0, max]. Its points are kept sorted by s; the bracket is the best point
 * and its neighbours. After s = 0 and `first` comes first / 2, so a parabola fits from the third run (the loss-
 * optimal s of the LM benchmark's models lies below 1/ln L more often than above). While the best is the largest s
 * measured, s doubles (a minimum further out), unless the parabola through the last three points turns up between
 * the last two (the minimum is behind the best: it goes there). Then each step goes to the vertex of the parabola
 * through the bracket (successive parabolic interpolation), or to the golden-section point of the bracket's wider
 * side where the vertex is outside it or too near a point measured. It ends when the bracket is narrower than `width`, or
 * narrower than NARROW of the best s (or of first) with the parabola promising less than `gain` (relative) below
 * the best loss.
 */
export class LossSearch {
  readonly points: LossPoint[] = [];

  /**
   * `first`: the s tried after the original (1/ln L); `width`: the bracket at which the search ends; `gain`: the
   * relative improvement the parabola must promise for another run.
   */
  constructor(private readonly first: number, private readonly max: number, private readonly width: number, private readonly gain = 2e-3) {}

  observe(p: LossPoint): void {
    this.points.push(p);
    this.points.sort((a, b) => a.s - b.s);
  }

  best(): LossPoint {
    return this.points.reduce((a, b) => (b.loss < a.loss ? b : a));
  }

  /** The next s to measure, or undefined when the search has ended (see the class). */
  next(): number | undefined {
    const p = this.points, k = p.indexOf(this.best());
    if (p.length === 2 && p[0].s === 0 && p[1].s === this.first) return this.first / 2;
    if (k === p.length - 1) {
      const s = p[k].s;
      if (s >= this.max) return undefined;
      if (s === 0) return this.first;
      // The parabola through the last three turns up between the last two: the minimum lies behind the best, not beyond.
      const turn = p.length >= 3 ? parabolaMin(p.slice(-3), p[k - 1].s, s) : undefined;
      const gap = s - p[k - 1].s;
      if (turn && turn.s > p[k - 1].s + 0.05 * gap && turn.s < s - 0.05 * gap) return turn.s;
      return Math.min(this.max, 2 * s);
    }
    const lo = p[Math.max(0, k - 1)], b = p[k], hi = p[k + 1];
    if (hi.s - lo.s <= this.width) return undefined;
    // Three points around the best (the best at s = 0 has both its neighbours on the right).
    const three = k > 0 ? [lo, b, hi] : p.length >= 3 ? [b, hi, p[2]] : undefined;
    const vertex = three && parabolaMin(three, lo.s, hi.s);
    // A parabola over a wide bracket misjudges a curve steeper on one side: its promise counts once the bracket is narrow.
    if (vertex && hi.s - lo.s <= NARROW * Math.max(b.s, this.first) && b.loss - vertex.loss <= this.gain * b.loss) return undefined;
    const near = (x: number): boolean => p.some((q) => Math.abs(q.s - x) < 0.05 * (hi.s - lo.s));
    if (vertex && !near(vertex.s)) return vertex.s;
    // The golden-section point of the wider side: 0.382 of the way from the best into it.
    const golden = 0.381966;
    return hi.s - b.s >= b.s - lo.s ? b.s + golden * (hi.s - b.s) : b.s - golden * (b.s - lo.s);
  }

  state(): LossState {
    const best = this.best();
    if (this.next() !== undefined) return 'searching';
    if (best === this.points[this.points.length - 1] && best.s >= this.max) return 'out of reach';
    return best.s === 0 ? 'no gain' : 'found';
  }
}

/** The lowest point in [from, to] of the parabola through three points (an end of the span where it opens downward). */
function parabolaMin([a, b, c]: LossPoint[], from: number, to: number): { s: number; loss: number } {
  // Newton's divided differences: q(x) = a + d1·(x − a.s) + d2·(x − a.s)(x − b.s).
  const d1 = (b.loss - a.loss) / (b.s - a.s);
  const d2 = ((c.loss - b.loss) / (c.s - b.s) - d1) / (c.s - a.s);
  const q = (x: number): number => a.loss + d1 * (x - a.s) + d2 * (x - a.s) * (x - b.s);
  const candidates = [from, to];
  if (d2 > 0) candidates.push(Math.min(to, Math.max(from, (a.s + b.s) / 2 - d1 / (2 * d2))));
  return candidates.map((s) => ({ s, loss: q(s) })).reduce((x, y) => (y.loss < x.loss ? y : x));
}
