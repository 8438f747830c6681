/**
 * Every graph of a model that can hold attention: the main graph, the graphs held in node attributes
 * (If branches, Loop/Scan bodies, GreedySearch/BeamSearch decoders, ...) at any depth, and the bodies of
 * model-local functions. Each scope gets a Graph index that sees its enclosing scope's names, and all of
 * them share one name registry so that inserted names are unique model-wide.
 *
 * A function body is read through its calls: its inputs are bound to what the first call passes (the caller's
 * producers, constants and shapes), so a mask that comes in as an input is seen as the mask it is. Shapes are
 * bound only where every call agrees on them; `perCall` gives the body bound to each call alone, for detection
 * to check that every call sees the same attention (find-attention.ts).
 */
import { AttributeProto, FunctionProto, GraphProto, isDefaultDomain, ModelProto, NodeProto, toNumber, ValueInfoProto } from '../io/onnx';
import { Graph, NameRegistry, nodeLabel } from './graph';
import { Poly, show, sym } from './poly';
import { CallShapes, Shapes } from './shapes';
import { opInfo } from './ops';
import { readsOf, topoSort } from './toposort';
import type { ValueReads } from './view';

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
  /**
   * For a function body bound to its calls (those from graphs, not from other functions' bodies): each call and its
   * scope, in graph order; the body's inputs stand for the first call's arguments.
   * @internal
   */
  calls?: FunctionCall[];
  /**
   * For a function body with several calls: the body bound to each call alone, in the order of `calls`.
   * @internal
   */
  perCall?: () => Scope[];
  /** Puts the scope's nodes back in topological order after edits (and into the FunctionProto). */
  commit(): void;
}

/**
 * The default-domain import in force: onnxruntime reads the imports in order into one map, '' and 'ai.onnx' being
 * one domain, so of a model importing it twice (21 then 17) the last wins (17: an opset-17 node form loads there,
 * an opset-21 one does not).
 */
