/**
 * Head count of an attention site, read from the graph: the head axis of the logits is traced back through
 * Transpose and Reshape to the Reshape that split the hidden size into heads.
 */
import { attrInt, attrInts, Graph, nodeLabel } from '../graph/graph';
import { opInfo } from '../graph/ops';
import { constantOf, div, Poly } from '../graph/poly';
import { Shapes } from '../graph/shapes';
import { NodeProto, toNumber } from '../io/onnx';
import type { HeadInfo } from '../graph/attention-ops/types';

export type { HeadInfo } from '../graph/attention-ops/types';

/** Known elements of a 1-D shape tensor (undefined where computed at run time). */
export function shapeElements(graph: Graph, name: string): (number | undefined)[] | undefined {
  const c = graph.constValue(name);
  if (c) return c.values;
  const node = graph.producer.get(name);
  if (node?.opType === 'Cast' || node?.opType === 'Identity') return shapeElements(graph, node.input[0]);
  if (node?.opType !== 'Concat') return undefined;
  const out: (number | undefined)[] = [];
  for (const piece of node.input) {
    const known = graph.constValue(piece);
    if (known) out.push(...known.values);
    else if (graph.producer.get(piece)?.opType === 'Unsqueeze') out.push(undefined);
    else return undefined;
  }
  return out;
}

/**
 * `queryAxis`: the axis of `query` that becomes the logits' head axis, when the product is not a plain MatMul
 * (an Einsum may take the heads from any axis); `logits`: the logits tensor, whose declared shape is the
 * last resort.
 */
export function inferHeads(graph: Graph, query: string, logitsRank: number | undefined, shapes: Shapes,
  extra: { queryAxis?: number; logits?: string } = {}): HeadInfo {
  if (logitsRank === undefined || logitsRank < 3) return { reason: 'rank of the logits unknown' };
  // The heads are the axis before the rows and keys ([B, H, Tq, Tk]; MaxViT's [B, G, H, P, P]); in [B·H, Tq, Tk]
  // logits they are the inner part of axis 0, looked for at axis 1 of the 4-D source.
  const axis = logitsRank === 3 ? 0 : logitsRank - 3;
  const start = extra.queryAxis ?? axis;
  const found = traceHeadAxis(graph, query, start, logitsRank === 3 && extra.queryAxis === undefined, shapes);
  if (found) return { heads: found.heads, axis, reason: found.reason };
  const declared = logitsRank > 3 && extra.logits ? declaredDim(graph, extra.logits, axis) : undefined;
  if (declared) return { heads: declared, axis, reason: `declared shape of the logits has ${declared} heads at axis ${axis}` };
  const q = logitsRank > 3 ? declaredDim(graph, query, start) : undefined;
  if (q) return { heads: q, axis, reason: `declared shape of the query has ${q} heads at axis ${start}` };
  return { axis, reason: 'no Reshape with a constant head count found on the query path' };
}

/** A positive static dimension from a declared shape, if the graph has one. */
export function declaredDim(graph: Graph, name: string, axis: number): number | undefined {
  const dims = graph.valueInfo.get(name)?.type?.tensorType?.shape?.dim;
  const v = toNumber(dims?.[axis < 0 ? dims.length + axis : axis]?.dimValue);
  return v > 0 ? v : undefined;
}

interface AxisState { name: string; axis: number; merged: boolean }

/**
 * The head count a Reshape folds into axis `axis` of its output, read from the symbolic shapes (torch
 * nn.MultiheadAttention and fairseq compute that dim as Mul(batch, H) at run time): the output dim is H times an
 * input dim, and the input's last dim is H times the output's (the head size).
 */
function foldedHeads(node: NodeProto, axis: number, shapes: Shapes): number | undefined {
  const out = shapes.shape(node.output[0]);
  const input = shapes.shape(node.input[0]);
  if (!out || !input || !out[axis]) return undefined;
  const ratio = (a: Poly | undefined, b: Poly | undefined): number | undefined => {
    const q = a && b ? div(a, b) : undefined;
    const c = q ? constantOf(q) : undefined;
    return c !== undefined && Number.isInteger(c) && c > 1 ? c : undefined;
  };
  const widths = ratio(input[input.length - 1], out[out.length - 1]);
  return input.map((d) => ratio(out[axis], d)).find((h) => h !== undefined && h === widths);
}

