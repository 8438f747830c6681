/**
 * Topological order of a graph's nodes, as ONNX requires. A cycle found while sorting is a CycleError: validate.ts
 * reports one in a model as read as an input error; one in a graph the patch edited is a bug (an internal error).
 */
import { GraphProto, NodeProto } from '../io/onnx';
import { subgraphsOf } from './node';

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

export class CycleError extends Error {
  constructor(readonly node: string) {
    super(`graph has a cycle through node '${node}'`);
  }
}

/**
 * Sorts `graph.node` in place (stable: keeps the original order where dependencies allow).
 * @internal
 */
export function topoSort(graph: GraphProto): void {
  const order = topoOrder(graph);
  if (order.length !== graph.node.length) {
    const placed = new Set(order);
    const stuck = graph.node.find((n) => !placed.has(n));
    throw new CycleError(stuck?.name || stuck?.opType || '?');
  }
  graph.node = order;
}

/**
 * The nodes in a topological order, without changing the graph (some files in the wild are stored out of
 * order, which onnxruntime accepts); nodes on a cycle are left out. Among the nodes ready to go, the one that
 * wants to be earliest (see placement) goes first: O((nodes + edges) · log nodes).
 */
export function topoOrder(graph: GraphProto): NodeProto[] {
  const { deps, dependents } = edges(graph.node);
  const priority = placement(deps, dependents);
  const before = (a: number, b: number): boolean => priority[a] < priority[b] || (priority[a] === priority[b] && a < b);
  return kahn(deps, dependents, new Heap(before)).map((i) => graph.node[i]);
}

function edges(nodes: NodeProto[]): { deps: number[][]; dependents: number[][] } {
  const producerIndex = new Map<string, number>();
  nodes.forEach((n, i) => n.output.forEach((o) => o && producerIndex.set(o, i)));
  const deps = nodes.map((n) => [...new Set(readsOf(n).map((name) => producerIndex.get(name)).filter((p): p is number => p !== undefined))]);
  const dependents = nodes.map(() => [] as number[]);
  deps.forEach((list, i) => list.forEach((d) => dependents[d].push(i)));
  return { deps, dependents };
}

/** Kahn's algorithm: a node is placed once everything it reads is; `ready` decides among the ready ones. */
function kahn(deps: number[][], dependents: number[][], ready: Heap | number[]): number[] {
  const remaining = deps.map((d) => d.length);
  remaining.forEach((c, i) => c === 0 && ready.push(i));
  const order: number[] = [];
  for (let i = ready.pop(); i !== undefined; i = ready.pop()) {
    order.push(i);
    for (const d of dependents[i]) if (--remaining[d] === 0) ready.push(d);
  }
  return order;
}

/**
 * Where each node wants to be: the smallest index among itself and everything that reads it, directly or not.
 * Nodes appended to a sorted graph thereby land just before their first reader, and the original nodes keep
 * their relative order (so removing the appended nodes again gives back the original list). One pass over the
 * nodes in reverse topological order.
 */
function placement(deps: number[][], dependents: number[][]): number[] {
  const order = kahn(deps, dependents, []); // a plain stack: any topological order will do
  const priority = deps.map((_, i) => i);
  for (let k = order.length - 1; k >= 0; k--) {
    const i = order[k];
    for (const d of dependents[i]) if (priority[d] < priority[i]) priority[i] = priority[d];
  }
  return priority;
}

class Heap {
  private readonly items: number[] = [];

  constructor(private readonly before: (a: number, b: number) => boolean) {}

  push(i: number): void {
    const a = this.items;
    a.push(i);
    for (let k = a.length - 1; k > 0;) {
      const parent = (k - 1) >> 1;
      if (!this.before(a[k], a[parent])) break;
      [a[k], a[parent]] = [a[parent], a[k]];
      k = parent;
    }
  }

  pop(): number | undefined {
    const a = this.items;
    if (a.length === 0) return undefined;
    const top = a[0];
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      for (let k = 0; ;) {
        const l = 2 * k + 1, r = l + 1;
        let m = k;
        if (l < a.length && this.before(a[l], a[m])) m = l;
        if (r < a.length && this.before(a[r], a[m])) m = r;
        if (m === k) break;
        [a[k], a[m]] = [a[m], a[k]];
        k = m;
      }
    }
    return top;
  }
}
