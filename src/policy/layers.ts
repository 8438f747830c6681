/** Which attention layers get the factor: all, a list ("3,7,11"), or every k-th ("every:4" → 3, 7, 11, ...). */
import { InputError, opt } from '../errors';

export type LayerSpec = { kind: 'all' } | { kind: 'list'; layers: number[]; text: string } | { kind: 'every'; k: number; text: string };

/** Checks the syntax before the model is read; which layers exist is known only later (selectLayers). */
export function parseLayers(spec: string | undefined): LayerSpec {
  if (spec === undefined) return { kind: 'all' };
  const every = /^every:(\d+)$/.exec(spec.trim());
  if (every) {
    const k = Number(every[1]);
    if (k < 1) throw new InputError(`${opt('layers', 'every:k')} needs k ≥ 1, got ${k}`);
    return { kind: 'every', k, text: spec };
  }
  const layers = spec.split(',').map((t) => (/^\d+$/.test(t.trim()) ? Number(t) : NaN));
  if (layers.some((l) => !Number.isSafeInteger(l))) {
    throw new InputError(`${opt('layers')} must be a comma-separated list of layer indices or every:k, got '${spec}'`);
  }
  return { kind: 'list', layers, text: spec };
}

export function selectLayers(spec: LayerSpec, count: number): Set<number> {
  const all = Array.from({ length: count }, (_, i) => i);
  // Llama 4's NoPE layers: every k-th layer counting from 1, i.e. 0-based indices k−1, 2k−1, ...
  if (spec.kind === 'every') return new Set(all.filter((i) => (i + 1) % spec.k === 0));
  if (spec.kind === 'all') return new Set(all);
  const missing = spec.layers.filter((l) => l >= count);
  if (missing.length) throw new InputError(`${opt('layers', missing.join(','))}: the model has ${count} attention layers (0..${count - 1})`);
  return new Set(spec.layers);
}
