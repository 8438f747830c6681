/**
 * Where s comes from (--s, --train-len, --s-file) and what it becomes per layer: one value or one per head.
 */
import * as fs from 'node:fs';
import { InputError, opt } from '../errors';

/** s for one layer: a scalar for all heads, or one value per head. */
export type LayerScale = number | number[];

export type ScaleSpec =
  | { kind: 'scalar'; s: number; from: string }
  | { kind: 'per-head'; s: number[] }
  | { kind: 'per-layer'; s: number[][] };

export interface ScaleOptions {
  s?: number;
  trainLen?: number;
  sFile?: string;
}

export function scaleFromTrainLen(trainLen: number): number {
  return 1 / Math.log(trainLen);
}

/**
 * s from --s or --s-file (exclusive), else s = 1/ln L from --train-len. Given with --s or --s-file, --train-len
 * only states the training length (recorded for verification; a warning says when s·ln L is far from 1).
 */
export function resolveScaleSpec(options: ScaleOptions): ScaleSpec {
  if (options.s === undefined && options.trainLen === undefined && options.sFile === undefined) {
    throw new InputError(`give one of ${opt('s')}, ${opt('trainLen')} or ${opt('sFile')}`);
  }
  if (options.s !== undefined && options.sFile !== undefined) throw new InputError(`${opt('s')} and ${opt('sFile')} are exclusive: give one`);
  if (options.trainLen !== undefined && (!Number.isInteger(options.trainLen) || options.trainLen < 2)) {
    throw new InputError(`${opt('trainLen')} must be an integer ≥ 2, got ${options.trainLen}`);
  }
  if (options.s !== undefined) return { kind: 'scalar', s: checkS(options.s, opt('s')), from: 'given' };
  if (options.sFile !== undefined) return parseScaleJson(readJsonFile(options.sFile, 'sFile'), opt('sFile', options.sFile));
  return { kind: 'scalar', s: scaleFromTrainLen(options.trainLen!), from: `1/ln ${options.trainLen}` };
}

function checkS(v: unknown, where: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) {
    throw new InputError(`${where}: s must be a positive finite number, got ${JSON.stringify(v)}`);
  }
  return v;
}

/** A JSON file named by an option (--s-file, --prior-file), with the option in the error when it cannot be read. */
export function readJsonFile(file: string, option: 'sFile' | 'priorFile'): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    throw new InputError(`${opt(option, file)}: cannot read`);
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new InputError(`${opt(option, file)}: not valid JSON`);
  }
}

export function parseScaleJson(json: unknown, where: string): ScaleSpec {
  const s = (json as { s?: unknown } | null)?.s;
  if (typeof s === 'number') return { kind: 'scalar', s: checkS(s, where), from: where };
  if (Array.isArray(s) && s.length > 0 && s.every((x) => typeof x === 'number')) {
    return { kind: 'per-head', s: s.map((x) => checkS(x, where)) };
  }
  if (Array.isArray(s) && s.length > 0 && s.every((row) => Array.isArray(row) && row.length > 0)) {
    return { kind: 'per-layer', s: (s as unknown[][]).map((row) => row.map((x) => checkS(x, where))) };
  }
  throw new InputError(`${where}: expected {"s": number | number[] | number[][]}`);
}

/** s for each layer, checked against the layer count and each layer's head count where the graph tells it. */
export function scalesForLayers(spec: ScaleSpec, heads: (number | undefined)[]): LayerScale[] {
  if (spec.kind === 'scalar') return heads.map(() => spec.s);
  if (spec.kind === 'per-layer' && spec.s.length !== heads.length) {
    throw new InputError(`s file has ${spec.s.length} layers, the model has ${heads.length} attention layers`);
  }
  return heads.map((h, layer) => {
    const row = spec.kind === 'per-head' ? spec.s : spec.s[layer];
    if (h !== undefined && row.length !== h) {
      throw new InputError(`s file gives ${row.length} heads for layer ${layer}, the model has ${h} heads there`);
    }
    return [...row];
  });
}
