/**
 * Attention sharpness: the largest probability of each attention row, averaged over rows, heads, batch and
 * layers, for the original and the patched model at each context length. Plain softmax fades as n grows (the
 * largest probability tends to 0); the SSMax factor grows with ln n and must keep the patched curve from
 * falling the way the original's does.
 */
import { OutputTensor } from './run';
import { ROW_SAMPLE } from './row-max';

export interface SharpnessPoint {
  length: number;
  original: number;
  patched: number;
  /** Per layer, in layer order. */
  originalLayers: number[];
  patchedLayers: number[];
}

export interface SharpnessCurve {
  trainLen: number;
  /** Rows averaged per head and layer: the last quarter of the rows, at most this many. */
  rows: number;
  points: SharpnessPoint[];
  /** ln(first/last) of each curve: how much it falls over the tested lengths. */
  originalFall: number;
  patchedFall: number;
  /** originalFall − patchedFall: how much more of its sharpness the patched model keeps (ln units). */
  kept: number;
}

/**
 * Minimum `kept` for the check to pass: the patched curve must keep at least 1 % more of its sharpness than the
 * original's. Small on purpose: near-uniform attention (random weights) leaves SSMax little to act on, while a
 * factor that does not grow with n keeps exactly as much as the original.
 */
export const MIN_KEPT = Math.log(1.01);

/**
 * Attention whose mean largest probability over the sampled rows (the last quarter, whose rows see 3/4 to all of
 * the n keys) is at most this many times 1/n is uniform: its logits are near 0 and no factor changes it.
 */
const UNIFORM = 1.25;

export function isUniform(meanMax: number, n: number): boolean {
  return meanMax * n <= UNIFORM;
}

/**
 * A row's largest probability p within this share of 1/m (m ≤ TIED_KEYS) counts as a tie among m keys: ties of
 * logits in the thousands (all-equal weights) differ in float32 by about 1e-3, which moves p by about 0.1 %.
 */
const TIE = 5e-3;
const TIED_KEYS = 16;

/**
 * Every sampled row's largest probability is 1/m for a whole m ≤ TIED_KEYS, taken as each row spread evenly over m
 * keys whose logits tie, the rest at 0 (one-hot at m = 1; a model whose weights make the keys equal). A factor c ≥ 1
 * keeps such a row as it is (its largest probability grows with c unless all its mass is on tied keys), so no factor
 * changes it. Read from the original alone, so a dead patch cannot make a model look tied; over many rows and heads
 * a trained model's maxima do not all fall within 0.5 % of such fractions.
 */
export function isTied(rowMaxima: readonly OutputTensor[]): boolean {
  const values = rowMaxima.flatMap((t) => Array.from(t.data));
  return values.length > 0 && values.every((p) => {
    const m = Math.round(1 / p);
    return m >= 1 && m <= TIED_KEYS && Math.abs(m * p - 1) <= TIE;
  });
}

/** An original that keeps at least this share of its sharpness does not fade: nothing for SSMax to restore. */
export const NO_FADE = 0.95;

/**
 * Mean of a row-max tensor [..., r] holding the last r rows of logits with `tq` query rows after `past` cached
 * keys: the rows that see the last quarter of the keys (at least 3/4 of them), at most ROW_SAMPLE, count. In a
 * causal prompt these are its last quarter; over a long cache every query row; in bidirectional attention every
 * row sees all keys and the last ones are as good as any.
 */
export function meanOf(t: OutputTensor, tq: number, past = 0): number {
  const r = t.dims.length ? t.dims[t.dims.length - 1] : 1;
  const want = Math.max(1, Math.min(r, ROW_SAMPLE, tq, Math.floor((tq + past) / 4)));
  let sum = 0, count = 0;
  for (let i = 0; i < t.data.length; i++) {
    if (i % r < r - want) continue;
    sum += t.data[i];
    count++;
  }
  return count ? sum / count : NaN;
}

/** Per site, in site order; sites whose graph did not run in this run (an If branch not taken) are left out. */
export function layerMeans(rowMax: Map<number, OutputTensor | undefined>, tq: number, past = 0): number[] {
  return [...rowMax.entries()].sort((a, b) => a[0] - b[0]).filter(([, t]) => t && t.data.length > 0).map(([, t]) => meanOf(t!, tq, past));
}

const average = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;

export function sharpnessPoint(length: number, original: number[], patched: number[]): SharpnessPoint {
  return { length, original: average(original), patched: average(patched), originalLayers: original, patchedLayers: patched };
}

export function sharpnessCurve(trainLen: number, points: SharpnessPoint[]): SharpnessCurve {
  const sorted = [...points].sort((a, b) => a.length - b.length);
  const first = sorted[0], last = sorted[sorted.length - 1];
  const originalFall = Math.log(first.original / last.original);
  const patchedFall = Math.log(first.patched / last.patched);
  return { trainLen, rows: ROW_SAMPLE, points: sorted, originalFall, patchedFall, kept: originalFall - patchedFall };
}
