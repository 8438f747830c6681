/**
 * Where s comes from (a value, a training length) and what it becomes per layer: one value or one per head.
 */
import { InputError, opt } from '../errors';
import { checkFloat32 } from './float32';

/** s for one layer: a scalar for all heads, or one value per head. */
export type LayerScale = number | number[];

/** s as given: one value for every layer and head, one per head (every layer), or one row per layer of values per head. */
export type SValue = number | readonly number[] | readonly (readonly number[])[];

export type ScaleSpec =
  | { kind: 'scalar'; s: number; from: string }
  | { kind: 'per-head'; s: number[] }
  | { kind: 'per-layer'; s: number[][] };

export interface ScaleOptions {
  /** s itself; with trainLen as well, trainLen only states the training length (recorded, and checked). */
  s?: SValue;
  /** L: s = 1/ln L, so the factor is exactly 1 at n = L. */
  trainLen?: number;
  /** Where s came from, for the patch record (e.g. the file the CLI read it from); default `given`. */
  sSource?: string;
}

export function scaleFromTrainLen(trainLen: number): number {
  return 1 / Math.log(trainLen);
}

/**
 * s from the option s, else s = 1/ln L from trainLen. Given with s, trainLen only states the training length
 * (recorded for verification; a warning says when s·ln L is far from 1).
 */
export function resolveScaleSpec(options: ScaleOptions, zero = false): ScaleSpec {
  if (options.s === undefined && options.trainLen === undefined) throw new InputError(`give ${opt('sOrFile')} or ${opt('trainLen')}`, 'usage');
  if (options.trainLen !== undefined && (!Number.isInteger(options.trainLen) || options.trainLen < 2)) {
    throw new InputError(`${opt('trainLen')} must be an integer ≥ 2, got ${options.trainLen}`, 'usage');
  }
  if (options.s !== undefined) return scaleSpecOf(options.s, options.sSource ?? opt('s'), options.sSource ?? 'given', zero);
  return { kind: 'scalar', s: scaleFromTrainLen(options.trainLen!), from: `1/ln ${options.trainLen}` };
}

function checkS(v: unknown, where: string, zero: boolean): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || (v === 0 && !zero)) {
    throw new InputError(`${where}: s must be a ${zero ? 'non-negative' : 'positive'} finite number, got ${JSON.stringify(v)}`, 'usage');
  }
  return checkFloat32(v, where);
}

/**
 * An s value (number, per head, per layer of per head) as a spec; `from` names a scalar's source in the record.
 * `zero`: s = 0 is allowed (the slope preset, whose factor is then 1: a head calibration leaves unchanged).
 */
export function scaleSpecOf(s: unknown, where: string, from = where, zero = false): ScaleSpec {
  if (typeof s === 'number') return { kind: 'scalar', s: checkS(s, where, zero), from };
  if (Array.isArray(s) && s.length > 0 && s.every((x) => typeof x === 'number')) {
    return { kind: 'per-head', s: s.map((x) => checkS(x, where, zero)) };
  }
  if (Array.isArray(s) && s.length > 0 && s.every((row) => Array.isArray(row) && row.length > 0)) {
    return { kind: 'per-layer', s: (s as unknown[][]).map((row) => row.map((x) => checkS(x, where, zero))) };
  }
  throw new InputError(`${where}: expected a number, a list per head or a list per layer of lists per head`, 'usage');
}

/** s for each layer, checked against the layer count and each layer's head count where the graph tells it. */
export function scalesForLayers(spec: ScaleSpec, heads: (number | undefined)[]): LayerScale[] {
  if (spec.kind === 'scalar') return heads.map(() => spec.s);
  if (spec.kind === 'per-layer' && spec.s.length !== heads.length) {
    throw new InputError(`s has ${spec.s.length} layers, the model has ${heads.length} attention layers`, 'usage');
  }
  return heads.map((h, layer) => {
    const row = spec.kind === 'per-head' ? spec.s : spec.s[layer];
    if (h !== undefined && row.length !== h) {
      throw new InputError(`s gives ${row.length} heads for layer ${layer}, the model has ${h} heads there`, 'usage');
    }
    return [...row];
  });
}
