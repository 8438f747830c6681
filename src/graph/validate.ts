/**
 * Structural checks of a graph before anything walks it: every tensor defined once, every name a node reads
 * defined somewhere, nodes in topological order, no cycles, graph outputs produced. Each problem is one
 * InputError naming the node and tensor involved.
 */
import { InputError, opt } from '../errors';
import { GraphProto, NodeProto } from '../io/onnx';
import { nodeLabel, subgraphsOf } from './graph';
import { readsOf, topoSort } from './toposort';

export interface ValidateOptions {
  /** Accept nodes out of topological order (the caller sorts them); cycles are still refused. */
  allowUnsorted?: boolean;
}

export function validateGraph(graph: GraphProto, options: ValidateOptions = {}): void {
  check(graph, new Set(), 'the graph', options);
}

function check(g: GraphProto, outer: Set<string>, where: string, options: ValidateOptions): void {
  const producer = definitions(g, where);
  const available = new Set<string>([...outer, ...g.input.map((v) => v.name), ...g.initializer.map((t) => t.name)]);
  const visible = new Set<string>([...available, ...producer.keys()]);
  let unsorted: string | null = null;
  g.node.forEach((node, i) => {
    if (!node.opType) throw new InputError(`${where}: node #${i} ('${nodeLabel(node)}') has no op_type`);
    for (const name of readsOf(node)) {
      if (available.has(name)) continue;
      const p = producer.get(name);
      if (!p) throw new InputError(`${where}: node '${nodeLabel(node)}' reads '${name}', which no node, initializer or input defines`);
      unsorted ??= `node '${nodeLabel(node)}' reads '${name}' before node '${nodeLabel(p)}' produces it`;
    }
    for (const o of node.output) if (o) available.add(o);
    for (const sub of subgraphsOf(node)) check(sub, visible, `subgraph of '${nodeLabel(node)}'`, options);
  });
  for (const v of g.output) {
    if (!available.has(v.name)) throw new InputError(`${where}: output '${v.name}' is not produced by any node, initializer or input`);
  }
  if (unsorted) {
    topoSort({ ...g, node: [...g.node] });
    if (!options.allowUnsorted) {
      throw new InputError(`${where}: nodes are not in topological order (${unsorted}); ONNX requires it: ${opt('sortNodes')} sorts them`);
    }
  }
}

/** The node producing each tensor; duplicate definitions are errors. */
function definitions(g: GraphProto, where: string): Map<string, NodeProto> {
  const inputs = new Set<string>();
  for (const v of g.input) {
    if (inputs.has(v.name)) throw new InputError(`${where}: input '${v.name}' is declared twice`);
    inputs.add(v.name);
  }
  const initializers = new Set<string>();
  for (const t of g.initializer) {
    if (initializers.has(t.name)) throw new InputError(`${where}: two initializers are named '${t.name}'`);
    initializers.add(t.name);
  }
  const producer = new Map<string, NodeProto>();
  for (const node of g.node) {
    for (const o of node.output) {
      if (!o) continue;
      const other = producer.get(o);
      if (other) throw new InputError(`${where}: tensor '${o}' is produced twice (by '${nodeLabel(other)}' and '${nodeLabel(node)}')`);
      if (inputs.has(o) || initializers.has(o)) {
        throw new InputError(`${where}: node '${nodeLabel(node)}' produces '${o}', which is already ${inputs.has(o) ? 'a graph input' : 'an initializer'}`);
      }
      producer.set(o, node);
    }
  }
  return producer;
}

