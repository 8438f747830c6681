/** What calibration reports: the s found per group, how the search went, and the statistic against n before and after. */
import type { RuntimeReport } from '../onnxruntime';
import type { SValue } from '../policy/scale';
import type { RopeMethod } from '../policy/rope';
import { sharpnessSvg } from '../verify/plot';
import { sharpnessCurve, sharpnessPoint } from '../verify/sharpness';
import type { Granularity } from './stats';

/** The statistic matched at n ≈ N to its value at n ≈ L; or `loss`, the next-token loss past L, minimised. */
export type MatchStatistic = 'max-prob' | 'entropy' | 'loss';

/** `no gain`: by loss, s = 0 (the original) had the lowest loss of every s tried. */
export type SearchState = 'searching' | 'found' | 'no fade' | 'out of reach' | 'no gain';

export interface CalibrationGroup {
  /** `all`, a layer (`L3`) or a head of a layer (`L3 h1`). */
  group: string;
  /** The s written (0: the original does not fade there; 1/ln L: out of reach). */
  s: number;
  /** found; no fade (s = 0); out of reach (no s up to the largest tried gets there); searching (runs ran out). */
  state: SearchState;
  /** |statistic at N with s − target| / target; by loss, the loss with s over the original's, less 1 (negative: lower). */
  residual: number;
  /**
   * The statistic at n ≈ L (where the slope changes nothing), at n ≈ N in the original, and at n ≈ N with s. By
   * loss: the loss past L with s (target and afterAtN) and in the original (beforeAtN), nats per token.
   */
  target: number;
  beforeAtN: number;
  afterAtN: number;
  /** Every s measured, in order (the first is the original, s = 0), with the statistic at n ≈ N. */
  tried: { s: number; value: number }[];
}

/** The statistic over every site's rows at n ≈ length, in the original and with the s found. */
export interface CurvePoint { length: number; before: number; after: number }

export interface CalibrationReport {
  /** Some group's s was found (or approached): false when every group was out of reach or did not fade. */
  reached: boolean;
  trainLen: number;
  /** N, the length calibrated for. */
  targetLen: number;
  match: MatchStatistic;
  granularity: Granularity;
  /** The s written into the model, as patchModel takes it (per layer: each layer's value repeated over its heads). */
  s: SValue;
  /** Where the tokens came from: synthesised uniformly over the vocabulary, or the user's, cut to each length. */
  tokens: 'synthesised' | 'given';
  batch: number;
  /** How the rows were read. */
  rows: string;
  windows: string;
  /** onnxruntime runs made. */
  runs: number;
  groups: CalibrationGroup[];
  curve: CurvePoint[];
  /** Sites whose probabilities no output shows (not counted). */
  unseen: string[];
  notes: string[];
  totalMs: number;
  runtime: RuntimeReport;
  /** By loss with `--rope`: the method, the scale written, and each scale tried at s = 0 with its loss. */
  rope?: { method: RopeMethod; scale: number; tried: { scale: number; loss: number }[] };
}

/** The statistic against n, original and calibrated, as an SVG. */
export function calibrationSvg(report: CalibrationReport, title: string): string {
  const points = report.curve.map((p) => sharpnessPoint(p.length, [p.before], [p.after]));
  const what = report.match === 'entropy' ? 'mean attention entropy (nats)' : report.match === 'loss' ? 'next-token loss (nats per token)' : 'mean max attention probability';
  const goal = report.match === 'loss' ? `the next-token loss past ${report.trainLen} minimised` : `${what} at n ≈ ${report.targetLen} matched to n ≈ ${report.trainLen}`;
  const s = typeof report.s === 'number' ? `s = ${report.s.toPrecision(3)}` : `s per ${report.granularity === 'per-head' ? 'head' : 'layer'}`;
  return sharpnessSvg(sharpnessCurve(report.trainLen, points), {
    title, subtitle: `slope 1 + s·max(0, ln n − ln ${report.trainLen}), ${s}: ${goal}`,
    yLabel: what, series: ['original (softmax)', 'calibrated slope'],
    caption: `${report.tokens} tokens, batch ${report.batch}; ${report.windows}; every site's rows, heads and layers pooled`,
  });
}
