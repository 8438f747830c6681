/**
 * Positional priors (BAM, Bianchessi et al. 2025): an additive term on the attention logits of each head,
 *
 *   B_ij = −exp(θα_h) · (|(j − i) − μ_h| + 1e-5)^θβ_h,   μ_h = exp(θμ_h) − exp(−θμ_h),
 *
 * with i the query's absolute position and j the key's. `ggd` starts neutral (θ = 0: B is one constant per row,
 * which softmax ignores), `alibi` is the Laplace prior with ALiBi's slopes (θβ = 1, θμ = 0, θα = ln m_h).
 * θ comes per layer and head like s: one number, a list per head, or a list per layer of lists per head.
 */
import { InputError, opt } from '../errors';
import { checkFloat32 } from './float32';
import type { SValue } from './scale';

export type PriorName = 'ggd' | 'alibi';
export const PRIORS: readonly PriorName[] = ['ggd', 'alibi'];
export type ThetaName = 'alpha' | 'beta' | 'mu';
export const THETAS: readonly ThetaName[] = ['alpha', 'beta', 'mu'];

/** θ as given: each of θα, θβ, θμ one value, one per head, or one row per layer of values per head; absent: the prior's default. */
export type Theta = Partial<Record<ThetaName, SValue>>;

/** One θ as given: for every layer and head, per head, or per layer and head. */
export type ThetaSpec = { kind: 'scalar'; v: number } | { kind: 'per-head'; v: number[] } | { kind: 'per-layer'; v: number[][] };

export interface PriorSpec {
  kind: PriorName;
  theta: Partial<Record<ThetaName, ThetaSpec>>;
  /** Where θ came from, for the record. */
  from: string;
}

/** θ of one layer, one value per head. */
export type LayerTheta = Record<ThetaName, number[]>;

export interface PriorOptions {
  /** Add a positional prior to the logits. */
  prior?: PriorName;
  /** θ of the prior (default: ggd neutral, θ = 0; alibi: ALiBi's slopes). */
  theta?: Theta;
  /** Where θ came from, for the patch record (e.g. the file the CLI read it from); default `given θ`. */
  thetaSource?: string;
}

export function resolvePrior(o: PriorOptions): PriorSpec | undefined {
  if (o.prior === undefined) {
    if (o.theta !== undefined) throw new InputError(`θ for a prior given without ${opt('prior')}`, 'usage');
    return undefined;
  }
  if (!PRIORS.includes(o.prior)) throw new InputError(`${opt('prior')} must be ggd or alibi, got '${o.prior}'`, 'usage');
  if (o.theta !== undefined) return { kind: o.prior, theta: thetaSpecs(o.theta, 'θ'), from: o.thetaSource ?? 'given θ' };
  return { kind: o.prior, theta: {}, from: 'defaults' };
}

/** θ of a prior checked and laid out; `where` names it in errors. */
export function thetaSpecs(theta: unknown, where: string): Partial<Record<ThetaName, ThetaSpec>> {
  if (typeof theta !== 'object' || theta === null || Array.isArray(theta)) throw new InputError(`${where}: expected {alpha, beta, mu}`, 'usage');
  const record = theta as Record<string, unknown>;
  const unknown = Object.keys(record).filter((k) => !(THETAS as readonly string[]).includes(k));
  if (unknown.length) throw new InputError(`${where}: unknown θ '${unknown[0]}' (θ: alpha, beta, mu)`, 'usage');
  const out: Partial<Record<ThetaName, ThetaSpec>> = {};
  for (const t of THETAS) {
    const v = record[t];
    if (v !== undefined) out[t] = thetaSpec(v, `${where}: θ${t}`);
  }
  return out;
}

function thetaSpec(v: unknown, where: string): ThetaSpec {
  const num = (x: unknown): number => {
    if (typeof x !== 'number' || !Number.isFinite(x)) throw new InputError(`${where}: θ must be finite numbers, got ${JSON.stringify(x)}`, 'usage');
    return checkFloat32(x, where);
  };
  if (typeof v === 'number') return { kind: 'scalar', v: num(v) };
  if (Array.isArray(v) && v.length > 0 && v.every((x) => !Array.isArray(x))) return { kind: 'per-head', v: v.map(num) };
  if (Array.isArray(v) && v.length > 0 && v.every((row) => Array.isArray(row) && row.length > 0)) {
    return { kind: 'per-layer', v: (v as unknown[][]).map((row) => row.map(num)) };
  }
  throw new InputError(`${where}: expected a number, a list per head, or a list per layer of lists per head`, 'usage');
}

/**
 * θ for each layer, [H] per θ, checked against the layer count and each layer's head count. The head count must
 * be known: θ is one initializer per layer with one value per head.
 */
export function thetasForLayers(spec: PriorSpec, heads: (number | undefined)[]): (LayerTheta | null)[] {
  for (const t of THETAS) {
    const s = spec.theta[t];
    if (s?.kind === 'per-layer' && s.v.length !== heads.length) {
      throw new InputError(`theta_${t} has ${s.v.length} layers, the model has ${heads.length} attention layers`, 'usage');
    }
  }
  return heads.map((h, layer) => (h === undefined ? null : layerTheta(spec, h, layer)));
}

function layerTheta(spec: PriorSpec, heads: number, layer: number): LayerTheta {
  const out = {} as LayerTheta;
  for (const t of THETAS) {
    const s = spec.theta[t];
    const row = !s ? defaults(spec.kind, heads)[t] : s.kind === 'scalar' ? Array(heads).fill(s.v) : s.kind === 'per-head' ? s.v : s.v[layer];
    if (row.length !== heads) throw new InputError(`theta_${t} gives ${row.length} heads for layer ${layer}, the model has ${heads} heads there`, 'usage');
    out[t] = [...row];
  }
  return out;
}

function defaults(kind: PriorName, heads: number): LayerTheta {
  const zeros = Array(heads).fill(0);
  if (kind === 'ggd') return { alpha: zeros, beta: zeros, mu: zeros };
  return { alpha: alibiSlopes(heads).map(Math.log), beta: Array(heads).fill(1), mu: zeros };
}

/**
 * B of one head at relative position d = j − i in plain arithmetic (BAM.md): −exp(θα)·(|d − μ| + 1e-5)^θβ with
 * μ = exp(θμ) − exp(−θμ). What verification recomputes the inserted prior against.
 */
export function priorValue(theta: LayerTheta, head: number, d: number): number {
  const mu = Math.exp(theta.mu[head]) - Math.exp(-theta.mu[head]);
  return -Math.exp(theta.alpha[head]) * Math.pow(Math.abs(d - mu) + 1e-5, theta.beta[head]);
}

/**
 * ALiBi's head slopes (Press et al. 2022, as its reference code computes them): for H a power of two, the geometric
 * sequence 2^(−8/H), 2^(−16/H), …; otherwise the slopes of the largest power of two below H, then every other
 * slope of twice that many.
 */
export function alibiSlopes(heads: number): number[] {
  const pow2 = (n: number): number[] => Array.from({ length: n }, (_, h) => 2 ** (-8 * (h + 1) / n));
  const p = 2 ** Math.floor(Math.log2(heads));
  if (p === heads) return pow2(heads);
  return [...pow2(p), ...pow2(2 * p).filter((_, i) => i % 2 === 0).slice(0, heads - p)];
}
