/**
 * The patch's own names, a protocol between the patch and everything that reads a patched model: the prefix of
 * every node, initializer and input the patch adds, the parts of those names that are read back, and the
 * metadata key of the patch record. Nothing else in the tool builds or matches these names: detection, revert and
 * --update-s ask here whether a node is the patch's (how a patch whose record another tool stripped is still
 * found), and verification asks here which of the nodes the journal lists is an expansion's Softmax or prior.
 *
 * Where the patch record and its journal are there, they say what the patch added; the names are for a model
 * without them, and for the patch's own checks of what it just built.
 */

/** The metadata_props key the patch record is kept under. */
export const RECORD_KEY = 'ssmax_patch';

/** Every name the patch gives its nodes and constants starts with this. */
const PREFIX = 'ssmax/';
/** The inputs it adds to a function body start with this. */
const INPUT_PREFIX = 'ssmax_';

/**
 * The last part of the names that are read back (`<prefix><part>`, or `<prefix><part>_<k>` when the name was taken).
 * Inserted nodes of other parts are named by the code that inserts them; nothing reads those names.
 */
export const PART = {
  /** The Mul that applies the factor, and the Casts around it on a half-precision tensor. */
  apply: 'apply', applyIn: 'apply_in', applyOut: 'apply_out',
  /** s: an initializer, or a Constant in a graph without initializers. */
  scale: 's',
  /** An expanded operator's Softmax. */
  probs: 'probs',
  /** A positional prior c·B: made (`prior`), scaled by the factor, cast to the logits' type. */
  prior: 'prior', priorScaled: 'prior_scaled', priorCast: 'prior_cast',
  /** Where an expansion adds the prior: to the logits (ONNX Attention), to the kernel's bias (com.microsoft Attention). */
  logitsPrior: 'logits_prior', attentionBiasPrior: 'attention_bias_prior',
  /** The Add of the sliding window's bias to a site's logits. */
  window: 'window',
  /** RoPE rescaled: the frequencies' multipliers (`rope_factor`), their Mul, and YaRN's factor on cos and sin and its Muls. */
  ropeFactor: 'rope_factor', rope: 'rope', ropeMscale: 'rope_mscale', ropeMscaled: 'rope_mscaled',
  /** RoPE's rotary caches recomputed: the frequencies fitted to them (`rope_theta`), the positions, and the new caches. */
  ropeTheta: 'rope_theta', ropePositions: 'rope_positions', ropeCos: 'rope_cos', ropeSin: 'rope_sin',
} as const;

export type Part = (typeof PART)[keyof typeof PART];

/** The prefix of the names one site adds (`ssmax/L<layer>/`), or a scope's shared computations of n (`ssmax/shared/`). */
export function namePrefix(owner: number | 'shared' | 'rope'): string {
  return owner === 'shared' || owner === 'rope' ? `${PREFIX}${owner}/` : `${PREFIX}L${owner}/`;
}

/** The function input through which each call of a function passes its own s or θ (`what`: `s`, `theta_alpha`, ...). */
export function callInputName(what: string, layer: number): string {
  return `${INPUT_PREFIX}${what}_${layer}`;
}

/** How messages spell the name of a factor's Mul. */
export const APPLY_NAME = `${PREFIX}L<k>/${PART.apply}`;

const escape = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
const APPLY_END = new RegExp(`/${PART.apply}(_\\d+)?$`);
const APPLY_OF_LAYER = new RegExp(`^${escape(PREFIX)}L(\\d+)/${PART.apply}(_\\d+)?$`);
const APPLY_IN = new RegExp(`/${PART.applyIn}`);
const SCALE_END = new RegExp(`/${PART.scale}(_\\d+)?$`);

/** True for a node the patch inserted (by its name). */
export function isPatchNode(node: { name: string }): boolean {
  return node.name.startsWith(PREFIX);
}

/** True for an inserted Mul that applies a factor. */
export function isApplyNode(node: { name: string }): boolean {
  return isPatchNode(node) && APPLY_END.test(node.name);
}

/** The layer in the name of a factor's Mul (`ssmax/L<k>/apply`), or null for any other name. */
export function applyLayer(name: string): number | null {
  const m = APPLY_OF_LAYER.exec(name);
  return m ? Number(m[1]) : null;
}

/** True for the Cast to fp32 that feeds a half-precision tensor to a factor's Mul. */
export function isApplyCast(name: string): boolean {
  return APPLY_IN.test(name);
}

/** True for the name of an s constant, or of the function input through which a call passes s. */
export function isScaleName(name: string, kind: 'constant' | 'input'): boolean {
  return kind === 'constant' ? SCALE_END.test(name) : name.startsWith(`${INPUT_PREFIX}${PART.scale}`);
}

/** True when `name` ends in the given part (`.../probs`, not `.../probs_1`). */
export function hasPart(name: string, part: Part): boolean {
  return name.endsWith(`/${part}`);
}
