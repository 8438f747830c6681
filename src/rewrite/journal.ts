/**
 * The patch journal: every edit the patch makes to a model, scope by scope, written into the patch record so
 * that revert, --update-s and verification undo or find exactly what was done, instead of recognising it from
 * node names or structure. Inserted nodes, initializers and inputs are listed by name (names are unique
 * model-wide); a rewired input by the first output of the node that reads it (tensor names are unique too), the
 * input's position, and what it read before and after.
 */
import { Graph } from '../graph/graph';
import { parseModel, serializeModel } from '../io/model-file';
import { ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../io/onnx';
import { memo } from '../memo';

/** @internal */
export interface Rewire {
  /** First output of the node whose input was changed. */
  node: string;
  input: number;
  from: string;
  to: string;
  /** The node's input count before the edit (an input may have been appended). */
  length: number;
}

/** @internal */
export interface ScopeEdits {
  /** The scope path (`main`, `main/<node>.<attribute>`, `function <domain>:<name>`). */
  scope: string;
  /** Whose edits these are: one site's (`L<layer>`, the layer in that scope) or the scope's shared n (`shared`). */
  owner: string;
  nodes: string[];
  initializers: string[];
  /** Graph inputs added: function inputs through which s comes in, IR < 4 declarations of initializers. */
  inputs: string[];
  rewired: Rewire[];
  /**
   * Nodes the patch replaced (a fused operator expanded into the ops it is defined by), each as base64 of a
   * one-node model holding the node's own bytes, so revert puts back exactly what was there.
   */
  removed?: string[];
  /**
   * Graph inputs and outputs the patch took out (`--cache-layout split` replaces a stacked cache by its halves),
   * each with its position and its declaration as base64 of a model declaring it, so revert puts back those bytes.
   */
  removedInputs?: Declared[];
  removedOutputs?: Declared[];
  /** Initializers the patch inserted and then took out again (the stacked cache's, when split), as base64 of a model holding each. */
  removedInitializers?: string[];
  /** Graph outputs added (the halves of a split cache). */
  outputs?: string[];
  /** For the model-wide entry (scope `model`): the default-domain opset import raised from `from` to `to`. */
  opset?: { from: number; to: number };
  /**
   * An opset import the patch added (a contrib domain its fused operators need): the model's (scope `model`), or
   * a function body's (its scope path), since onnxruntime resolves a body's ops by the body's own imports.
   */
  domain?: { domain: string; version: number };
  /**
   * The scope's original nodes in their original order (by first output), when the topological sort after the
   * patch had to move one of them (a factor reading a mask computed after the query, say).
   */
  order?: string[];
}

/**
 * A graph input or output declaration the patch removed: where it was, and its bytes.
 * @internal
 */
export interface Declared { index: number; value: string }

/** The entry of an owner's edits in one scope, before any edit. */
export function emptyEdits(scope: string, owner: string): ScopeEdits {
  return { scope, owner, nodes: [], initializers: [], inputs: [], rewired: [] };
}

/** How the journal names an existing node: its first output (tensor names are unique), or its name. */
export function nodeKey(node: NodeProto): string {
  return node.output.find(Boolean) ?? `#${node.name}`;
}

/**
 * Keys for a list of nodes, unique within it, for the journal's original order: the first output, and where two
 * nodes share it (a name defined twice by Constant nodes, which onnxruntime accepts) the node name and the
 * occurrence as well.
 */
export function orderKeys(nodes: readonly NodeProto[]): string[] {
  const count = new Map<string, number>();
  for (const n of nodes) count.set(nodeKey(n), (count.get(nodeKey(n)) ?? 0) + 1);
  const seen = new Map<string, number>();
  return nodes.map((n) => {
    const key = nodeKey(n);
    if (count.get(key) === 1) return key;
    const named = `${key}|${n.name}`;
    const k = seen.get(named) ?? 0;
    seen.set(named, k + 1);
    return `${named}|${k}`;
  });
}

/** Edits of one scope's graph, each applied through the graph's edit API and written down. */
export class Editor {
  constructor(readonly graph: Graph, readonly edits: ScopeEdits) {}

  insert(node: NodeProto): void {
    this.graph.insertNode(node);
    this.edits.nodes.push(node.name);
  }

  setInput(node: NodeProto, index: number, name: string): void {
    this.edits.rewired.push({ node: nodeKey(node), input: index, from: node.input[index] ?? '', to: name, length: node.input.length });
    this.graph.setInput(node, index, name);
  }

  /** Takes a node out of the graph; its bytes go into the journal. */
  remove(node: NodeProto): void {
    this.graph.removeNodes(new Set([node]));
    (this.edits.removed ??= []).push(Buffer.from(serializeModel(holding(node))).toString('base64'));
  }

  addInitializer(t: TensorProto): void {
    this.graph.addInitializer(t);
    this.edits.initializers.push(t.name);
  }

  /** Declares a graph input, at `index` of the inputs (default last). */
  addInput(v: ValueInfoProto, index?: number): void {
    this.graph.addInput(v, index);
    this.edits.inputs.push(v.name);
  }

  /** Takes an initializer out; its bytes go into the journal. */
  removeInitializer(name: string): void {
    const t = this.graph.proto.initializer.find((x) => x.name === name);
    if (!t) throw new Error(`the journal removes initializer '${name}', which the graph does not have`);
    const model = holding(null);
    model.graph!.initializer.push(t);
    (this.edits.removedInitializers ??= []).push(Buffer.from(serializeModel(model)).toString('base64'));
    this.graph.removeInitializer(name);
  }

  /** Takes a graph input out; its position and declaration go into the journal. */
  removeInput(name: string): void {
    const index = this.graph.proto.input.findIndex((v) => v.name === name);
    (this.edits.removedInputs ??= []).push({ index, value: declaration(this.graph.proto.input[index], 'input') });
    this.graph.removeInput(name);
  }

  /** Takes a graph output out; its position and declaration go into the journal. */
  removeOutput(name: string): void {
    const index = this.graph.proto.output.findIndex((v) => v.name === name);
    (this.edits.removedOutputs ??= []).push({ index, value: declaration(this.graph.proto.output[index], 'output') });
    this.graph.removeOutput(name);
  }

  addOutput(v: ValueInfoProto, index?: number): void {
    this.graph.addOutput(v, index);
    (this.edits.outputs ??= []).push(v.name);
  }
}

/** One journal for the whole patch; entries appear in the order they were first edited. */
export class Journal {
  private readonly scopes = new Map<string, Editor>();
  private opset?: ScopeEdits;
  private readonly domains: ScopeEdits[] = [];

  editor(scope: string, graph: Graph, owner: string): Editor {
    return memo(this.scopes, `${owner}@${scope}`, () => new Editor(graph, emptyEdits(scope, owner)));
  }

  /** Notes that the model's default-domain opset import was raised, so revert can lower it again. */
  raiseOpset(from: number, to: number): void {
    this.opset = { ...emptyEdits('model', 'opset'), opset: { from, to } };
  }

  /** Notes an opset import the patch added (for `owner`'s edits) to the model or to a function's body, so revert can remove it. */
  importDomain(domain: string, version: number, owner: string, scope = 'model'): void {
    this.domains.push({ ...emptyEdits(scope, owner), domain: { domain, version } });
  }

  /** Notes the original order of a scope whose original nodes the sort moved, so revert can restore it. */
  keepOrder(scope: string, graph: Graph, before: readonly NodeProto[]): void {
    const now = new Set(before);
    const after = graph.nodes.filter((n) => now.has(n));
    if (after.length === before.length && after.every((n, i) => n === before[i])) return;
    this.editor(scope, graph, 'order').edits.order = orderKeys(before);
  }

  record(): ScopeEdits[] {
    const edits = [...this.scopes.values()].map((e) => e.edits)
      .filter((e) => e.nodes.length + e.initializers.length + e.inputs.length + e.rewired.length + (e.removed?.length ?? 0)
        + (e.removedInitializers?.length ?? 0) + (e.removedInputs?.length ?? 0) + (e.removedOutputs?.length ?? 0) + (e.outputs?.length ?? 0) > 0 || e.order);
    // The opset and imports go first: revert replays in reverse, so they are restored last.
    return [...(this.opset ? [this.opset] : []), ...this.domains, ...edits];
  }
}

/** A model holding one node or declaration: serialized, its bytes are the ones it was read from (io/emit.ts). */
function holding(node: NodeProto | null, declared: ValueInfoProto[] = []): ModelProto {
  return {
    irVersion: 8, opsetImport: [{ domain: '', version: 1 }], producerName: '', producerVersion: '', metadataProps: [], functions: [],
    graph: { node: node ? [node] : [], name: 'removed', initializer: [], input: declared, output: [], valueInfo: [] },
  };
}

function declaration(v: ValueInfoProto, what: 'input' | 'output'): string {
  if (!v) throw new Error(`the journal removes a graph ${what} the graph does not declare`);
  return Buffer.from(serializeModel(holding(null, [v]))).toString('base64');
}

/** An initializer the journal removed, decoded from its entry (keeping its bytes). */
export function removedInitializer(entry: string): TensorProto {
  return parseModel(Buffer.from(entry, 'base64'), 'the patch journal').graph!.initializer[0];
}

/** A graph input or output declaration the journal removed, decoded from its entry (keeping its bytes). */
export function removedDeclaration(entry: Declared): ValueInfoProto {
  return parseModel(Buffer.from(entry.value, 'base64'), 'the patch journal').graph!.input[0];
}

/** A node the journal removed, decoded from its entry (keeping those bytes, so it is written back unchanged). */
export function removedNode(entry: string): NodeProto {
  return parseModel(Buffer.from(entry, 'base64'), 'the patch journal').graph!.node[0];
}
