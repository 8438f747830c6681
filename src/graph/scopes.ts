/**
 * Every graph of a model that can hold attention: the main graph, the graphs held in node attributes
 * (If branches, Loop/Scan bodies, GreedySearch/BeamSearch decoders, ...) at any depth, and the bodies of
 * model-local functions. Each scope gets a Graph index that sees its enclosing scope's names, and all of
 * them share one name registry so that inserted names are unique model-wide.
 */
import { AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, toNumber, ValueInfoProto } from '../io/onnx';
import { Graph, NameRegistry, nodeLabel } from './graph';
import { Shapes } from './shapes';
import { topoSort } from './toposort';

export interface Scope {
  /** Where the graph sits, for reports: `main`, `main/<node>.<attribute>`, `function <domain>:<name>`. */
  path: string;
  kind: 'main' | 'subgraph' | 'function';
  graph: Graph;
  /** Default-domain opset in force inside this scope. */
  opset: number;
  /** Shapes, ranks and element types of the scope's tensors (and those it reads from enclosing scopes). */
  /** @internal */
  shapes: Shapes;
  fn?: FunctionProto;
  /** For subgraphs: the node holding it, and that node's scope. */
  owner?: { node: NodeProto; scope: Scope };
  /** Puts the scope's nodes back in topological order after edits (and into the FunctionProto). */
  commit(): void;
}

/**
 * The default-domain import in force: onnxruntime reads the imports in order into one map, '' and 'ai.onnx' being
 * one domain, so of a model importing it twice (21 then 17) the last wins (17: an opset-17 node form loads there,
 * an opset-21 one does not).
 */
export function defaultImport<T extends { domain: string }>(imports: T[]): T | undefined {
  return imports.filter((o) => o.domain === '' || o.domain === 'ai.onnx').pop();
}

export function defaultOpsetOf(imports: { domain: string; version: unknown }[], fallback = 1): number {
  const entry = defaultImport(imports);
  return entry ? toNumber(entry.version as number) : fallback;
}

export function functionKey(domain: string, name: string): string {
  return `${domain}:${name}`;
}

/** The function a node calls, when it calls a model-local function. */
export function calledFunction(model: ModelProto, node: NodeProto): FunctionProto | undefined {
  return model.functions.find((f) => f.name === node.opType && f.domain === node.domain);
}

/** @internal */
export function modelScopes(model: ModelProto): Scope[] {
  const registry = collectNames(model);
  const opset = defaultOpsetOf(model.opsetImport);
  const main = graphScope('main', model.graph!, opset, registry);
  const scopes = [main, ...subScopes(main, registry)];
  for (const fn of model.functions) {
    const fnScope = functionScope(model, fn, scopes, registry);
    scopes.push(fnScope, ...subScopes(fnScope, registry));
  }
  return scopes;
}

function graphScope(path: string, proto: GraphProto, opset: number, registry: NameRegistry,
  owner?: { node: NodeProto; scope: Scope }): Scope {
  const parent = owner?.scope;
  const graph = new Graph(proto, { parent: parent?.graph, registry });
  return {
    path, kind: owner ? 'subgraph' : 'main', graph, opset, owner,
    shapes: new Shapes(graph, parent?.shapes),
    commit: () => topoSort(proto),
  };
}

function subScopes(scope: Scope, registry: NameRegistry): Scope[] {
  const out: Scope[] = [];
  for (const node of scope.graph.nodes) {
    for (const a of node.attribute) {
      for (const [i, g] of graphsOf(a).entries()) {
        const suffix = a.graphs?.length ? `${a.name}[${i}]` : a.name;
        const sub = graphScope(`${scope.path}/${nodeLabel(node)}.${suffix}`, g, scope.opset, registry, { node, scope });
        out.push(sub, ...subScopes(sub, registry));
      }
    }
  }
  return out;
}

function graphsOf(a: AttributeProto): GraphProto[] {
  return a.g ? [a.g] : a.graphs ?? [];
}

/** A function body as a graph: no initializers, inputs untyped, constants only through Constant nodes. */
function functionScope(model: ModelProto, fn: FunctionProto, callers: Scope[], registry: NameRegistry): Scope {
  const valueInfo = (fn as FunctionProto & { valueInfo?: ValueInfoProto[] }).valueInfo ?? [];
  const shim: GraphProto = {
    node: fn.node, name: fn.name, initializer: [], valueInfo,
    input: fn.input.map((name) => ({ name })), output: fn.output.map((name) => ({ name })),
  };
  const graph = new Graph(shim, { registry, constantInputs: constantArguments(model, fn, callers) });
  const opset = defaultOpsetOf(fn.opsetImport, defaultOpsetOf(model.opsetImport));
  return {
    path: `function ${functionKey(fn.domain, fn.name)}`, kind: 'function', graph, opset, fn,
    shapes: new Shapes(graph),
    commit: () => {
      topoSort(shim);
      fn.node = shim.node;
      fn.input = shim.input.map((v) => v.name);
      fn.output = shim.output.map((v) => v.name);
    },
  };
}

/**
 * Function inputs fed by a constant at every call site. Exporters pass weights into functions as inputs;
 * inside the body they are constants, and treating them as activations would make a projection look like
 * query·key.
 */
function constantArguments(model: ModelProto, fn: FunctionProto, callers: Scope[]): Set<string> {
  const calls = callers.flatMap((s) => s.graph.nodes.filter((n) => calledFunction(model, n) === fn).map((n) => ({ n, s })));
  if (calls.length === 0) return new Set();
  return new Set(fn.input.filter((_name, i) => calls.every(({ n, s }) => n.input[i] && s.graph.isConstant(n.input[i]))));
}

/** Every tensor and node name of the model, in every graph and function. */
function collectNames(model: ModelProto): NameRegistry {
  const registry: NameRegistry = { tensors: new Set(), nodes: new Set() };
  const addNodes = (nodes: NodeProto[]): void => {
    for (const n of nodes) {
      if (n.name) registry.nodes.add(n.name);
      for (const name of [...n.input, ...n.output]) if (name) registry.tensors.add(name);
      for (const a of n.attribute) for (const g of graphsOf(a)) addGraph(g);
    }
  };
  const addGraph = (g: GraphProto): void => {
    for (const v of [...g.input, ...g.output, ...g.valueInfo]) registry.tensors.add(v.name);
    for (const t of g.initializer) registry.tensors.add(t.name);
    addNodes(g.node);
  };
  addGraph(model.graph!);
  for (const fn of model.functions) {
    for (const name of [...fn.input, ...fn.output]) registry.tensors.add(name);
    addNodes(fn.node);
  }
  return registry;
}
