/**
 * Numbers the patch stores as float32 initializers (s, b, floor_scale, attn_scale, θ): a double outside float32's
 * normal range would be written as ±Infinity, as 0, or as a subnormal with few significant bits left; each is
 * refused with what it would have become.
 */
import { InputError } from '../errors';

const MAX = 3.4028234663852886e38;
/** The smallest normal float32, 2^−126: below it precision is lost, below 2^−149 the value becomes 0. */
const MIN_NORMAL = 2 ** -126;

/** `v` itself when float32 holds it to its 24 bits; `where` names it in the error. */
export function checkFloat32(v: number, where: string): number {
  const stored = Math.fround(v);
  if (!Number.isFinite(stored)) {
    throw new InputError(`${where}: ${v} overflows float32 (largest ${MAX.toPrecision(8)}): it would be stored as ${stored}`, 'usage');
  }
  if (v !== 0 && Math.abs(v) < MIN_NORMAL) {
    throw new InputError(`${where}: ${v} underflows float32 (smallest normal ${MIN_NORMAL.toPrecision(8)}): it would be stored as ${stored}`, 'usage');
  }
  return v;
}