/** Depth-first, in input order, each (tensor, axis) once: the first Reshape that names the heads wins. */
function traceHeadAxis(graph: Graph, name: string, axis: number, merged: boolean, shapes: Shapes): { heads: number; reason: string } | null {
  const stack: AxisState[] = [{ name, axis, merged }];
  const seen = new Set<string>();
  while (stack.length) {
    const state = stack.pop()!;
    const key = `${state.name}|${state.axis}|${state.merged}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const step = headStep(graph, state, shapes);
    if (Array.isArray(step)) stack.push(...step.reverse());
    else if (step) return step;
  }
  return null;
}

/** What one tensor says about the head axis: the head count, where to look next, or nothing. */
function headStep(graph: Graph, { name, axis, merged }: AxisState, shapes: Shapes): { heads: number; reason: string } | AxisState[] | null {
  const node = graph.producer.get(name);
  if (!node && !merged) {
    const h = declaredDim(graph, name, axis);
    return h ? { heads: h, reason: `declared shape of '${name}' has ${h} heads at axis ${axis}` } : null;
  }
  if (!node) return null;
  if (node.opType === 'Transpose') {
    const perm = attrInts(node, 'perm');
    return perm ? [{ name: node.input[0], axis: perm[axis], merged }] : null;
  }
  if (node.opType === 'Reshape') {
    // The symbolic shape pass also reads shapes built from slices of Shape (torch's qkv.reshape(B, T, 3, H, d)).
    const shape = shapeElements(graph, node.input[1]) ?? shapes.values(node.input[1])?.map((d) => constantOf(d));
    // [B,H,T,D] -> [B·H,T,D]: heads are axis 1 of the input.
    if (merged && shape?.length === 3 && shapes.rank(node.input[0]) === 4) return [{ name: node.input[0], axis: 1, merged: false }];
    const folded = merged ? foldedHeads(node, axis, shapes) : undefined;
    if (folded) return { heads: folded, reason: `Reshape '${nodeLabel(node)}' folds ${folded} heads into the batch axis (its symbolic shape: batch·${folded})` };
    const h = !merged && shape && shape.length >= 4 ? shape[axis] : undefined;
    return h !== undefined && h > 0 ? { heads: h, reason: `Reshape '${nodeLabel(node)}' splits ${h} heads` } : null;
  }
  if (!merged && (node.opType === 'Squeeze' || node.opType === 'Unsqueeze' || node.opType === 'Split')) {
    const from = axisBefore(graph, node, axis, shapes);
    return from === undefined ? null : [{ name: node.input[0], axis: from, merged }];
  }
  if (node.opType === 'Gather' && !merged) {
    // Picking one slot of a packed [B,S,H,3,D] view (BLOOM's fused QKV) removes an axis before the heads' one.
    const index = graph.constValue(node.input[1]);
    const a = attrInt(node, 'axis') ?? 0;
    if (!index || index.dims.length !== 0 || a < 0) return null;
    return [{ name: node.input[0], axis: axis >= a ? axis + 1 : axis, merged }];
  }
  if (!opInfo(node).keepsAxes) return null;
  return node.input.filter((i) => i && !graph.isConstant(i)).map((i) => ({ name: i, axis, merged }));
}

/**
 * The input axis an output axis of Squeeze, Unsqueeze or Split comes from (a fused QKV [B, T, 3, H, d] split on its
 * third axis and squeezed: `q, k, v = qkv.unbind(2)`); undefined when it is an inserted or split axis, or unknown.
 */
function axisBefore(graph: Graph, node: NodeProto, axis: number, shapes: Shapes): number | undefined {
  const axes = attrInts(node, 'axes') ?? (node.input[1] && node.opType !== 'Split' ? graph.constValue(node.input[1])?.values : undefined);
  if (node.opType === 'Split') return axis === normal(attrInt(node, 'axis') ?? 0, shapes.rank(node.input[0])) ? undefined : axis;
  const rank = node.opType === 'Squeeze' ? shapes.rank(node.input[0]) : shapes.rank(node.output[0]);
  if (!axes || rank === undefined) return undefined;
  const marked = new Set(axes.map((a) => normal(a, rank)));
  // The axes of the longer side that are not squeezed or inserted, in order: the shorter side's axes.
  const kept = Array.from({ length: rank }, (_, i) => i).filter((i) => !marked.has(i));
  if (node.opType === 'Squeeze') return kept[axis];
  return marked.has(axis) ? undefined : kept.indexOf(axis);
}

const normal = (a: number, rank: number | undefined): number => (a < 0 && rank !== undefined ? a + rank : a);
