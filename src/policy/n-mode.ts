/**
 * Which n each site uses. Shape-based forms (keys, causal) cost a few scalar ops per distinct shape; mask-based
 * forms count the keys each row may see from the mask actually applied to the logits.
 */
import { InputError, opt } from '../errors';
import { countable, countedMasks, describeUses, masksOnly, MaskUse } from '../detect/mask-uses';

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
  // The report says which entries a count takes as hidden, and which terms were not taken for masks.
  const said = (reason: string, mode: NMode): NChoice => {
    const terms = describeUses(countsMasks(mode) ? countedMasks(mode, uses) : [], uses.filter((u) => u.kind === 'from-logits' || u.kind === 'per-row'));
    return { mode, reason: terms ? `${reason}; ${terms}` : reason };
  };
  if (option !== 'auto') return said(`n mode ${option} as asked`, option);
  const counted = masksOnly(uses);
  const roles = new Set(counted.map((u) => u.role));
  if (roles.size === 0) {
    return said(uses.some((u) => u.kind === 'bias') ? 'auto: only additive position biases on the logits' : 'auto: no mask on the logits', 'keys');
  }
  if (!countable(counted)) {
    const causal = roles.has('causal') || roles.has('combined');
    const why = counted.some((u) => u.viewRank === undefined) ? 'masks of unknown rank cannot be counted' : 'masks in a view of the logits of unknown dims cannot be counted';
    return { mode: causal ? 'causal' : 'keys', reason: `auto: ${why}; ${causal ? causalReason : 'n = Tk'}` };
  }
  if (roles.has('combined') || roles.has('other')) return said('auto: mask is neither plain causal nor key padding: count visible keys', 'mask');
  if (roles.has('causal') && roles.has('padding')) return said(`auto: ${causalReason} plus a padding mask from the inputs`, 'causal-padding');
  if (roles.has('causal')) return said(`auto: ${causalReason}`, 'causal');
  return said('auto: padding mask from the inputs: count unpadded keys', 'padding');
}

/** padding and causal-padding count the keys a key-padding mask from a model input leaves visible: it must be there. */
function checkPaddingMask(option: NOption, uses: MaskUse[], where: string): void {
  if (masksOnly(uses).some((u) => u.role === 'padding')) return;
  const masks = masksOnly(uses);
  const others = [...new Set(uses.filter((u) => u.kind !== 'mask').map((u) => NOT_A_MASK[u.kind]))];
  const found = [masks.length ? `its masks are ${[...new Set(masks.map((u) => u.role))].join(', ')}` : 'it has no mask', ...others].join('; ');
  throw new InputError(`${opt('n', option)} needs a key-padding mask from a model input on the logits, and ${where} has none (${found}): use ${opt('n', 'mask')} or auto`, 'usage');
}

const NOT_A_MASK: Record<string, string> = { 'bias': 'a position bias', 'from-logits': 'a term computed from the logits', 'per-row': 'a term with one value per row' };

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
