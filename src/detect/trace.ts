/** Walks along the logits and probabilities of an attention candidate, op by op. */
import { attrInt, Graph } from '../graph/graph';
import { opInfo } from '../graph/ops';
import { NodeProto } from '../io/onnx';

/** One step of the path from the QK MatMul to the Softmax: `node` reads the logits at input `index`. */
export interface Step {
  node: NodeProto;
  index: number;
}

/** True when a tensor depends only on constants and tensor shapes, never on activations' values. */
export function isShapeOrConstant(graph: Graph, name: string): boolean {
  return graph.query.isStatic(name);
}

export interface LogitsSource {
  matmul: NodeProto;
  /** Steps from the MatMul's consumer up to and including the Softmax. */
  path: Step[];
}

/** The letters of a two-operand Einsum equation (`bhqd,bhkd->bhqk`), without ellipses; null otherwise. */
export function einsumTerms(node: NodeProto): { a: string; b: string; out: string } | null {
  const eq = node.attribute.find((x) => x.name === 'equation')?.s;
  if (!eq) return null;
  const m = /^([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]+)$/.exec(Buffer.from(eq).toString().replace(/\s+/g, ''));
  return m ? { a: m[1], b: m[2], out: m[3] } : null;
}

/** A product of two operands that can compute query·keyᵀ: MatMul, com.microsoft FusedMatMul, or Einsum. */
function isProduct(node: NodeProto): boolean {
  return opInfo(node).product === true;
}

/**
 * Which operand of an Einsum is the query: the output's last axis (keys) comes from the other operand only,
 * its second-to-last (query rows) from this one, and some axis is contracted. keras writes the key first
 * (`aecd,abcd->acbe`), torch code usually the query first (`bhqd,bhkd->bhqk`). -1 when it is not query·keyᵀ.
 */
export function einsumQueryOperand(node: NodeProto): number {
  const t = einsumTerms(node);
  if (!t || node.input.length !== 2 || t.out.length < 2) return -1;
  const key = t.out[t.out.length - 1];
  const row = t.out[t.out.length - 2];
  const contracted = [...t.a].some((c) => t.b.includes(c) && !t.out.includes(c));
  if (!contracted) return -1;
  if (t.b.includes(key) && !t.a.includes(key) && t.a.includes(row) && !t.b.includes(row)) return 0;
  if (t.a.includes(key) && !t.b.includes(key) && t.b.includes(row) && !t.a.includes(row)) return 1;
  return -1;
}

/** Finds the MatMul (or Einsum) of two activations whose output reaches `tensor` through logit-carrying ops. */
export function findLogitsMatMul(graph: Graph, tensor: string, softmax: NodeProto): LogitsSource | { why: string } {
  let closest = 'logits not produced by MatMul of two activations';
  const seen = new Set<string>();
  const visit = (name: string, path: Step[]): LogitsSource | null => {
    const node = graph.producer.get(name);
    if (!node || seen.has(name)) return null;
    seen.add(name);
    if (isProduct(node)) {
      const [a, b] = node.input;
      if (isShapeOrConstant(graph, a) || isShapeOrConstant(graph, b)) {
        closest = 'logits come from a MatMul with a constant weight (a projection, not query·key)';
        return null;
      }
      if (node.opType === 'Einsum' && einsumQueryOperand(node) < 0) {
        closest = 'logits come from an Einsum that is not query·keyᵀ (rows from one operand, keys from the other)';
        return null;
      }
      return { matmul: node, path };
    }
    for (const index of opInfo(node).logits ?? []) {
      const input = node.input[index];
      if (!input || isShapeOrConstant(graph, input)) continue;
      const found = visit(input, [{ node, index }, ...path]);
      if (found) return found;
    }
    return null;
  };
  return visit(tensor, [{ node: softmax, index: 0 }]) ?? { why: closest };
}

/** True when `node` multiplies the probabilities `tensor` with values over the key axis. */
function isValueProduct(graph: Graph, node: NodeProto, tensor: string): boolean {
  if ((node.opType === 'MatMul' || node.opType === 'FusedMatMul') && node.input[0] === tensor) {
    if (node.opType === 'FusedMatMul' && (attrInt(node, 'transA') ?? 0) !== 0) return false;
    return !isShapeOrConstant(graph, node.input[1]);
  }
  if (node.opType === 'Einsum' && node.input.length === 2) {
    const t = einsumTerms(node);
    const mine = node.input[0] === tensor ? t?.a : node.input[1] === tensor ? t?.b : undefined;
    const other = node.input[0] === tensor ? node.input[1] : node.input[0];
    if (!t || !mine || isShapeOrConstant(graph, other)) return false;
    const key = mine[mine.length - 1];
    return !t.out.includes(key) && (node.input[0] === tensor ? t.b : t.a).includes(key);
  }
  return false;
}

/**
 * The MatMul that multiplies the probabilities (as its left operand) with values, if any: the probabilities may
 * pass through guards like Where(IsNaN(p), 0, p), Dropout, head masks (Mul), Casts back from fp32, reshapes.
 */
export function findValueMatMul(graph: Graph, tensor: string, seen = new Set<string>()): NodeProto | null {
  if (seen.has(tensor)) return null;
  seen.add(tensor);
  for (const node of graph.consumersOf(tensor)) {
    if (isValueProduct(graph, node, tensor)) return node;
    if (isProduct(node)) continue;
    if (opInfo(node).probs) {
      const found = findValueMatMul(graph, node.output[0], seen);
      if (found) return found;
    }
  }
  return null;
}
