/** Which attention layers get the factor: all, a list ("3,7,11"), or every k-th ("every:4" → 3, 7, 11, ...). */
import { InputError } from '../errors';

export function selectLayers(spec: string | undefined, count: number): Set<number> {
  if (spec === undefined) return new Set(Array.from({ length: count }, (_, i) => i));
  const every = /^every:(\d+)$/.exec(spec.trim());
  if (every) {
    const k = Number(every[1]);
    if (k < 1) throw new InputError(`--layers every:k needs k ≥ 1, got ${k}`);
    // Llama 4's NoPE layers: every k-th layer counting from 1, i.e. 0-based indices k−1, 2k−1, ...
    return new Set(Array.from({ length: count }, (_, i) => i).filter((i) => (i + 1) % k === 0));
  }
  // Digits only: Number('') is 0 and Number('0x3') is 3, which would patch layers nobody named.
  const picked = spec.split(',').map((t) => t.trim());
  const layers = picked.map(Number);
  if (picked.some((t) => !/^[0-9]+$/.test(t))) {
    throw new InputError(`--layers must be a comma-separated list of layer indices or every:k, got '${spec}'`);
  }
  const missing = layers.filter((l) => l >= count);
  if (missing.length) throw new InputError(`--layers ${missing.join(',')}: the model has ${count} attention layers (0..${count - 1})`);
  return new Set(layers);
}
