/**
 * RoPE rescaled for a context `scale` times L (issue 36): the rotary frequencies θ_i = base^(−2i/d) replaced by
 * those of position interpolation, NTK-aware base scaling or YaRN, with Hugging Face transformers' formulas
 * (`linear`; static NTK-aware, base·scale^(d/(d−2)); `yarn` with β_fast = 32, β_slow = 1 and its attention
 * factor 0.1·ln(scale) + 1 on cos and sin, which multiplies the logits by its square). It changes the angles at
 * every position, inside L too: no length reproduces the original.
 */
import { InputError, opt } from '../errors';

/** Position interpolation, NTK-aware base scaling, or YaRN. */
export type RopeMethod = 'pi' | 'ntk' | 'yarn';

export const ROPE_METHODS: readonly RopeMethod[] = ['pi', 'ntk', 'yarn'];

export interface RopeSpec {
  method: RopeMethod;
  /** The context the rescaling is for, as a multiple of L (> 1). */
  scale: number;
  /** L, the original context YaRN's ramp is measured against (the other methods do not read it). */
  trainLen?: number;
}

/** The patch's RoPE options (PatchOptions). */
export interface RopeOptions {
  /** Rescale the model's RoPE: position interpolation, NTK-aware scaling or YaRN. */
  rope?: RopeMethod;
  /** The context the rescaling is for, as a multiple of the training length (default 16). */
  ropeScale?: number;
}

export const DEFAULT_ROPE_SCALE = 16;

export function resolveRope(o: RopeOptions & { trainLen?: number }): RopeSpec | undefined {
  if (o.rope === undefined) {
    if (o.ropeScale !== undefined) throw new InputError(`${opt('ropeScale')} sets how far ${opt('rope')} rescales RoPE: give ${opt('rope')} too`, 'usage');
    return undefined;
  }
  if (!ROPE_METHODS.includes(o.rope)) throw new InputError(`${opt('rope')} must be ${ROPE_METHODS.join(', ')}, got '${String(o.rope)}'`, 'usage');
  const scale = o.ropeScale ?? DEFAULT_ROPE_SCALE;
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 1) throw new InputError(`${opt('ropeScale')} must be a number > 1, got ${JSON.stringify(scale)}`, 'usage');
  if (o.rope === 'yarn' && o.trainLen === undefined) throw new InputError(`${opt('rope', 'yarn')} ramps the frequencies by how often they turn within L: give ${opt('trainLen')}`, 'usage');
  return { method: o.rope, scale, ...(o.rope === 'yarn' ? { trainLen: o.trainLen } : {}) };
}

/** The new frequencies for the original `theta` (θ_i = base^(−2i/d), d = 2·K), and the factor on cos and sin (YaRN's; else 1). */
export function ropeFrequencies(spec: RopeSpec, theta: readonly number[]): { theta: number[]; mscale: number } {
  const { method, scale } = spec;
  const K = theta.length, d = 2 * K;
  if (method === 'pi') return { theta: theta.map((t) => t / scale), mscale: 1 };
  if (method === 'ntk') return { theta: theta.map((t, i) => t * scale ** (-(2 * i) / (d - 2))), mscale: 1 };
  const L = spec.trainLen!;
  const base = (theta[0] / theta[1]) ** (d / 2);
  const correction = (rotations: number): number => (d * Math.log(L / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
  const low = Math.max(Math.floor(correction(32)), 0), high = Math.min(Math.ceil(correction(1)), d - 1);
  const ramp = (i: number): number => Math.min(1, Math.max(0, (i - low) / (high === low ? 0.001 : high - low)));
  // ramp 0: the high frequencies kept (extrapolated); ramp 1: interpolated as PI.
  return { theta: theta.map((t, i) => (t / scale) * ramp(i) + t * (1 - ramp(i))), mscale: 0.1 * Math.log(scale) + 1 };
}

/** How reports name the rescaling: `YaRN ×16 (L = 128)`. */
export function ropeText(spec: RopeSpec): string {
  const name = { pi: 'position interpolation', ntk: 'NTK-aware', yarn: 'YaRN' }[spec.method];
  return `${name} ×${spec.scale}${spec.trainLen !== undefined ? ` (L = ${spec.trainLen})` : ''}`;
}
