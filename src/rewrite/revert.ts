/**
 * Removes an SSMax patch: every consumer of a factor's product reads the original logits again, the nodes
 * and initializers the factor used alone are removed, and the metadata record goes. On a model this tool
 * patched, the result is the original model, node order and bytes included.
 */
import { InputError } from '../errors';
import { Graph, subgraphsOf } from '../graph/graph';
import { GraphProto, ModelProto, NodeProto } from '../io/onnx';
import { Factor, findFactors } from './existing';
import { findScaleInitializer, removeRecord } from './record';
import { cloneModel, prepareGraph } from './patch';

export interface RevertedSite {
  /** Layer from the node names, or the site's position when names were changed. */
  layer: number;
  apply: string;
  softmax: string | null;
  /** s as it was in the model (one value, or one per head). */
  s: number | number[] | null;
  removedNodes: number;
  removedInitializers: string[];
}

export interface RevertReport {
  sites: RevertedSite[];
  /** Whether the model carried the metadata record (it is removed either way). */
  hadRecord: boolean;
}

export interface RevertOptions {
  sortNodes?: boolean;
}

/** Reverts a copy of `model`; the argument is left unchanged. */
export function revertModel(model: ModelProto, options: RevertOptions = {}): { model: ModelProto; report: RevertReport } {
  const out = cloneModel(model);
  prepareGraph(out.graph!, options.sortNodes);
  const graph = new Graph(out.graph!);
  const factors = findFactors(graph);
  if (factors.length === 0) {
    throw new InputError('no SSMax patch in this model (no ssmax/L<k>/apply node and no SSMax factor before a Softmax): nothing to revert');
  }
  const sites = factors.map((f, i) => describe(graph, f, i));
  for (const f of factors) rewire(graph, f);
  graph.reindex();
  // Shared computations of n go with the last factor that reads them; anything else still reads stays.
  const removed = onlyReadByEachOther(graph, new Set(factors.flatMap((f) => f.nodes)));
  const g = out.graph!;
  const dropped = dropUnread(g, removed);
  for (const [i, f] of factors.entries()) {
    sites[i].removedNodes = f.nodes.length;
    sites[i].removedInitializers = [...new Set(f.nodes.flatMap((n) => n.input))].filter((n) => dropped.has(n));
  }
  const hadRecord = removeRecord(out);
  return { model: out, report: { sites, hadRecord } };
}

function describe(graph: Graph, f: Factor, index: number): RevertedSite {
  const sName = findScaleInitializer(graph, f.apply, f.factor, f.logits);
  const value = sName ? graph.constValue(sName) : null;
  const s = value ? (value.values.length === 1 ? value.values[0] : value.values) : null;
  return {
    layer: f.layer ?? index, apply: f.apply.name || f.apply.output[0], softmax: f.softmax ? f.softmax.name || f.softmax.output[0] : null,
    s, removedNodes: 0, removedInitializers: [],
  };
}

/** The subset of `nodes` whose outputs no node outside the subset reads (and that are no graph outputs). */
function onlyReadByEachOther(graph: Graph, nodes: Set<NodeProto>): Set<NodeProto> {
  for (let changed = true; changed;) {
    changed = false;
    for (const n of [...nodes]) {
      if (n.output.some((o) => graph.outputs.has(o) || graph.consumersOf(o).some((c) => !nodes.has(c)))) {
        nodes.delete(n);
        changed = true;
      }
    }
  }
  return nodes;
}

/** Every reader of the scaled value reads the original (logits or query) again. */
function rewire(graph: Graph, f: Factor): void {
  const product = f.product;
  if (graph.outputs.has(product)) throw new InputError(`cannot revert: the scaled logits '${product}' are a graph output`);
  for (const c of graph.consumersOf(product)) {
    c.input.forEach((name, i) => {
      if (name === product) c.input[i] = f.logits;
    });
  }
}

/**
 * Removes the factor nodes, then the initializers (and, below IR 4, their graph inputs) and value_info
 * entries that only they used. Returns the initializer names removed.
 */
function dropUnread(g: GraphProto, removed: Set<NodeProto>): Set<string> {
  const candidates = new Set([...removed].flatMap((n) => n.input));
  const produced = new Set([...removed].flatMap((n) => n.output));
  g.node = g.node.filter((n) => !removed.has(n));
  const read = new Set<string>(g.output.map((v) => v.name));
  const collect = (nodes: NodeProto[]): void => {
    for (const n of nodes) {
      for (const i of n.input) read.add(i);
      for (const sub of subgraphsOf(n)) collect(sub.node);
    }
  };
  collect(g.node);
  const drop = new Set([...candidates].filter((name) => !read.has(name) && g.initializer.some((t) => t.name === name)));
  g.initializer = g.initializer.filter((t) => !drop.has(t.name));
  g.input = g.input.filter((v) => !drop.has(v.name));
  g.valueInfo = g.valueInfo.filter((v) => !produced.has(v.name));
  return drop;
}
