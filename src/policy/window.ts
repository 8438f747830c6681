/**
 * The sliding-window prior (StreamingLLM, Xiao et al. 2024; BAM's point that a prior which hides far keys is local
 * attention): a row at absolute position p keeps the keys p − W < j, and the first `sinks` keys j < S whatever
 * their age; older keys get a bias far below any logit. It is a mask, not a scaled term: it goes after the factor,
 * unscaled, so a factor of 0 (a row with one key) cannot unhide a key.
 *
 * n is exact: under a causal mask a row sees min(p + 1, W) keys of its window plus the sinks older than it.
 */
import { InputError, opt } from '../errors';
import { DataType } from '../io/onnx';

export interface WindowSpec {
  /** W: keys p − W < j ≤ p are kept. */
  size: number;
  /** S: keys j < S are kept at every row (attention sinks). */
  sinks: number;
}

export interface WindowOptions {
  /** Hide keys W or more positions older than the row (a causal sliding window of W keys). */
  window?: number;
  /** With a window: keep the first S keys at every row too (default 0). */
  sinks?: number;
}

export function resolveWindow(o: WindowOptions): WindowSpec | undefined {
  if (o.window === undefined) {
    if (o.sinks !== undefined) throw new InputError(`${opt('sinks')} keeps keys a window would hide: give ${opt('window')} too`, 'usage');
    return undefined;
  }
  const whole = (v: unknown, min: number, name: 'window' | 'sinks'): number => {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) throw new InputError(`${opt(name)} must be a whole number ≥ ${min}, got ${JSON.stringify(v)}`, 'usage');
    return v;
  };
  return { size: whole(o.window, 1, 'window'), sinks: whole(o.sinks ?? 0, 0, 'sinks') };
}

/** The keys a causal row at absolute position p sees through the window: its last W, and the sinks older than those. */
export function windowN(w: WindowSpec, p: number): number {
  const seen = p + 1;
  return Math.min(seen, w.size) + Math.min(w.sinks, Math.max(0, seen - w.size));
}

/** Whether the window keeps key j for the row at absolute position p: its last W keys, and the first S at every row. */
export function windowKeeps(w: WindowSpec, p: number, j: number): boolean {
  return p - j < w.size || j < w.sinks;
}

/**
 * The bias on a hidden key: far below any logit, finite, and exactly representable in the logits' type (float16's
 * −30000 leaves room for logits and masks down to −35000 before the sum overflows).
 */
export function windowHidden(logitsType: number | undefined): number {
  return logitsType === DataType.FLOAT16 ? -30000 : -1e9;
}

/** A window so wide it hides nothing at any length a model runs: what the wiring copy sets W to. */
export const NO_WINDOW = 2 ** 62;
