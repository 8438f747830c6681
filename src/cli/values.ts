/**
 * Option values the library takes as typed values, read from the command line: names checked against their
 * lists, layer lists parsed, and the JSON files of s (--s-file) and θ (--prior-file) read and checked.
 */
import * as fs from 'node:fs';
import { InputError } from '../errors';
import { PresetName, PRESETS } from '../policy/factor';
import { LayerSelection } from '../policy/layers';
import { PriorName, PRIORS, Theta, THETAS, thetaSpecs } from '../policy/prior';
import { scaleSpecOf, SValue } from '../policy/scale';

export function presetValue(v: string): PresetName {
  if ((PRESETS as readonly string[]).includes(v)) return v as PresetName;
  throw new InputError(`--preset must be ${PRESETS.slice(0, -1).join(', ')} or ${PRESETS[PRESETS.length - 1]}, got '${v}'`, 'usage');
}

export function priorValue(v: string | undefined): PriorName | undefined {
  if (v === undefined || (PRIORS as readonly string[]).includes(v)) return v as PriorName | undefined;
  throw new InputError(`--prior must be ggd or alibi, got '${v}'`, 'usage');
}

/** `--layers 3,7,11` or `--layers every:4`. */
export function layersValue(v: string | undefined): LayerSelection | undefined {
  if (v === undefined) return undefined;
  const every = /^every:(\d+)$/.exec(v.trim());
  if (every) {
    const k = Number(every[1]);
    if (k < 1) throw new InputError(`--layers every:k needs k ≥ 1, got ${k}`, 'usage');
    return { every: k };
  }
  const layers = v.split(',').map((t) => (/^\d+$/.test(t.trim()) ? Number(t) : NaN));
  if (layers.some((l) => !Number.isSafeInteger(l))) throw new InputError(`--layers must be a comma-separated list of layer indices or every:k, got '${v}'`, 'usage');
  return layers;
}

/** `--s-file F`: `{"s": x | [per head] | [[per head] per layer]}`. */
export function sFileValue(file: string): SValue {
  const s = (readJsonFile(file, '--s-file') as { s?: unknown } | null)?.s;
  if (s === undefined) throw new InputError(`--s-file ${file}: expected {"s": number | number[] | number[][]}`, 'usage');
  // s = 0 passes here: the preset decides whether it is allowed (the slope's factor is then 1).
  scaleSpecOf(s, `--s-file ${file}`, `--s-file ${file}`, true);
  return s as SValue;
}

/** `--prior-file F`: `{"theta_alpha": …, "theta_beta": …, "theta_mu": …}`, each a number, per head or per layer. */
export function priorFileValue(file: string): Theta {
  const json = readJsonFile(file, '--prior-file');
  const where = `--prior-file ${file}`;
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new InputError(`${where}: expected {"theta_alpha": …, "theta_beta": …, "theta_mu": …}`, 'usage');
  const unknown = Object.keys(json).filter((k) => !THETAS.some((t) => k === `theta_${t}`));
  if (unknown.length) throw new InputError(`${where}: unknown key '${unknown[0]}' (keys: theta_alpha, theta_beta, theta_mu)`, 'usage');
  const theta = Object.fromEntries(THETAS.filter((t) => `theta_${t}` in json).map((t) => [t, (json as Record<string, unknown>)[`theta_${t}`]])) as Theta;
  thetaSpecs(theta, where);
  return theta;
}

function readJsonFile(file: string, flag: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    throw new InputError(`${flag} ${file}: cannot read`, 'usage');
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new InputError(`${flag} ${file}: not valid JSON`, 'usage');
  }
}