export function defaultImport<T extends { domain: string }>(imports: T[]): T | undefined {
  return imports.filter((o) => isDefaultDomain(o.domain)).pop();
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

/**
 * A call of a model-local function from a graph (not from another function's body).
 * @internal
 */
export interface FunctionCall { node: NodeProto; scope: Scope }

/** @internal */
export function modelScopes(model: ModelProto): Scope[] {
  const registry = collectNames(model);
  const opset = defaultOpsetOf(model.opsetImport);
  const calls = callShapes(model);
  const reads = callValueReads(model);
  const main = graphScope('main', model.graph!, opset, { registry, valueReads: reads }, calls);
  const scopes = [main, ...subScopes(main, { registry, valueReads: reads }, calls)];
  for (const fn of model.functions) {
    const fnScope = functionScope(model, fn, scopes, { registry, valueReads: reads });
    scopes.push(fnScope, ...subScopes(fnScope, { registry, valueReads: reads }));
  }
  return scopes;
}

/** What every graph of a model shares: the name registry, and what calls of its functions compute their outputs from. */
interface ModelContext { registry: NameRegistry; valueReads?: ValueReads }

function graphScope(path: string, proto: GraphProto, opset: number, ctx: ModelContext, calls: CallShapes,
  owner?: { node: NodeProto; scope: Scope }): Scope {
  const parent = owner?.scope;
  const graph = new Graph(proto, { parent: parent?.graph, ...ctx });
  return {
    path, kind: owner ? 'subgraph' : 'main', graph, opset, owner,
    shapes: new Shapes(graph, parent?.shapes, { calls }),
    commit: () => topoSort(proto),
  };
}

function subScopes(scope: Scope, ctx: ModelContext, calls?: CallShapes): Scope[] {
  const out: Scope[] = [];
  for (const node of scope.graph.nodes) {
    for (const a of node.attribute) {
      for (const [i, g] of graphsOf(a).entries()) {
        const suffix = a.graphs?.length ? `${a.name}[${i}]` : a.name;
        const sub = graphScope(`${scope.path}/${nodeLabel(node)}.${suffix}`, g, scope.opset, ctx, calls ?? noCalls, { node, scope });
        out.push(sub, ...subScopes(sub, ctx, calls));
      }
    }
  }
  return out;
}

function graphsOf(a: AttributeProto): GraphProto[] {
  return a.g ? [a.g] : a.graphs ?? [];
}

/**
 * A function body as a graph: no initializers, inputs untyped, constants only through Constant nodes. Bound to its
 * calls from graphs; a body only other functions call keeps its inputs as inputs, those fed by a constant at every
 * call as constants.
 */
function functionScope(model: ModelProto, fn: FunctionProto, callers: Scope[], ctx: ModelContext): Scope {
  const shim = bodyGraph(fn);
  const calls = callsOf(model, fn, callers);
  const opset = defaultOpsetOf(fn.opsetImport, defaultOpsetOf(model.opsetImport));
  const bodyScope = (graph: Graph, shapes: Shapes): Scope => ({
    path: `function ${functionKey(fn.domain, fn.name)}`, kind: 'function', graph, opset, fn, shapes,
    commit: () => {
      topoSort(shim);
      fn.node = shim.node;
      fn.input = shim.input.map((v) => v.name);
      fn.output = shim.output.map((v) => v.name);
    },
  });
  if (calls.length === 0) {
    const graph = new Graph(shim, { ...ctx, constantInputs: constantArguments(model, fn, callers) });
    return bodyScope(graph, new Shapes(graph));
  }
  const boundTo = (call: FunctionCall, shapes: ReadonlyMap<string, Poly[] | undefined>): Scope => {
    const graph = new Graph(shim, { ...ctx, parent: call.scope.graph, bound: bindings(fn, call.node) });
    return bodyScope(graph, new Shapes(graph, call.scope.shapes, { given: shapes }));
  };
  const scope = { ...boundTo(calls[0], agreedShapes(fn, calls)), calls };
  if (calls.length > 1) scope.perCall = () => calls.map((c) => boundTo(c, agreedShapes(fn, [c])));
  return scope;
}

/** A function body as a GraphProto whose nodes are the body's (edits to one are edits to the other; commit writes back the lists). */
function bodyGraph(fn: FunctionProto): GraphProto {
  const valueInfo = (fn as FunctionProto & { valueInfo?: ValueInfoProto[] }).valueInfo ?? [];
  return {
    node: fn.node, name: fn.name, initializer: [], valueInfo,
    input: fn.input.map((name) => ({ name })), output: fn.output.map((name) => ({ name })),
  };
}

const noCalls: CallShapes = () => undefined;

/**
 * How a graph's shape pass reads a call of a model-local function: the body bound to the call (its inputs the
 * caller's shapes), its outputs' shapes and types. So a second call's input, the first call's output, has a shape.
 * The body's own unknown dims get symbols of this call (named after it), never shared with another call's.
 */
function callShapes(model: ModelProto): CallShapes {
  if (model.functions.length === 0) return noCalls;
  return (node, caller) => {
    const fn = calledFunction(model, node);
    if (!fn) return undefined;
    const given = new Map(fn.input.flatMap((name, i) => (node.input[i] ? [[name, caller.shape(node.input[i])] as [string, Poly[] | undefined]] : [])));
    const body = new Graph(bodyGraph(fn), { parent: caller.graphOf(), bound: bindings(fn, node) });
    const shapes = new Shapes(body, caller, { given, prefix: `${nodeLabel(node)}/` });
    return fn.output.map((o) => ({ shape: shapes.shape(o), type: shapes.type(o) }));
  };
}

/**
 * For a call of a model-local function, the arguments each output's values are computed from in the body: not
 * through a shape-only op (Shape, Size), as in the graph's own value walks (query.ts). Read from the body as it is
 * when asked, since a patch may add inputs to a body.
 */
function callValueReads(model: ModelProto): ValueReads | undefined {
  if (model.functions.length === 0) return undefined;
  return (node, output) => {
    const fn = calledFunction(model, node);
    const k = node.output.indexOf(output);
    if (!fn || k < 0 || !fn.output[k]) return undefined;
    return [...bodyInputsOf(fn, fn.output[k])].map((i) => node.input[i]).filter(Boolean);
  };
}

/** The indices of the body inputs a body tensor's values are computed from (body nodes are in topological order, as ONNX requires). */
function bodyInputsOf(fn: FunctionProto, tensor: string): Set<number> {
  const from = new Map<string, Set<number>>(fn.input.map((name, i) => [name, new Set([i])]));
  for (const n of fn.node) {
    const reads = opInfo(n).shapeOnly ? [] : readsOf(n);
    const inputs = new Set(reads.flatMap((r) => [...(from.get(r) ?? [])]));
    for (const o of n.output) if (o) from.set(o, inputs);
  }
  return from.get(tensor) ?? new Set();
}

/** The calls of `fn` from the given graph scopes, in graph order. */
function callsOf(model: ModelProto, fn: FunctionProto, callers: Scope[]): FunctionCall[] {
  return callers.flatMap((scope) => scope.graph.nodes.filter((n) => calledFunction(model, n) === fn).map((node) => ({ node, scope })));
}

/** Each input of `fn` the call passes, to the name it passes (inputs it leaves out stay unbound inputs). */
function bindings(fn: FunctionProto, call: NodeProto): Map<string, string> {
  return new Map(fn.input.flatMap((name, i) => (call.input[i] ? [[name, call.input[i]] as [string, string]] : [])));
}

/**
 * The shapes of the body's inputs as the calls pass them: each dim where every call gives the same (a fresh
 * symbol where they differ), none where the ranks differ or one call's is unknown.
 */
function agreedShapes(fn: FunctionProto, calls: FunctionCall[]): Map<string, Poly[] | undefined> {
  const out = new Map<string, Poly[] | undefined>();
  fn.input.forEach((name, i) => {
    const args = calls.map((c) => c.node.input[i]);
    if (args.some((a) => !a)) return;
    const shapes = calls.map((c, k) => c.scope.shapes.shape(args[k]));
    const first = shapes[0];
    if (!first || shapes.some((s) => !s || s.length !== first.length)) {
      out.set(name, undefined);
      return;
    }
    out.set(name, first.map((d, axis) => (shapes.every((s) => show(s![axis]) === show(d)) ? d : sym(`${name}:${axis}`))));
  });
  return out;
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
