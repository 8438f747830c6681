/**
 * A thin in-memory index over one GraphProto: producers, consumers, initializers and constants.
 * The GraphProto stays the source of truth; every edit method keeps the index live (and forgets remembered answers).
 *
 * A subgraph (If/Loop/Scan body, contrib-op graph attribute) or function body sees the names of its enclosing
 * scope: lookups of a name it does not define fall back to the parent Graph. All graphs of one model share one
 * name registry, because ONNX forbids a subgraph to reuse a name of an enclosing scope.
 *
 * A function body bound to a call (scopes.ts) has the calling graph as its parent, and its inputs stand for what
 * the call passes: a lookup of a bound input is a lookup of the call's argument there, so detection reads through
 * the call (the mask's producers, its constants, its shapes) as if the body were written inline.
 */
import { GraphProto, NodeProto, TensorProto, toNumber, ValueInfoProto } from '../io/onnx';
import { memo } from '../memo';
import { chosenDefinition, ConstantDef, defTensor, repeatedConstants } from './duplicates';
import { subgraphsOf } from './node';
import { Query } from './query';
import { ConstTensor, readTensor } from './tensor';
import type { ValueReads } from './view';

// Readers of a node that need no Graph live in node.ts, so that the modules this one loads can import them.
export { attr, attrFloat, attrInt, attrInts, attrString, subgraphsOf } from './node';

/**
 * Tensor and node names in use anywhere in a model (node and tensor names are separate namespaces).
 * @internal
 */
export interface NameRegistry {
  tensors: Set<string>;
  nodes: Set<string>;
}

/** @internal */
export interface GraphOptions {
  /** The enclosing scope, for names this graph reads but does not define. */
  parent?: Graph;
  /** Shared by every graph of the model; a fresh one when absent. */
  registry?: NameRegistry;
  /** Graph inputs known to be bound to constants (function inputs fed by initializers at every call site). */
  constantInputs?: Set<string>;
  /**
   * Function inputs bound to the names the call passes in `parent` (input → argument): they are no inputs of this
   * graph, and every lookup of one is a lookup of its argument in the parent.
   */
  bound?: ReadonlyMap<string, string>;
  /** What a call of a model-local function computes each output from (scopes.ts, callValueReads). */
  valueReads?: ValueReads;
}

/** A name as the enclosing scope spells it: a bound function input's argument, any other name itself. */
type OuterName = (name: string) => string;
const same: OuterName = (name) => name;

/**
 * Marks a caller's name that the function body also defines, as the body's walks see it (see Graph.callerNode):
 * no ONNX name holds a NUL character.
 */
const CALLER = '\u0000caller';

/**
 * A Map whose lookups fall back to the enclosing scope's map (by the name it has there, the value as `view` shows
 * it); iteration sees local entries only.
 */
class ScopedMap<V> extends Map<string, V> {
  constructor(private readonly outer?: ReadonlyMap<string, V>, private readonly outerName: OuterName = same,
    private readonly view: (v: V) => V = (v) => v) {
    super();
  }

  override get(key: string): V | undefined {
    if (super.has(key)) return super.get(key);
    const v = this.outer?.get(this.outerName(key));
    return v === undefined ? v : this.view(v);
  }

  override has(key: string): boolean {
    return super.has(key) || (this.outer?.has(this.outerName(key)) ?? false);
  }
}

class ScopedSet extends Set<string> {
  constructor(values: Iterable<string>, private readonly outer?: ReadonlySet<string>, private readonly outerName: OuterName = same) {
    super(values);
  }

  override has(value: string): boolean {
    return super.has(value) || (this.outer?.has(this.outerName(value)) ?? false);
  }
}

