/**
 * Removes what nothing reads any more: of the candidate nodes, those whose outputs no graph output, no other node
 * and no subgraph of another node reads (repeatedly, so chains go whole), then the initializers, IR < 4 input
 * declarations and value_info entries only they used. Nodes outside the candidates are never removed.
 */
import { NodeProto } from '../io/onnx';
import { Graph } from './graph';
import { readsOf } from './toposort';

export function removeUnread(graph: Graph, candidates: ReadonlySet<NodeProto>): { nodes: Set<NodeProto>; initializers: Set<string> } {
  const readers = new Map<string, NodeProto[]>();
  for (const n of graph.nodes) for (const name of new Set(readsOf(n))) readers.set(name, [...(readers.get(name) ?? []), n]);
  const removed = new Set(candidates);
  for (let changed = true; changed;) {
    changed = false;
    for (const n of removed) {
      if (n.output.some((o) => graph.outputs.has(o) || (readers.get(o) ?? []).some((r) => !removed.has(r)))) {
        removed.delete(n);
        changed = true;
      }
    }
  }
  const kept = graph.nodes.filter((n) => !removed.has(n));
  const stillRead = new Set([...graph.outputs, ...kept.flatMap((n) => readsOf(n))]);
  const initializers = new Set([...removed].flatMap((n) => n.input)
    .filter((name) => !stillRead.has(name) && graph.proto.initializer.some((t) => t.name === name)));
  const produced = new Set([...removed].flatMap((n) => n.output));
  graph.removeNodes(removed);
  for (const name of initializers) {
    graph.removeInitializer(name);
    if (graph.proto.input.some((v) => v.name === name)) graph.removeInput(name);
  }
  graph.removeValueInfo(produced);
  return { nodes: removed, initializers };
}
