/**
 * Tells whether the mask applied to a site's logits is causal, so that `--n auto` can pick n_i = position + 1
 * for causal attention and n = key count otherwise.
 */
import { Graph, nodeLabel } from '../graph/graph';
import { ConstTensor } from '../graph/tensor';
import { Step } from './trace';
import type { MaskVerdict } from '../graph/attention-ops/types';

export type { MaskVerdict } from '../graph/attention-ops/types';

const comparisons = new Set(['Less', 'Greater', 'LessOrEqual', 'GreaterOrEqual']);

/** The mask tensors a path applies after the insertion point: Add/Sub operands, Where conditions and fills. */
export function maskOperands(path: Step[]): string[] {
  const masks: string[] = [];
  for (const { node, index } of path) {
    if (node.opType === 'Add' || node.opType === 'Sub') masks.push(node.input[1 - index]);
    if (node.opType === 'Where') masks.push(node.input[0], node.input[index === 1 ? 2 : 1]);
  }
  return masks.filter(Boolean);
}

/** `none`: the reason when there is no mask. */
export function classifyMasks(graph: Graph, masks: string[], none = 'no mask on the logits'): MaskVerdict {
  if (masks.length === 0) return { causal: false, reason: none };
  for (const m of masks) {
    const why = causalEvidence(graph, m);
    if (why) return { causal: true, reason: why };
  }
  return { causal: false, reason: 'mask is not causal (no triangular constant, Trilu or position comparison)' };
}

/** Searches the mask's ancestry for a triangular constant, a Trilu, or a comparison of two Ranges. */
export function causalEvidence(graph: Graph, mask: string): string | null {
  return graph.query.first('causal', mask, (name, node) => {
    const value = graph.constValue(name);
    if (value && isTriangular(value)) return `causal: mask derives from triangular constant '${name}'`;
    if (node?.opType === 'Trilu') return `causal: mask built by Trilu '${nodeLabel(node)}'`;
    if (node && comparisons.has(node.opType) && node.input.every((i) => graph.query.reachesOp(i, 'Range'))) {
      return `causal: mask compares positions (${node.opType} of Ranges)`;
    }
    return value ? null : undefined;
  }) ?? null;
}

/** True when the last two axes hold a lower-triangular keep pattern (bool/0-1 keep mask or additive mask). */
export function isTriangular(t: ConstTensor): boolean {
  if (t.dims.length < 2) return false;
  const [rows, cols] = t.dims.slice(-2);
  if (rows < 2 || cols < 2) return false;
  const additive = t.values.some((v) => v < -1);
  const keep = (v: number): boolean => (additive ? v > -1 : v !== 0);
  const n = Math.min(rows, cols, 64);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      if (keep(t.values[i * cols + j]) !== j <= i) return false;
    }
  }
  return true;
}