export class Graph {
  readonly parent?: Graph;
  // The index is the graph's own: others read it through the getters and change it only through the edit methods.
  private readonly producerIndex: Map<string, NodeProto>;
  private readonly consumerIndex = new Map<string, NodeProto[]>();
  private readonly initializerIndex: Map<string, TensorProto>;
  private inputNames: Set<string> = new Set<string>();
  private outputNames = new Set<string>();
  private readonly valueInfoIndex: Map<string, ValueInfoProto>;
  private readonly registry: NameRegistry;
  private readonly constantInputs: Set<string>;
  private readonly bound: ReadonlyMap<string, string>;
  /** For a bound function body: every name it defines itself (those of its subgraphs too), and its unbound inputs. */
  private readonly own: ReadonlySet<string>;
  private readonly callerViews = new WeakMap<NodeProto, NodeProto>();
  private readonly calls?: ValueReads;
  private constCache = new Map<string, ConstTensor | null>();
  /** Names defined several times: the definition onnxruntime uses (duplicates.ts). */
  private repeated = new Map<string, ConstantDef>();
  /**
   * Memoised questions about the graph (see query.ts), forgotten on every edit.
   * @internal
   */
  readonly query: Query = new Query(this);

  /** @internal */

  constructor(readonly proto: GraphProto, options: GraphOptions = {}) {
    this.parent = options.parent;
    this.bound = options.bound ?? new Map();
    this.own = this.bound.size ? ownNames(proto, this.bound) : new Set();
    const outerName = (name: string): string => this.outerName(name);
    this.producerIndex = new ScopedMap(this.parent?.producer, outerName, (n) => this.callerNode(n));
    this.initializerIndex = new ScopedMap(this.parent?.initializers, outerName);
    this.valueInfoIndex = new ScopedMap(this.parent?.valueInfo, outerName);
    this.registry = options.registry ?? { tensors: new Set<string>(), nodes: new Set<string>() };
    this.constantInputs = options.constantInputs ?? new Set();
    this.calls = options.valueReads;
    this.reindex();
  }

  /** @internal */
  valueReads(node: NodeProto, output: string): string[] | undefined {
    return this.calls?.(node, output) ?? this.parent?.valueReads(node, output);
  }

  get nodes(): NodeProto[] {
    return this.proto.node;
  }

  /** The node producing each name (this graph's, then its enclosing scopes'). */
  get producer(): ReadonlyMap<string, NodeProto> {
    return this.producerIndex;
  }

  /** The nodes of this graph reading each name. */
  get consumers(): ReadonlyMap<string, NodeProto[]> {
    return this.consumerIndex;
  }

  get initializers(): ReadonlyMap<string, TensorProto> {
    return this.initializerIndex;
  }

  get inputs(): ReadonlySet<string> {
    return this.inputNames;
  }

  get outputs(): ReadonlySet<string> {
    return this.outputNames;
  }

  get valueInfo(): ReadonlyMap<string, ValueInfoProto> {
    return this.valueInfoIndex;
  }

  reindex(): void {
    this.producerIndex.clear();
    this.consumerIndex.clear();
    this.initializerIndex.clear();
    this.constCache.clear();
    this.query.forget();
    // Names are never released: a name once used stays taken, which is all uniqueName needs.
    this.inputNames = new ScopedSet(this.proto.input.map((v) => v.name).filter((n) => !this.bound.has(n)), this.parent?.inputs,
      (name) => this.outerName(name));
    this.outputNames = new Set(this.proto.output.map((v) => v.name));
    for (const t of this.proto.initializer) this.initializerIndex.set(t.name, t);
    for (const v of this.declarations()) this.valueInfoIndex.set(v.name, v);
    for (const node of this.proto.node) {
      if (node.name) this.registry.nodes.add(node.name);
      for (const out of node.output) if (out) this.producerIndex.set(out, node);
      for (const name of node.input) if (name) memo(this.consumerIndex, name, () => []).push(node);
    }
    for (const n of [...this.producerIndex.keys(), ...this.initializerIndex.keys(), ...this.inputNames]) this.registry.tensors.add(n);
    this.repeated.clear();
    for (const [name, defs] of repeatedConstants(this.proto)) {
      const i = chosenDefinition(defs);
      if (i !== null) this.repeated.set(name, defs[i]);
    }
  }

  /** The tensor a constant name holds: the definition onnxruntime uses when there are several. */
  constantTensor(name: string): TensorProto | undefined {
    if (this.throughCall(name)) return this.parent!.constantTensor(this.outerName(name));
    const def = this.repeated.get(name);
    if (def) return defTensor(def);
    const node = this.producerIndex.get(name);
    return node?.opType === 'Constant' ? defTensor({ node }) : this.initializerIndex.get(name);
  }

