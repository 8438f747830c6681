/**
 * Which n each site uses. Shape-based forms (keys, causal) cost a few scalar ops per distinct shape; mask-based
 * forms count the keys each row may see from the mask actually applied to the logits.
 */
import { InputError, opt } from '../errors';
import { MaskUse } from '../detect/mask-uses';

/**
 * keys: n = Tk. causal: n_i = Tk − Tq + i + 1. padding: n = unpadded keys (a key-padding mask). causal-padding:
 * unpadded keys at or before the row's position (cumulative count). mask: count of visible keys per row from every
 * mask on the logits, whatever they are.
 */
export type NMode = 'keys' | 'causal' | 'padding' | 'causal-padding' | 'mask';

/** `--n`: every mode the report can print, or auto (the cheapest exact one, chosen per site). */
export type NOption = 'auto' | NMode;

export const N_OPTIONS: readonly NOption[] = ['auto', 'keys', 'causal', 'padding', 'causal-padding', 'mask'];

export interface NChoice {
  mode: NMode;
  reason: string;
}

export function parseNOption(v: string): NOption {
  if ((N_OPTIONS as readonly string[]).includes(v)) return v as NOption;
  throw new InputError(`${opt('n')} must be one of ${N_OPTIONS.join(', ')}; got '${v}'`, 'usage');
}

/** `where` names the site in errors, e.g. "layer 3". */
export function chooseN(option: NOption, uses: MaskUse[], causalReason: string, where = 'this site'): NChoice {
  if (option === 'padding' || option === 'causal-padding') checkPaddingMask(option, uses, where);
  if (option !== 'auto') return { mode: option, reason: `n mode ${option} as asked` };
  const counted = uses.filter((u) => u.role !== 'other' || u.rule !== 'additive');
  const roles = new Set(counted.map((u) => u.role));
  if (roles.size === 0) {
    return { mode: 'keys', reason: uses.length ? 'auto: only additive position biases on the logits' : 'auto: no mask on the logits' };
  }
  // Masks are counted in a 3-D [B·H, Tq, Tk] or 4-D [B, H, Tq, Tk] view of the logits, both ranks together in the 4-D one (n-source.ts).
  if (!counted.every((u) => u.viewRank === 3 || u.viewRank === 4)) {
    const causal = roles.has('causal') || roles.has('combined');
    return { mode: causal ? 'causal' : 'keys', reason: `auto: masks of unknown rank cannot be counted; ${causal ? causalReason : 'n = Tk'}` };
  }
  if (roles.has('combined') || roles.has('other')) return { mode: 'mask', reason: 'auto: mask is neither plain causal nor key padding: count visible keys' };
  if (roles.has('causal') && roles.has('padding')) return { mode: 'causal-padding', reason: `auto: ${causalReason} plus a padding mask from the inputs` };
  if (roles.has('causal')) return { mode: 'causal', reason: `auto: ${causalReason}` };
  return { mode: 'padding', reason: 'auto: padding mask from the inputs: count unpadded keys' };
}

/** padding and causal-padding count the keys a key-padding mask from a model input leaves visible: it must be there. */
function checkPaddingMask(option: NOption, uses: MaskUse[], where: string): void {
  if (uses.some((u) => u.role === 'padding')) return;
  const found = uses.length ? `its masks are ${[...new Set(uses.map((u) => u.role))].join(', ')}` : 'it has no mask';
  throw new InputError(`${opt('n', option)} needs a key-padding mask from a model input on the logits, and ${where} has none (${found}): use ${opt('n', 'mask')} or auto`, 'usage');
}

/** The per-row n the presets defined on positions need, whatever the mask. */
export function positionN(option: NOption): NChoice {
  if (option !== 'auto' && option !== 'causal') throw new InputError(`this preset is defined on positions: ${opt('n', option)} does not apply`, 'usage');
  return { mode: 'causal', reason: 'preset: n is the 1-based position' };
}

/** Modes whose n is counted from masks at run time (the others read shapes only). */
export function countsMasks(mode: string): boolean {
  return mode === 'padding' || mode === 'causal-padding' || mode === 'mask';
}

/** The shape-based mode a mode equals when every mask is all ones; `mask` has none (its masks may be causal or not). */
export function withMasksOfOnes(mode: string): string {
  return mode === 'padding' ? 'keys' : mode === 'causal-padding' ? 'causal' : mode;
}
