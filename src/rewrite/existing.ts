/**
 * Finds SSMax factors already in a graph, from the graph itself rather than from the metadata record: the
 * apply nodes this tool names `ssmax/L<k>/apply`, and, when names were changed by another tool, the
 * structure every factor has: Mul(logits, f) where f is computed only from constants and Shape(logits)
 * through a Log, and the product flows into a Softmax.
 */
import { Graph } from '../graph/graph';
import { NodeProto } from '../io/onnx';

export interface Factor {
  /** The Mul that applies the factor. */
  apply: NodeProto;
  /** The logits it multiplies (the apply node's other input). */
  logits: string;
  /** The factor tensor s·ln n. */
  factor: string;
  /** Nodes computing the factor that nothing else reads, the apply node included: what a revert removes. */
  nodes: NodeProto[];
  /** The Softmax the scaled logits reach, if any. */
  softmax: NodeProto | null;
  /** Layer from the node name (ssmax/L<k>/apply), when it has one. */
  layer: number | null;
}

const APPLY = /^ssmax\/L(\d+)\/apply/;
const MAX_FACTOR_NODES = 48;
const carriers = new Set(['Add', 'Sub', 'Where', 'Cast', 'Div', 'Mul', 'Reshape', 'Identity', 'Squeeze', 'Unsqueeze', 'Max', 'Min']);

export function findFactors(graph: Graph): Factor[] {
  const out: Factor[] = [];
  for (const node of graph.nodes) {
    if (node.opType !== 'Mul' || (node.domain && node.domain !== 'ai.onnx')) continue;
    const f = asFactor(graph, node);
    if (f) out.push(f);
  }
  return out;
}

function asFactor(graph: Graph, mul: NodeProto): Factor | null {
  const named = APPLY.exec(mul.name);
  for (const i of [0, 1]) {
    const logits = mul.input[i];
    const factor = mul.input[1 - i];
    if (!logits || !factor) continue;
    const nodes = ancestry(graph, factor, logits);
    if (!nodes || !nodes.some((n) => n.opType === 'Log')) continue;
    if (!nodes.some((n) => n.opType === 'Shape' && n.input[0] === logits)) continue;
    const softmax = reachedSoftmax(graph, mul.output[0], 0);
    // Unnamed, the structure alone must sit on attention logits, so a model's own log-length scaling of
    // queries (e.g. Qwen's logn) is not taken for a patch.
    if (!named && !softmax) continue;
    return { apply: mul, logits, factor, nodes: [...exclusive(graph, nodes, mul), mul], softmax, layer: named ? Number(named[1]) : null };
  }
  return null;
}

/** Nodes `name` is computed from, stopping at `stop`; null when it depends on anything but constants and `stop`. */
function ancestry(graph: Graph, name: string, stop: string): NodeProto[] | null {
  const nodes = new Set<NodeProto>();
  const queue = [name];
  const seen = new Set<string>();
  while (queue.length) {
    const n = queue.shift()!;
    if (!n || n === stop || seen.has(n)) continue;
    seen.add(n);
    // An initializer is a leaf even when also a graph input (IR < 4 declares every initializer as one).
    if (graph.initializers.has(n) && !graph.producer.has(n)) continue;
    const p = graph.producer.get(n);
    if (!p) return null;
    if (!nodes.has(p)) {
      nodes.add(p);
      if (nodes.size > MAX_FACTOR_NODES) return null;
      queue.push(...p.input);
    }
  }
  return [...nodes];
}

/** The subset of `nodes` whose outputs only `nodes` and `apply` read. */
function exclusive(graph: Graph, nodes: NodeProto[], apply: NodeProto): NodeProto[] {
  const set = new Set(nodes);
  let changed = true;
  while (changed) {
    changed = false;
    for (const n of [...set]) {
      const readElsewhere = n.output.some((o) => graph.outputs.has(o) || graph.consumersOf(o).some((c) => c !== apply && !set.has(c)));
      if (readElsewhere) {
        set.delete(n);
        changed = true;
      }
    }
  }
  return nodes.filter((n) => set.has(n));
}

function reachedSoftmax(graph: Graph, name: string, depth: number): NodeProto | null {
  if (depth > 8) return null;
  for (const c of graph.consumersOf(name)) {
    if (c.opType === 'Softmax') return c;
    if (carriers.has(c.opType)) {
      const found = reachedSoftmax(graph, c.output[0], depth + 1);
      if (found) return found;
    }
  }
  return null;
}