  /** An index over a graph held in one of this graph's node attributes (names stay unique model-wide). */
  child(proto: GraphProto): Graph {
    return new Graph(proto, { parent: this, registry: this.registry });
  }

  consumersOf(name: string): NodeProto[] {
    return this.consumerIndex.get(name) ?? [];
  }

  // ---- Edits: each keeps the index live and forgets remembered answers. The caller sorts the scope afterwards.
  // Values of constants stay remembered (they may be external data) unless the edit replaces or removes them.

  /** Appends a node; its outputs and reads join the index. */
  insertNode(node: NodeProto): void {
    this.proto.node.push(node);
    if (node.name) this.registry.nodes.add(node.name);
    for (const out of node.output) if (out) this.producerIndex.set(out, node);
    for (const name of node.input) this.addConsumer(name, node);
    this.query.forget();
  }

  /** Points input `index` of `node` at `name`, padding skipped optional inputs with ''. */
  setInput(node: NodeProto, index: number, name: string): void {
    while (node.input.length <= index) node.input.push('');
    const old = node.input[index];
    node.input[index] = name;
    if (old && !node.input.includes(old)) this.removeConsumer(old, node);
    this.addConsumer(name, node);
    this.query.forget();
  }

  /** Every node that reads `from` reads `to` instead. */
  redirect(from: string, to: string): void {
    for (const node of [...this.consumersOf(from)]) {
      for (const [i, name] of node.input.entries()) if (name === from) this.setInput(node, i, to);
    }
  }

  /** Keeps the first `length` inputs of `node` (those after are optional ones left out again). */
  truncateInputs(node: NodeProto, length: number): void {
    const dropped = node.input.splice(length);
    for (const name of new Set(dropped)) if (name && !node.input.includes(name)) this.removeConsumer(name, node);
    this.query.forget();
  }

  /** Points output `index` of `node` at `name` (a new tensor it produces), padding skipped optional outputs with ''. */
  setOutput(node: NodeProto, index: number, name: string): void {
    while (node.output.length <= index) node.output.push('');
    const old = node.output[index];
    node.output[index] = name;
    if (old && this.producerIndex.get(old) === node && !node.output.includes(old)) this.producerIndex.delete(old);
    if (name) {
      this.producerIndex.set(name, node);
      this.registry.tensors.add(name);
    }
    this.query.forget();
  }

  /** Puts the graph's nodes in the given order: the same nodes, each once. */
  reorderNodes(order: readonly NodeProto[]): void {
    const now = new Set(this.proto.node);
    if (order.length !== now.size || new Set(order).size !== order.length || order.some((n) => !now.has(n))) {
      throw new Error('reorderNodes: the order is not of the graph\'s nodes, each once');
    }
    this.proto.node = [...order];
    this.query.forget();
  }

  removeNodes(nodes: ReadonlySet<NodeProto>): void {
    this.proto.node = this.proto.node.filter((n) => !nodes.has(n));
    for (const node of nodes) {
      for (const out of node.output) if (this.producerIndex.get(out) === node) this.producerIndex.delete(out);
      for (const name of new Set(node.input)) if (name) this.removeConsumer(name, node);
    }
    this.query.forget();
  }

  addInitializer(t: TensorProto): void {
    this.proto.initializer.push(t);
    this.initializerIndex.set(t.name, t);
    this.registry.tensors.add(t.name);
    this.query.forget();
  }

  /** Replaces an initializer in place (same position), e.g. new values for s. */
  replaceInitializer(t: TensorProto): void {
    const list = this.proto.initializer;
    const i = list.findIndex((x) => x.name === t.name);
    if (i < 0) throw new Error(`replaceInitializer: no initializer '${t.name}'`);
    list[i] = t;
    this.initializerIndex.set(t.name, t);
    this.constCache.delete(t.name);
    this.query.forget();
  }

