/**
 * Head count of an attention site, read from the graph: the head axis of the logits is traced back through
 * Transpose and Reshape to the Reshape that split the hidden size into heads.
 */
import { attrInts, Graph } from '../graph/graph';

export interface HeadInfo {
  heads?: number;
  /** Axis of the logits that indexes heads (1 for [B,H,Tq,Tk]; 0 for [B·H,Tq,Tk], where it is merged with batch). */
  axis?: number;
  reason: string;
}

const passThrough = new Set(['Cast', 'Identity', 'Mul', 'Div', 'Add', 'Sub', 'Neg', 'Concat', 'Slice']);

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

export function inferHeads(graph: Graph, query: string, logitsRank: number | undefined, ranks: Map<string, number>): HeadInfo {
  if (logitsRank !== 3 && logitsRank !== 4) return { reason: 'rank of the logits unknown' };
  // In [B·H, Tq, Tk] logits the heads are the inner part of axis 0; we look for them at axis 1 of the 4-D source.
  const found = traceHeadAxis(graph, query, logitsRank === 4 ? 1 : 0, logitsRank === 3, ranks, 0);
  return found
    ? { heads: found.heads, axis: logitsRank === 4 ? 1 : 0, reason: found.reason }
    : { axis: logitsRank === 4 ? 1 : 0, reason: 'no Reshape with a constant head count found on the query path' };
}

function traceHeadAxis(
  graph: Graph, name: string, axis: number, merged: boolean, ranks: Map<string, number>, depth: number,
): { heads: number; reason: string } | null {
  const node = graph.producer.get(name);
  if (!node || depth > 24) return null;
  if (node.opType === 'Transpose') {
    const perm = attrInts(node, 'perm');
    if (!perm || merged) return null;
    return traceHeadAxis(graph, node.input[0], perm[axis], merged, ranks, depth + 1);
  }
  if (node.opType === 'Reshape') {
    const shape = shapeElements(graph, node.input[1]);
    const inRank = ranks.get(node.input[0]);
    if (merged && shape?.length === 3 && inRank === 4) {
      // [B,H,T,D] -> [B·H,T,D]: heads are axis 1 of the input.
      return traceHeadAxis(graph, node.input[0], 1, false, ranks, depth + 1);
    }
    if (!merged && shape && shape.length === 4) {
      const h = shape[axis];
      if (h !== undefined && h > 0) return { heads: h, reason: `Reshape '${node.name || node.output[0]}' splits ${h} heads` };
    }
    return null;
  }
  if (passThrough.has(node.opType)) {
    for (const input of node.input) {
      if (!input || graph.isConstant(input)) continue;
      const found = traceHeadAxis(graph, input, axis, merged, ranks, depth + 1);
      if (found) return found;
    }
  }
  return null;
}
