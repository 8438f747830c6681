/**
 * Removes an SSMax patch. A model whose record carries the patch journal gets every edit undone in reverse, in
 * every scope (graphs, subgraphs, functions, fused sites): each rewired input reads what it read before, and
 * every inserted node, initializer and input goes. On a model this tool patched, the result is the original
 * model, node order and bytes included. Without the record (another tool stripped it), or when the model was
 * edited since so that the journal no longer fits, the patch is found from the main graph's structure instead.
 */
import { InputError } from '../errors';
import { removeUnread } from '../graph/cleanup';
import { Graph, nodeLabel } from '../graph/graph';
import { modelScopes, Scope } from '../graph/scopes';
import { validateGraph } from '../graph/validate';
import { ModelProto, NodeProto } from '../io/onnx';
import { Factor, findFactors } from './existing';
import { APPLY_NAME } from '../identity';
import { orderKeys, removedDeclaration, removedInitializer, removedNode, ScopeEdits } from './journal';
import { lowerOpset } from './opset';
import { findScaleTensor, PatchRecord, readRecord, recordedLabel, removeRecord, writeRecord } from './record';
import { isFusedOwner } from './fuse-attention';
import { cloneModel } from './patch';


export interface RevertedSite {
  /** Layer from the record or the node names, or the site's position when names were changed. */
  layer: number;
  /** The graph the site is in, when not the main graph. */
  scope?: string;
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
  /** How the patch was found: replaying its journal, or from the graph's structure. */
  method: 'journal' | 'structure';
  /** Why the journal could not be replayed, when the structure was used although the record has one. */
  note?: string;
}

export interface RevertResult { model: ModelProto; report: RevertReport }

/** Reverts a copy of `model`; the argument is left unchanged. */
export function revertModel(model: ModelProto): RevertResult {
  const out = cloneModel(model);
  validateGraph(out.graph!);
  const record = readRecord(out);
  if (!record?.journal.length) return revertByStructure(out);
  try {
    const sites = undoJournal(out, record, record.journal);
    removeRecord(out);
    return { model: out, report: { sites, hadRecord: true, method: 'journal' } };
  } catch (e) {
    if (!(e instanceof StaleJournal)) throw e;
    const fallback = cloneModel(model);
    validateGraph(fallback.graph!);
    try {
      const result = revertByStructure(fallback);
      return { ...result, report: { ...result.report, note: e.message } };
    } catch {
      throw new InputError(`cannot revert: ${e.message}, and no patch is recognisable from the graph's structure`, 'cannot-revert');
    }
  }
}

/**
 * The patch with the fused operators it wrote in place of plain-op attention taken out again: the same factors on
 * plain ops, whose tensors verification reads at every site (fuse-attention.ts). Null when it wrote none.
 */
export function unfusedModel(model: ModelProto): ModelProto | null {
  const record = readRecord(model);
  const fused = record?.journal.filter((e) => isFusedOwner(e.owner)) ?? [];
  if (!record || fused.length === 0) return null;
  const out = cloneModel(model);
  try {
    undoJournal(out, record, fused, true);
  } catch (e) {
    if (e instanceof StaleJournal) return null;
    throw e;
  }
  // The split caches are back in their stacked form: the record no longer names them.
  const rest: PatchRecord = { ...record, journal: record.journal.filter((e) => !isFusedOwner(e.owner)) };
  delete rest.cacheLayout;
  writeRecord(out, rest);
  return out;
}

/** The journal names something the model no longer has: it was edited after patching. */
class StaleJournal extends Error {}

/** `sort`: put every touched graph in topological order (a partial undo has no original order to go back to). */
function undoJournal(model: ModelProto, record: PatchRecord, journal: ScopeEdits[], sort = false): RevertedSite[] {
  const scopes = modelScopes(model);
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  const scopeOf = (path: string): Scope => byPath.get(path) ?? stale(`the journal names scope '${path}', which the model does not have`);
  const sites = record.sites.map((site): RevertedSite => {
    const value = site.sInitializer ? scopeOf(site.scope ?? 'main').graph.constValue(site.sInitializer) : null;
    return {
      layer: site.layer, ...(site.scope && site.scope !== 'main' ? { scope: site.scope } : {}), apply: site.apply ?? '', softmax: recordedLabel(site),
      s: value ? (value.values.length === 1 && value.dims.length === 0 ? value.values[0] : value.values) : null,
      removedNodes: 0, removedInitializers: [],
    };
  });
  const touched = new Set<Scope>();
  for (const edits of [...journal].reverse()) {
    if (edits.opset) {
      lowerOpset(model, edits.opset.from);
      continue;
    }
    if (edits.domain) {
      removeImport(edits.scope === 'model' ? model.opsetImport : scopeOf(edits.scope).fn?.opsetImport ?? stale(`the journal names an import of '${edits.scope}', not a function`), edits.domain.domain);
      continue;
    }
    const scope = scopeOf(edits.scope);
    undoEdits(scope.graph, edits);
    touched.add(scope);
    const site = sites.find((s) => (s.scope ?? 'main') === edits.scope && `L${s.layer}` === edits.owner);
    if (site) {
      site.removedNodes += edits.nodes.length;
      site.removedInitializers.push(...edits.initializers);
    }
  }
  for (const edits of journal.filter((e) => e.order)) restoreOrder(scopeOf(edits.scope).graph, edits.order!);
  for (const scope of touched) if (sort || scope.kind === 'function') scope.commit();
  checkReads(model);
  return sites;
}