  removeInitializer(name: string): void {
    this.proto.initializer = this.proto.initializer.filter((t) => t.name !== name);
    this.initializerIndex.delete(name);
    this.constCache.delete(name);
    this.query.forget();
  }

  /** Declares a graph input, at `index` of the inputs (default last). */
  addInput(v: ValueInfoProto, index = this.proto.input.length): void {
    this.proto.input.splice(index, 0, v);
    this.inputNames.add(v.name);
    this.valueInfoIndex.set(v.name, v);
    this.registry.tensors.add(v.name);
    this.query.forget();
  }

  removeInput(name: string): void {
    this.proto.input = this.proto.input.filter((v) => v.name !== name);
    this.inputNames.delete(name);
    this.query.forget();
  }

  /** Declares a new graph output, at `index` of the outputs (default last; its value_info entry, if the graph has one, still tells its type). */
  addOutput(v: ValueInfoProto, index = this.proto.output.length): void {
    this.proto.output.splice(index, 0, v);
    this.outputNames.add(v.name);
    this.indexDeclarations(new Set([v.name]));
    this.query.forget();
  }

  /** Takes a graph output's declaration out (the tensor itself stays if a node writes it). */
  removeOutput(name: string): void {
    this.proto.output = this.proto.output.filter((v) => v.name !== name);
    this.outputNames.delete(name);
    this.indexDeclarations(new Set([name]));
    this.query.forget();
  }

  /** Removes the value_info entries of these tensors (an input or output declaration of one still stands). */
  removeValueInfo(names: ReadonlySet<string>): void {
    this.proto.valueInfo = this.proto.valueInfo.filter((v) => !names.has(v.name));
    this.indexDeclarations(names);
    this.query.forget();
  }

  /** Inputs, outputs and value_info, in the order in which a later declaration of a name overrides an earlier one. */
  private declarations(): ValueInfoProto[] {
    // A bound function input is declared where the call's argument is (its own entry has no type).
    return [...this.proto.input.filter((v) => !this.bound.has(v.name)), ...this.proto.output, ...this.proto.valueInfo];
  }

  /** The declarations of these names in the index, as reindex() finds them. */
  private indexDeclarations(names: ReadonlySet<string>): void {
    for (const name of names) this.valueInfoIndex.delete(name);
    for (const v of this.declarations()) if (names.has(v.name)) this.valueInfoIndex.set(v.name, v);
  }

  private addConsumer(name: string, node: NodeProto): void {
    if (!name) return;
    const list = this.consumersOf(name);
    if (!list.includes(node)) this.consumerIndex.set(name, [...list, node]);
  }

  private removeConsumer(name: string, node: NodeProto): void {
    this.consumerIndex.set(name, this.consumersOf(name).filter((n) => n !== node));
  }

  /** A name not yet used by any tensor or node of this graph. */
  uniqueName(base: string): string {
    let name = base;
    for (let i = 1; this.registry.tensors.has(name); i++) name = `${base}_${i}`;
    this.registry.tensors.add(name);
    return name;
  }

  /** A node name not yet used in this graph (node names and tensor names are separate namespaces). */
  uniqueNodeName(base: string): string {
    let name = base;
    for (let i = 1; this.registry.nodes.has(name); i++) name = `${base}_${i}`;
    this.registry.nodes.add(name);
    return name;
  }

  /**
   * The name a tensor has in the enclosing scope: the argument a bound function input stands for, else the name itself.
   * @internal
   */
  outerName(name: string): string {
    if (name.endsWith(CALLER)) return name.slice(0, -CALLER.length);
    return this.bound.get(name) ?? name;
  }

  /**
   * A caller's node as a bound body's walks see it: the body's names come first in every lookup, so a caller's
   * input that has a name the body also defines (exporters reuse `x`, `q`, `_val_1` in every function and graph)
   * is read under a marked name, which lookups take to the caller. The same copy every time, for the memos.
   */
  private callerNode(node: NodeProto): NodeProto {
    if (!this.own.size || !node.input.some((i) => this.own.has(i))) return node;
    let view = this.callerViews.get(node);
    if (!view) {
      view = { ...node, input: node.input.map((i) => (this.own.has(i) ? `${i}${CALLER}` : i)) };
      this.callerViews.set(node, view);
    }
    return view;
  }

