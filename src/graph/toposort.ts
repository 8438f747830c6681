/** Topological order of a graph's nodes, as ONNX requires, with cycles reported as input errors. */
import { InputError } from '../errors';
import { GraphProto, NodeProto } from '../io/onnx';
import { subgraphsOf } from './graph';

/** Names a node reads, including names its subgraphs capture from the enclosing scope. */
export function readsOf(node: NodeProto): string[] {
  const reads = node.input.filter(Boolean);
  for (const g of subgraphsOf(node)) {
    const local = new Set<string>([...g.input.map((v) => v.name), ...g.initializer.map((t) => t.name)]);
    for (const inner of g.node) for (const o of inner.output) local.add(o);
    for (const inner of g.node) for (const name of readsOf(inner)) if (!local.has(name)) reads.push(name);
  }
  return reads;
}

/** Sorts `graph.node` in place (stable: keeps the original order where dependencies allow). */
export function topoSort(graph: GraphProto): void {
  const order = topoOrder(graph);
  if (order.length !== graph.node.length) {
    const placed = new Set(order);
    const stuck = graph.node.find((n) => !placed.has(n));
    throw new InputError(`graph has a cycle through node '${stuck?.name || stuck?.opType}'`);
  }
  graph.node = order;
}

/**
 * The nodes in a topological order, without changing the graph (some files in the wild are stored out of
 * order, which onnxruntime accepts); nodes on a cycle are left out.
 */
export function topoOrder(graph: GraphProto): NodeProto[] {
  const producerIndex = new Map<string, number>();
  graph.node.forEach((n, i) => n.output.forEach((o) => o && producerIndex.set(o, i)));
  const deps = graph.node.map((n) => {
    const set = new Set<number>();
    for (const name of readsOf(n)) {
      const p = producerIndex.get(name);
      if (p !== undefined) set.add(p);
    }
    return set;
  });
  const dependents = graph.node.map(() => [] as number[]);
  deps.forEach((set, i) => set.forEach((d) => dependents[d].push(i)));
  const priority = placement(graph.node.length, dependents);
  const remaining = deps.map((s) => s.size);
  const before = (a: number, b: number): number => priority[a] - priority[b] || a - b;
  const ready = remaining.flatMap((c, i) => (c === 0 ? [i] : []));
  const order: number[] = [];
  while (ready.length) {
    ready.sort(before);
    const i = ready.shift()!;
    order.push(i);
    for (const d of dependents[i]) if (--remaining[d] === 0) ready.push(d);
  }
  return order.map((i) => graph.node[i]);
}

/**
 * Where each node wants to be: its own index, or earlier if something before it needs it. Nodes appended to a
 * sorted graph thereby land just before their first reader, and the original nodes keep their relative order
 * (so removing the appended nodes again gives back the original list).
 */
function placement(count: number, dependents: number[][]): number[] {
  const priority = Array.from({ length: count }, (_, i) => i);
  for (let changed = true, passes = 0; changed && passes < count; passes++) {
    changed = false;
    for (let i = count - 1; i >= 0; i--) {
      for (const d of dependents[i]) {
        if (priority[d] < priority[i]) {
          priority[i] = priority[d];
          changed = true;
        }
      }
    }
  }
  return priority;
}