/** An opset import the patch added goes again. */
function removeImport(imports: { domain: string }[], domain: string): void {
  const i = imports.findIndex((o) => o.domain === domain);
  if (i >= 0) imports.splice(i, 1);
}

function stale(why: string): never {
  throw new StaleJournal(why);
}

/** Undoes one journal entry: rewired inputs first (last edit first), then the additions. */
function undoEdits(graph: Graph, edits: ScopeEdits): void {
  const byOutput = new Map(graph.nodes.flatMap((n) => n.output.map((o) => [o, n] as [string, NodeProto])));
  for (const r of [...edits.rewired].reverse()) {
    const node = byOutput.get(r.node);
    if (!node || node.input[r.input] !== r.to) stale(`input ${r.input} of the node producing '${r.node}' no longer reads '${r.to}'`);
    graph.setInput(node, r.input, r.from);
    if (node.input.length > r.length) graph.truncateInputs(node, r.length);
  }
  const names = new Set(edits.nodes);
  const inserted = new Set(graph.nodes.filter((n) => names.has(n.name)));
  if (inserted.size !== names.size) stale(`${names.size - inserted.size} of the inserted nodes of ${edits.owner} in ${edits.scope} are not in the model`);
  const produced = new Set([...inserted].flatMap((n) => n.output));
  graph.removeNodes(inserted);
  for (const name of edits.initializers) {
    if (!graph.proto.initializer.some((t) => t.name === name)) stale(`initializer '${name}' is not in ${edits.scope}`);
    graph.removeInitializer(name);
  }
  for (const name of edits.inputs) graph.removeInput(name);
  for (const name of edits.outputs ?? []) graph.removeOutput(name);
  // Declarations come back where they were: the last removed first, so every index is the one it had then.
  for (const d of [...(edits.removedInputs ?? [])].reverse()) graph.addInput(removedDeclaration(d), d.index);
  for (const d of [...(edits.removedOutputs ?? [])].reverse()) graph.addOutput(removedDeclaration(d), d.index);
  for (const t of [...(edits.removedInitializers ?? [])].reverse().map(removedInitializer)) graph.addInitializer(t);
  // Nodes the patch replaced come back (in place, once restoreOrder runs), and their outputs keep their value_info.
  const back = [...(edits.removed ?? [])].reverse().map(removedNode);
  for (const node of back) graph.insertNode(node);
  const kept = new Set(back.flatMap((n) => n.output));
  const gone = new Set([...[...produced].filter((o) => !kept.has(o)), ...edits.initializers, ...edits.inputs]);
  graph.removeValueInfo(gone);
}

/** Puts the original nodes back in the order the journal noted before the patch's sort moved some of them. */
function restoreOrder(graph: Graph, order: string[]): void {
  const keys = orderKeys(graph.nodes);
  const byKey = new Map(graph.nodes.map((n, i) => [keys[i], n]));
  const nodes = order.map((k) => byKey.get(k));
  if (nodes.length !== graph.nodes.length || nodes.some((n) => !n) || new Set(nodes).size !== nodes.length) {
    stale('the nodes the journal lists in their original order are not the model\'s');
  }
  graph.reorderNodes(nodes as NodeProto[]);
}

/** Every name a node reads is still defined: nothing the model kept depended on what the patch added. */
function checkReads(model: ModelProto): void {
  try {
    validateGraph(model.graph!);
  } catch (e) {
    stale(`after undoing the journal, ${(e as Error).message}`);
  }
  for (const fn of model.functions) {
    const defined = new Set([...fn.input, ...fn.node.flatMap((n) => n.output)]);
    const missing = fn.node.flatMap((n) => n.input).find((i) => i && !defined.has(i));
    if (missing) stale(`after undoing the journal, function '${fn.name}' reads '${missing}', which nothing defines`);
  }
}

/** Finds the factors from the main graph's structure (names, or the shape of a factor), and removes them. */
function revertByStructure(out: ModelProto): { model: ModelProto; report: RevertReport } {
  const graph = new Graph(out.graph!);
  const factors = findFactors(graph);
  if (factors.length === 0) {
    throw new InputError(`no SSMax patch in this model (no ${APPLY_NAME} node and no SSMax factor before a Softmax): nothing to revert`, 'not-patched');
  }
  const sites = factors.map((f, i) => describe(graph, f, i));
  for (const f of factors) rewire(graph, f);
  // Shared computations of n go with the last factor that reads them; anything else still reads stays.
  const { initializers } = removeUnread(graph, new Set(factors.flatMap((f) => f.nodes)));
  for (const [i, f] of factors.entries()) {
    sites[i].removedNodes = f.nodes.length;
    sites[i].removedInitializers = [...new Set(f.nodes.flatMap((n) => n.input))].filter((n) => initializers.has(n));
  }
  return { model: out, report: { sites, hadRecord: removeRecord(out), method: 'structure' } };
}

function describe(graph: Graph, f: Factor, index: number): RevertedSite {
  const sName = findScaleTensor(graph, f.apply, f.factor, f.logits);
  const value = sName ? graph.constValue(sName) : null;
  const s = value ? (value.values.length === 1 ? value.values[0] : value.values) : null;
  return {
    layer: f.layer ?? index, apply: nodeLabel(f.apply), softmax: f.softmax ? nodeLabel(f.softmax) : null,
    s, removedNodes: 0, removedInitializers: [],
  };
}

/** Every reader of the scaled value reads the original (logits or query) again. */
function rewire(graph: Graph, f: Factor): void {
  const product = f.product;
  if (graph.outputs.has(product)) throw new InputError(`cannot revert: the scaled logits '${product}' are a graph output`, 'cannot-revert');
  graph.redirect(product, f.logits);
}