  /** True when a lookup of the name goes to the caller of a bound function body. */
  private throughCall(name: string): boolean {
    return this.bound.size > 0 && !this.definesLocally(name);
  }

  /**
   * True when the graph's own input list declares the name (a function input bound to its call included).
   * @internal
   */
  declaresInput(name: string): boolean {
    return this.proto.input.some((v) => v.name === name);
  }

  /**
   * True for a function input bound to what its call passes: a walk that must stay in the body stops there.
   * @internal
   */
  isBound(name: string): boolean {
    return this.bound.has(name);
  }

  /** True when the tensor is fixed at load time: an initializer (not overridable by an input) or a Constant output. */
  isConstant(name: string): boolean {
    if (this.constantInputs.has(name)) return true;
    if (this.throughCall(name)) return this.parent!.isConstant(this.outerName(name));
    if (this.initializerIndex.has(name) && !this.inputNames.has(name)) return true;
    if (this.producerIndex.get(name)?.opType === 'Constant') return true;
    return this.parent !== undefined && !this.definesLocally(name) && this.parent.isConstant(name);
  }

  /** True when this graph itself (not an enclosing scope) defines the name. */
  definesLocally(name: string): boolean {
    return Map.prototype.has.call(this.producerIndex, name) || Map.prototype.has.call(this.initializerIndex, name)
      || Set.prototype.has.call(this.inputNames, name);
  }

  /**
   * Values of a constant tensor (initializer or Constant node), or null if it is not constant or not readable.
   * @internal
   */
  constValue(name: string): ConstTensor | null {
    if (this.throughCall(name)) return this.parent!.constValue(this.outerName(name));
    return memo(this.constCache, name, () => {
      const def = this.repeated.get(name);
      const node = def ? ('node' in def ? def.node : undefined) : this.producerIndex.get(name);
      if (node?.opType === 'Constant') return constantNodeValue(node);
      if (def && 'tensor' in def) return readTensor(def.tensor);
      return this.initializerIndex.has(name) && !this.inputNames.has(name) ? readTensor(this.initializerIndex.get(name)!) : null;
    });
  }

  /** Element type of a tensor when the graph declares it (input, output, value_info, initializer). */
  elemType(name: string): number | undefined {
    const init = this.constantTensor(name);
    if (init) return init.dataType;
    return this.valueInfoIndex.get(name)?.type?.tensorType?.elemType || undefined;
  }
}

/** The names a function body bound to a call defines itself: its nodes' outputs at any depth, its inputs not bound to their own name. */
function ownNames(proto: GraphProto, bound: ReadonlyMap<string, string>): Set<string> {
  const own = new Set<string>(proto.input.map((v) => v.name).filter((n) => bound.get(n) !== n));
  const addNodes = (nodes: NodeProto[]): void => {
    for (const n of nodes) {
      for (const o of n.output) if (o) own.add(o);
      for (const g of subgraphsOf(n)) addGraph(g);
    }
  };
  const addGraph = (g: GraphProto): void => {
    for (const v of [...g.input, ...g.initializer]) own.add(v.name);
    addNodes(g.node);
  };
  addNodes(proto.node);
  return own;
}

/** How reports and messages name a node: its name, or its op and first output when it has none. */
export function nodeLabel(node: NodeProto): string {
  return node.name || `${node.opType}(${node.output[0] ?? ''})`;
}

function constantNodeValue(node: NodeProto): ConstTensor | null {
  const a = node.attribute[0];
  if (!a) return null;
  if (a.name === 'value' && a.t) return readTensor(a.t);
  if (a.name === 'value_float') return { dims: [], dataType: 1, values: [a.f ?? 0] };
  if (a.name === 'value_floats') return { dims: [a.floats.length], dataType: 1, values: [...a.floats] };
  if (a.name === 'value_int') return { dims: [], dataType: 7, values: [toNumber(a.i)] };
  if (a.name === 'value_ints') return { dims: [a.ints.length], dataType: 7, values: a.ints.map(toNumber) };
  return null;
}
