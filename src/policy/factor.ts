/**
 * The factor each preset multiplies a row's logits by, as a function of that row's n (and s):
 *
 *   ssmax      c = s·ln n (+ b)                              (Nakanishi 2025; b is the paper's bias variant)
 *   qwen-logn  c = max(1, ln n / ln L) = max(1, s·ln n)      s = 1/ln L, n the 1-based position (Qwen use_logn_attn)
 *   llama4     c = ln(⌊n / floor_scale⌋ + 1)·attn_scale + 1  n = pos + 1 (Llama 4 attention temperature tuning)
 *   slope      c = 1 + s·max(0, ln n − ln L)                 exactly 1 on every row with n ≤ L, any n mode
 *   none       c = 1: no factor (a positional prior alone)
 */
import { InputError, opt } from '../errors';
import { checkFloat32 } from './float32';

export type Preset =
  | { kind: 'ssmax'; b?: number }
  | { kind: 'qwen-logn'; trainLen: number }
  | { kind: 'llama4'; floorScale: number; attnScale: number }
  | { kind: 'slope'; trainLen: number }
  | { kind: 'none' };

export type PresetName = 'ssmax' | 'qwen-logn' | 'llama4' | 'slope' | 'none';
export const PRESETS: readonly PresetName[] = ['ssmax', 'qwen-logn', 'llama4', 'slope', 'none'];

export interface PresetOptions {
  /** ssmax (default), qwen-logn, llama4, slope, or none (a prior alone), with their parameters. */
  preset?: PresetName;
  /** ssmax's bias variant: factor s·ln n + b. */
  b?: number;
  /** L; needed by qwen-logn and slope, whose factor is 1 on every row with n ≤ L. */
  trainLen?: number;
  /** llama4's floor_scale (default 8192). */
  floorScale?: number;
  /** llama4's attn_scale (default 0.1). */
  attnScale?: number;
}

export function resolvePreset(o: PresetOptions): Preset {
  const name = o.preset ?? 'ssmax';
  refuseOtherPresetsParameters(name, o);
  if (name === 'ssmax') {
    if (o.b !== undefined && !Number.isFinite(o.b)) throw new InputError(`${opt('b')} must be a finite number, got ${o.b}`, 'usage');
    return o.b === undefined ? { kind: 'ssmax' } : { kind: 'ssmax', b: checkFloat32(o.b, opt('b')) };
  }
  if (name === 'qwen-logn') {
    if (o.trainLen === undefined) throw new InputError(`${opt('preset', 'qwen-logn')} needs ${opt('trainLen')}`, 'usage');
    return { kind: 'qwen-logn', trainLen: o.trainLen };
  }
  if (name === 'slope') {
    if (o.trainLen === undefined) throw new InputError(`${opt('preset', 'slope')} needs ${opt('trainLen')}: its factor is 1 up to L`, 'usage');
    return { kind: 'slope', trainLen: o.trainLen };
  }
  if (name === 'llama4') {
    const floorScale = o.floorScale ?? 8192;
    const attnScale = o.attnScale ?? 0.1;
    if (!(floorScale >= 1) || !(attnScale > 0)) throw new InputError(`${opt('floorScale')} must be ≥ 1 and ${opt('attnScale')} > 0`, 'usage');
    return { kind: 'llama4', floorScale: checkFloat32(floorScale, opt('floorScale')), attnScale: checkFloat32(attnScale, opt('attnScale')) };
  }
  if (name === 'none') return { kind: 'none' };
  throw new InputError(`${opt('preset')} must be ssmax, qwen-logn, llama4, slope or none, got '${name}'`, 'usage');
}

/** A parameter of another preset than the one chosen would be ignored. */
function refuseOtherPresetsParameters(name: PresetName, o: PresetOptions): void {
  if (name !== 'ssmax' && o.b !== undefined) throw new InputError(`${opt('b')} applies to ${opt('preset', 'ssmax')} only`, 'usage');
  const llama4 = [o.floorScale !== undefined && opt('floorScale'), o.attnScale !== undefined && opt('attnScale')].filter((x): x is string => Boolean(x));
  if (name !== 'llama4' && llama4.length) {
    throw new InputError(`${llama4.join(' and ')} ${llama4.length > 1 ? 'apply' : 'applies'} to ${opt('preset', 'llama4')} only`, 'usage');
  }
}

/** Presets defined on absolute positions always use the per-row (causal) n. */
export function presetNeedsPositions(p: Preset): boolean {
  return p.kind === 'qwen-logn' || p.kind === 'llama4';
}

/**
 * The factor in plain arithmetic: what a row with n keys (or 1-based position n) is multiplied by, for a head
 * whose stored s is `s`. The single source of every preset's formula outside the inserted graph, which
 * verification checks that graph against.
 */
export function factorValue(p: Preset, s: number, n: number): number {
  if (p.kind === 'qwen-logn') return Math.max(1, s * Math.log(n));
  if (p.kind === 'llama4') return Math.log(Math.floor(n / p.floorScale) + 1) * s + 1;
  if (p.kind === 'slope') return 1 + s * Math.max(0, Math.log(n) - Math.log(p.trainLen));
  if (p.kind === 'none') return 1;
  return s * Math.log(n) + (p.b ?? 0);
}
