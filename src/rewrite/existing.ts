/**
 * Finds SSMax factors already in a graph, from the graph itself rather than from the metadata record (for a model
 * whose record another tool stripped): the apply nodes this tool names (identity.ts), and, when names were changed
 * too, the structure
 * every factor has: Mul(x, f) where f is a small computation (from shapes, constants and masks) through a Log,
 * and the product reaches a Softmax, directly (x = the logits) or as the left operand of the QK MatMul (x = the
 * query).
 */
import { Graph } from '../graph/graph';
import { opInfo } from '../graph/ops';
import { isDefaultDomain, NodeProto } from '../io/onnx';
import { applyLayer, isApplyCast, isPatchNode } from '../identity';

/** @internal */
export interface Factor {
  /** The Mul that applies the factor. */
  apply: NodeProto;
  /** What the factor multiplies: the logits or the query (before any Cast to fp32 around a half-precision Mul). */
  logits: string;
  /** The tensor readers of the scaled value read: the Mul's output, or the Cast back to half precision. */
  product: string;
  /** The factor tensor (s·ln n or a preset's form). */
  factor: string;
  /** Nodes computing the factor, the apply node and its Casts included; some may be shared with other factors. */
  nodes: NodeProto[];
  /** The Softmax the scaled value reaches, if any. */
  softmax: NodeProto | null;
  /** Layer from the apply node's name (identity.ts), when it has one. */
  layer: number | null;
}

const MAX_FACTOR_NODES = 64;

/** @internal */
export function findFactors(graph: Graph): Factor[] {
  const muls = graph.nodes.filter((n) => n.opType === 'Mul' && isDefaultDomain(n.domain));
  return muls.map((mul) => asFactor(graph, mul)).filter((f): f is Factor => f !== null);
}

function asFactor(graph: Graph, mul: NodeProto): Factor | null {
  const layer = applyLayer(mul.name);
  const named = layer !== null;
  for (const i of named ? [0] : [0, 1]) {
    const x = mul.input[i];
    const factor = mul.input[1 - i];
    if (!x || !factor) continue;
    const nodes = ancestry(graph, factor, x, named);
    if (!nodes || !nodes.some((n) => n.opType === 'Log')) continue;
    const widen = single(graph.producer.get(x), 'Cast');
    const narrow = single(graph.consumersOf(mul.output[0])[0], 'Cast');
    const inCast = widen && graph.consumersOf(x).length === 1 && (named ? isApplyCast(widen.name) : true) ? widen : null;
    const outCast = narrow && inCast && graph.consumersOf(mul.output[0]).length === 1 ? narrow : null;
    const product = outCast ? outCast.output[0] : mul.output[0];
    const softmax = reachedSoftmax(graph, product, 0);
    // Unnamed, the structure alone must sit on attention, so a model's own log-length scaling of queries
    // (e.g. Qwen's logn) is not taken for a patch.
    if (!named && !softmax) continue;
    const casts = [inCast, outCast].filter((n): n is NodeProto => Boolean(n));
    return {
      apply: mul, logits: inCast ? inCast.input[0] : x, product, factor, nodes: [...nodes, ...casts, mul], softmax,
      layer,
    };
  }
  return null;
}

function single(node: NodeProto | undefined, opType: string): NodeProto | null {
  return node && node.opType === opType ? node : null;
}

/**
 * Nodes `name` is computed from, stopping at `stop`, at graph inputs and initializers, at the inputs of Shape
 * nodes (a factor reads shapes, not values), and, for a named factor, at every node this tool did not insert.
 * Null when the walk grows past what a factor can be.
 */
function ancestry(graph: Graph, name: string, stop: string, named: boolean): NodeProto[] | null {
  const nodes = new Set<NodeProto>();
  const queue = [name];
  const seen = new Set<string>();
  while (queue.length) {
    const n = queue.shift()!;
    if (!n || n === stop || seen.has(n)) continue;
    seen.add(n);
    const p = graph.producer.get(n);
    if (!p || (named && !isPatchNode(p))) continue;
    if (!nodes.has(p)) {
      nodes.add(p);
      if (nodes.size > MAX_FACTOR_NODES) return null;
      if (p.opType !== 'Shape') queue.push(...p.input);
    }
  }
  return [...nodes];
}

/** The Softmax a scaled value reaches: through logit carriers, or as the left operand of the QK MatMul. */
function reachedSoftmax(graph: Graph, name: string, depth: number): NodeProto | null {
  if (depth > 10) return null;
  for (const c of graph.consumersOf(name)) {
    if (c.opType === 'Softmax') return c;
    const query = c.opType === 'MatMul' && c.input[0] === name && depth === 0;
    if (opInfo(c).logits || query) {
      const found = reachedSoftmax(graph, c.output[0], depth + 1);
      if (found) return found;
    }
  }
  return null;
}
