/** Walks along the logits and probabilities of an attention candidate, op by op. */
import { attrInt, attrString, Graph } from '../graph/graph';
import { DimReader, opInfo } from '../graph/ops';
import { NodeProto } from '../io/onnx';

/** One step of the path from the QK MatMul to the Softmax: `node` reads the logits at input `index`. */
export interface Step { node: NodeProto; index: number }

/** The letters of a two-operand Einsum equation (`bhqd,bhkd->bhqk`), without ellipses; null otherwise. */
export function einsumTerms(node: NodeProto): { a: string; b: string; out: string } | null {
  const eq = attrString(node, 'equation');
  if (!eq) return null;
  const m = /^([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]+)$/.exec(eq.replace(/\s+/g, ''));
  return m ? { a: m[1], b: m[2], out: m[3] } : null;
}

/**
 * Which operand of an Einsum is the query: the output's last axis (keys) comes from the other operand only,
 * its second-to-last (query rows) from this one, and some axis is contracted. keras writes the key first
 * (`aecd,abcd->acbe`), torch code usually the query first (`bhqd,bhkd->bhqk`). -1 when it is not query·keyᵀ.
 */
export function einsumQueryOperand(node: NodeProto): number {
  const t = einsumTerms(node);
  if (!t || node.input.length !== 2 || t.out.length < 2) return -1;
  const [row, key] = t.out.slice(-2);
  const contracted = [...t.a].some((c) => t.b.includes(c) && !t.out.includes(c));
  if (!contracted) return -1;
  if (t.b.includes(key) && !t.a.includes(key) && t.a.includes(row) && !t.b.includes(row)) return 0;
  if (t.a.includes(key) && !t.b.includes(key) && t.b.includes(row) && !t.a.includes(row)) return 1;
  return -1;
}

/** Where a walk stopped without finding what it looked for, and why. */
export interface WalkStop { at: NodeProto; reason: string }

/**
 * Finds the MatMul (or Einsum) of two activations whose output reaches `tensor` through logit-carrying ops,
 * depth first in input order, each tensor once, with the `path` from its consumer up to and including the
 * Softmax. Otherwise it says where it stopped: at the last product that is not query·keyᵀ, else where the
 * logits' path first ended (an op that carries no logits, or a graph input).
 */
export function findLogitsMatMul(graph: Graph, shapes: DimReader, tensor: string, softmax: NodeProto): { matmul: NodeProto; path: Step[] } | WalkStop {
  let stop: WalkStop | undefined;
  let end: NodeProto | undefined;
  const seen = new Set<string>();
  const stack: { name: string; path: Step[] }[] = [{ name: tensor, path: [{ node: softmax, index: 0 }] }];
  while (stack.length) {
    const { name, path } = stack.pop()!;
    if (seen.has(name)) continue;
    seen.add(name);
    // Logits that come into a function body through an input were made by the caller: the site is not the body's.
    const node = graph.isBound(name) ? undefined : graph.producer.get(name);
    const info = node ? opInfo(node) : {};
    if (node && info.product) {
      if (graph.query.isStatic(node.input[0]) || graph.query.isStatic(node.input[1])) {
        stop = { at: node, reason: 'logits come from a MatMul with a constant weight (a projection, not query·key)' };
      } else if (node.opType === 'Einsum' && einsumQueryOperand(node) < 0) {
        stop = { at: node, reason: 'logits come from an Einsum that is not query·keyᵀ (rows from one operand, keys from the other)' };
      } else return { matmul: node, path };
    } else if (node && info.logits && (!info.logitsIf || info.logitsIf(node, shapes, graph.producer))) {
      const carried = info.logits.filter((i) => node.input[i] && !graph.query.isStatic(node.input[i]));
      for (const index of carried.reverse()) stack.push({ name: node.input[index], path: [{ node, index }, ...path] });
    } else end ??= node ?? path[0].node; // an op that carries no logits, or a graph input
  }
  return stop ?? { at: end ?? softmax, reason: 'logits not produced by MatMul of two activations' };
}

/** True when `node` multiplies the probabilities `tensor` with values over the key axis. */
function isValueProduct(graph: Graph, node: NodeProto, tensor: string): boolean {
  if ((node.opType === 'MatMul' || node.opType === 'FusedMatMul') && node.input[0] === tensor) {
    if (node.opType === 'FusedMatMul' && (attrInt(node, 'transA') ?? 0) !== 0) return false;
    return !graph.query.isStatic(node.input[1]);
  }
  if (node.opType === 'Einsum' && node.input.length === 2) {
    const t = einsumTerms(node);
    const mine = node.input[0] === tensor ? t?.a : node.input[1] === tensor ? t?.b : undefined;
    const other = node.input[0] === tensor ? node.input[1] : node.input[0];
    if (!t || !mine || graph.query.isStatic(other)) return false;
    const key = mine[mine.length - 1];
    return !t.out.includes(key) && (node.input[0] === tensor ? t.b : t.a).includes(key);
  }
  return false;
}

/**
 * The MatMul that multiplies the probabilities (as its left operand) with values, if any: the probabilities may
 * pass through guards like Where(IsNaN(p), 0, p), Dropout, head masks (Mul), Casts back from fp32, reshapes.
 * `ends` collects the readers where the probabilities' path ended without one.
 */
export function findValueMatMul(graph: Graph, tensor: string, ends: NodeProto[] = [], seen = new Set<string>()): NodeProto | null {
  if (seen.has(tensor)) return null;
  seen.add(tensor);
  for (const node of graph.consumersOf(tensor)) {
    if (isValueProduct(graph, node, tensor)) return node;
    if (opInfo(node).product || !opInfo(node).probs) ends.push(node);
    else {
      const found = findValueMatMul(graph, node.output[0], ends, seen);
      if (found) return found;
    }
  }
  return null;
}
