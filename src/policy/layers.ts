/** Which attention layers get the factor: all, a list (3, 7, 11), or every k-th ({every: 4} → 3, 7, 11, ...). */
import { InputError, opt } from '../errors';

/** Layers to patch, 0-based in graph order: a list, or every k-th counting from 1 (Llama 4's NoPE layers for k = 4). */
export type LayerSelection = readonly number[] | { every: number };

export type LayerSpec = { kind: 'all' } | { kind: 'list'; layers: number[]; text: string } | { kind: 'every'; k: number; text: string };

/** Checks the selection before the model is read; which layers exist is known only later (selectLayers). */
export function layerSpec(selection: LayerSelection | undefined): LayerSpec {
  if (selection === undefined) return { kind: 'all' };
  if (typeof selection !== 'object' || selection === null) {
    throw new InputError(`${opt('layers')} must be a list of layer indices or { every: k }, got ${JSON.stringify(selection)}`, 'usage');
  }
  if (Array.isArray(selection)) {
    const layers = [...selection] as unknown[];
    if (layers.length === 0 || !layers.every((l) => Number.isSafeInteger(l) && (l as number) >= 0)) {
      throw new InputError(`${opt('layers')} must list layer indices (integers ≥ 0), got ${JSON.stringify(selection)}`, 'usage');
    }
    return { kind: 'list', layers: layers as number[], text: layers.join(',') };
  }
  const k = (selection as { every?: unknown }).every;
  if (typeof k !== 'number' || !Number.isSafeInteger(k) || k < 1) throw new InputError(`${opt('layers', 'every:k')} needs an integer k ≥ 1, got ${JSON.stringify(k)}`, 'usage');
  return { kind: 'every', k, text: `every:${k}` };
}

export function selectLayers(spec: LayerSpec, count: number): Set<number> {
  const all = Array.from({ length: count }, (_, i) => i);
  // Llama 4's NoPE layers: every k-th layer counting from 1, i.e. 0-based indices k−1, 2k−1, ...
  if (spec.kind === 'every') return new Set(all.filter((i) => (i + 1) % spec.k === 0));
  if (spec.kind === 'all') return new Set(all);
  const missing = spec.layers.filter((l) => l >= count);
  if (missing.length) throw new InputError(`${opt('layers', missing.join(','))}: the model has ${count} attention layers (0..${count - 1})`, 'usage');
  return new Set(spec.layers);
}
