/** Which n each site uses: the key count, or per-row causal positions. */
import { InputError } from '../errors';
import { MaskVerdict } from '../detect/mask';

export type NOption = 'auto' | 'keys' | 'causal';
export type NMode = 'keys' | 'causal';

export interface NChoice {
  mode: NMode;
  reason: string;
}

export function parseNOption(v: string): NOption {
  if (v === 'auto' || v === 'keys' || v === 'causal') return v;
  throw new InputError(`--n must be auto, keys or causal, got '${v}'`);
}

export function chooseN(option: NOption, mask: MaskVerdict): NChoice {
  if (option === 'keys') return { mode: 'keys', reason: '--n keys' };
  if (option === 'causal') return { mode: 'causal', reason: '--n causal' };
  return mask.causal
    ? { mode: 'causal', reason: `auto: ${mask.reason}` }
    : { mode: 'keys', reason: `auto: ${mask.reason}` };
}
