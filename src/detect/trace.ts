/** Walks along the logits and probabilities of an attention candidate, op by op. */
import { Graph } from '../graph/graph';
import { NodeProto } from '../io/onnx';

/** One step of the path from the QK MatMul to the Softmax: `node` reads the logits at input `index`. */
export interface Step {
  node: NodeProto;
  index: number;
}

/** Ops that carry the logits toward the Softmax, and which inputs may carry them. */
const logitCarriers: Record<string, number[]> = {
  Cast: [0], Identity: [0], Reshape: [0], Div: [0], Mul: [0, 1], Add: [0, 1], Sub: [0], Where: [1, 2],
  Squeeze: [0], Unsqueeze: [0], Max: [0, 1], Min: [0, 1],
};

const MAX_DEPTH = 12;

/** True when a tensor depends only on constants and tensor shapes, never on activations' values. */
export function isShapeOrConstant(graph: Graph, name: string, depth = 0): boolean {
  if (!name) return true;
  if (graph.isConstant(name)) return true;
  if (graph.inputs.has(name) || depth > MAX_DEPTH) return false;
  const node = graph.producer.get(name);
  if (!node) return false;
  if (node.opType === 'Shape' || node.opType === 'Size') return true;
  return node.input.every((i) => isShapeOrConstant(graph, i, depth + 1));
}

export interface LogitsSource {
  matmul: NodeProto;
  /** Steps from the MatMul's consumer up to and including the Softmax. */
  path: Step[];
}

/** Finds the MatMul of two activations whose output reaches `tensor` through logit-carrying ops. */
export function findLogitsMatMul(graph: Graph, tensor: string, softmax: NodeProto): LogitsSource | { why: string } {
  let closest = 'logits not produced by MatMul of two activations';
  const visit = (name: string, path: Step[], depth: number): LogitsSource | null => {
    const node = graph.producer.get(name);
    if (!node || depth > MAX_DEPTH) return null;
    if (node.opType === 'MatMul') {
      const [a, b] = node.input;
      if (isShapeOrConstant(graph, a) || isShapeOrConstant(graph, b)) {
        closest = 'logits come from a MatMul with a constant weight (a projection, not query·key)';
        return null;
      }
      return { matmul: node, path };
    }
    const carriers = logitCarriers[node.opType];
    if (!carriers) return null;
    for (const index of carriers) {
      const input = node.input[index];
      if (!input || isShapeOrConstant(graph, input)) continue;
      const found = visit(input, [{ node, index }, ...path], depth + 1);
      if (found) return found;
    }
    return null;
  };
  return visit(tensor, [{ node: softmax, index: 0 }], 0) ?? { why: closest };
}

/** Ops the probabilities may pass through on their way to the value MatMul. */
const probabilityCarriers = new Set(['Cast', 'Dropout', 'Identity', 'Reshape', 'Where', 'Squeeze', 'Unsqueeze']);

/** The MatMul that multiplies the probabilities (as its left operand) with values, if any. */
export function findValueMatMul(graph: Graph, tensor: string, depth = 0): NodeProto | null {
  if (depth > MAX_DEPTH) return null;
  for (const node of graph.consumersOf(tensor)) {
    if (node.opType === 'MatMul' && node.input[0] === tensor) {
      if (!isShapeOrConstant(graph, node.input[1])) return node;
      continue;
    }
    if (probabilityCarriers.has(node.opType)) {
      const found = findValueMatMul(graph, node.output[0], depth + 1);
      if (found) return found;
    }
  }
  return null;
}
