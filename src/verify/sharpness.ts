/**
 * Attention sharpness: the largest probability of each attention row, averaged over rows, heads, batch and
 * layers, for the original and the patched model at each context length. Plain softmax fades as n grows (the
 * largest probability tends to 0); the SSMax factor grows with ln n and must keep the patched curve from
 * falling the way the original's does.
 */
import { OutputTensor } from './run';

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
  /** Which rows are averaged: all rows (keys n), or the last quarter (causal n, rows seeing 3/4·T to T keys). */
  rows: 'all' | 'last quarter';
  points: SharpnessPoint[];
  /** ln(first/last) of each curve: how much it falls over the tested lengths. */
  originalFall: number;
  patchedFall: number;
  /** originalFall − patchedFall: how much more of its sharpness the patched model keeps (ln units). */
  kept: number;
}

/** Minimum `kept` for the check to pass: the patched curve must keep at least 2 % more of its sharpness. */
export const MIN_KEPT = Math.log(1.02);

/**
 * Mean of a row-max tensor [..., Tq]. Causal rows see fewer keys than the context length, so for causal sites
 * only the last quarter of the rows counts: rows attending to between 3/4·T and T keys.
 */
export function meanOf(t: OutputTensor, causal: boolean): number {
  const rows = t.dims.length ? t.dims[t.dims.length - 1] : 1;
  const from = causal ? Math.floor((3 * rows) / 4) : 0;
  let sum = 0, count = 0;
  for (let i = 0; i < t.data.length; i++) {
    if (i % rows < from) continue;
    sum += t.data[i];
    count++;
  }
  return count ? sum / count : NaN;
}

export function layerMeans(rowMax: Map<number, OutputTensor>, causal: Set<number>): number[] {
  return [...rowMax.entries()].sort((a, b) => a[0] - b[0]).map(([layer, t]) => meanOf(t, causal.has(layer)));
}

const average = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;

export function sharpnessPoint(length: number, original: number[], patched: number[]): SharpnessPoint {
  return { length, original: average(original), patched: average(patched), originalLayers: original, patchedLayers: patched };
}

export function sharpnessCurve(trainLen: number, points: SharpnessPoint[], causal: boolean): SharpnessCurve {
  const sorted = [...points].sort((a, b) => a.length - b.length);
  const first = sorted[0], last = sorted[sorted.length - 1];
  const originalFall = Math.log(first.original / last.original);
  const patchedFall = Math.log(first.patched / last.patched);
  return { trainLen, rows: causal ? 'last quarter' : 'all', points: sorted, originalFall, patchedFall, kept: originalFall - patchedFall };
}
