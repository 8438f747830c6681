/** What a patch reports: one entry per patched site, the skipped and refused ones, and the model it wrote. */
import type { RopeSpec } from '../policy/rope';
import type { RopeSiteRecord } from './rope';
import type { SkippedSoftmax } from '../detect/find-attention';
import type { ModelProto } from '../io/onnx';
import type { PresetName } from '../policy/factor';
import type { ThetaName } from '../policy/prior';
import type { WindowSpec } from '../policy/window';
import type { LayerScale } from '../policy/scale';
import type { Target } from './insert-scale';
import type { LengthReport } from '../analysis/reach';
import type { Analysis } from '../analysis/analyse';

export interface PatchedSite {
  node: string;
  layer: number;
  /** The graph holding the site: `main`, a subgraph path (`main/<node>.<attribute>`), or the caller of a function. */
  scope: string;
  /** `Softmax`, the fused operator (`com.microsoft.MultiHeadAttention`, `Attention`, ...), or `call <function>`. */
  kind: string;
  n: string;
  nReason: string;
  heads: number | null;
  headAxis: number | null;
  headsReason: string;
  logitsRank: number | null;
  /** The tensor the factor multiplies: the content logits, or the fused operator's query (or weights). */
  logits: string;
  /** s of the factor; null for the none preset. */
  s: LayerScale | null;
  sInitializer: string;
  /** The θ initializers of a positional prior added at the site. */
  prior?: Record<ThetaName, string>;
  /** The sliding window added at the site. */
  window?: WindowSpec;
  /** Set when a forced site accepted a deviation from exact SSMax. */
  deviation?: string;
  /** Where the factor multiplies: the query rows (cheap) or the logits. */
  target: Target;
  /** Sites with the same key share one computation of n. */
  nShared: string;
  /** The detection rule that matched the site. */
  rule?: string;
  /** Set when the fused operator was replaced by the ops it is defined by: what replaced it and what that costs. */
  expanded?: string;
  /** Set when a plain-op site was written as a fused operator (onnxruntime fuses the original there): what and why. */
  fused?: string;
  /** What a user should know about how the patch sits with the model's own attention (one line each). */
  notes?: string[];
}

export interface PatchReport {
  sites: PatchedSite[];
  skipped: SkippedSoftmax[];
  updated: boolean;
  opset: number;
  irVersion: number;
  preset: PresetName;
  /** Distinct computations of n in the patched model. */
  nSources: number;
  /** What was accepted as onnxruntime accepts it (nodes out of order, names defined twice), and how. */
  notes: string[];
  /** Set when every attention length of the model is fixed, or capped below L: the n it can run and what the factor does there. */
  lengths?: LengthReport;
  /** RoPE rescaled (`rope` option): how, and the constants of frequencies it rescaled. */
  rope?: RopeSpec & { sites: RopeSiteRecord[] };
}

export interface PatchResult {
  model: ModelProto;
  report: PatchReport;
  /** The analysis of the input model (the one given to patchModel, or its own): hand it to verifyPatch. */
  analysis: Analysis;
}
