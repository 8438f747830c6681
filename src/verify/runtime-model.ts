/**
 * In-memory copies of the patched model that verification runs besides the model itself: the patch with every
 * factor forced to 1 (the wiring alone), and bf16 inputs/outputs carried as float32 because onnxruntime-node
 * has no bfloat16 tensors. The sites come from the patch record and its journal; a model whose record is gone
 * has its factors found from the main graph's structure. The files on disk are never touched.
 */
import { Graph } from '../graph/graph';
import { makeTensor } from '../graph/tensor';
import { defaultOpsetOf, modelScopes, Scope } from '../graph/scopes';
import { readsOf, topoSort } from '../graph/toposort';
import { InputError } from '../errors';
import { DataType, ModelProto, NodeProto, toNumber, ValueInfoProto } from '../io/onnx';
import { findFactors } from '../rewrite/existing';
import { cloneModel } from '../rewrite/patch';
import { readRecord, SiteRecord } from '../rewrite/record';
import type { RopeSiteRecord } from '../rewrite/rope';
import { fusedOwner } from '../rewrite/fuse-attention';
import { constant, node, PREFIX, versionedNodes } from './nodes';
import { findSites } from './sites';
import { NO_WINDOW, WindowSpec } from '../policy/window';

/**
 * The patched model with every inserted factor replaced by 1: the wiring alone. A deep copy, in which the factor
 * every site multiplies by is 1 in whichever graph the site is (a call's function body included), and the
 * inserted nodes nothing reads any more are removed. The 1 takes the type of the factor it replaces.
 */
export function withUnitFactor(patched: ModelProto): ModelProto {
  const model = cloneModel(patched);
  const record = readRecord(model);
  const scopes = modelScopes(model);
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  const applies: { scope: Scope; apply: NodeProto }[] = [];
  if (record) {
    // A site the model no longer has as its journal says is left as it is: the probe fails it, naming it.
    for (const site of findSites(model, scopes, record, null)) {
      const t = site.tensors;
      // An expanded operator's factor is among the nodes that replaced it, in the site's own graph; so is the factor
      // of a site written as a fused operator (fuse-attention.ts), whose product the journal's consumer no longer reads.
      const fused = record.journal.some((e) => e.owner === fusedOwner(site.record.layer) && e.scope === (site.record.scope ?? 'main'));
      const scope = t ? byPath.get(t.scope) : site.record.expanded || fused ? byPath.get(site.record.scope ?? 'main') : undefined;
      const name = t ? t.apply : site.record.apply;
      const apply = name ? scope?.graph.nodes.find((n) => n.name === name) : undefined;
      if (scope && apply) applies.push({ scope, apply });
    }
  } else {
    for (const f of findFactors(scopes[0].graph)) applies.push({ scope: scopes[0], apply: f.apply });
  }
  const touched = new Set<Scope>();
  for (const { scope, apply } of applies) {
    replaceFactor(scope, apply);
    touched.add(scope);
  }
  for (const site of record?.sites ?? []) {
    const scope = byPath.get(site.scope ?? 'main');
    if (site.prior && scope) neutralPrior(scope, site.prior);
  }
  // A window wider than any run hides nothing: the wiring copy then computes what the original did.
  setWindows(scopes, record?.sites ?? [], () => ({ size: NO_WINDOW, sinks: 0 }));
  if (record?.rope) neutralRope(scopes[0], record.rope.sites);
  const inserted = insertedNodes(model, record?.journal);
  for (const scope of touched) {
    dropUnread(scope, inserted);
    scope.commit();
  }
  return model;
}

/** Every reader of the factor this Mul applies reads a constant 1 instead (a fused weight's bias Mul too). */
function replaceFactor(scope: Scope, apply: NodeProto): void {
  const graph = scope.graph;
  const factor = apply.input[1];
  const type = scope.shapes.type(factor);
  let one: NodeProto[];
  if (type !== undefined || scope.opset < 15) {
    one = [constant(graph, `${apply.name}/unit_factor`, type ?? DataType.FLOAT, [], [1])];
  } else {
    const f = constant(graph, `${apply.name}/unit_factor_f`, DataType.FLOAT, [], [1]);
    one = [f, node('CastLike', [f.output[0], apply.input[0]], graph.uniqueName(`${PREFIX}${apply.name}/unit_factor`))];
  }
  for (const n of one) graph.insertNode(n);
  graph.redirect(factor, one[one.length - 1].output[0]);
}

/**
 * θ = 0 at every head: B = −(|d − μ| + 1e-5)^0 = −1 everywhere, a constant a Softmax does not see, so the wiring
 * copy computes what the original did (up to rounding) whatever θ the model was fine-tuned to.
 */
function neutralPrior(scope: Scope, theta: Record<string, string>): void {
  fillInitializers(scope, Object.values(theta), 0);
}

/** RoPE's multipliers and YaRN's factor on cos and sin set to 1: the frequencies are the original's again. */
function neutralRope(scope: Scope, sites: readonly RopeSiteRecord[]): void {
  fillInitializers(scope, sites.flatMap((r) => [r.factor, ...(r.mscale ? [r.mscale] : [])]), 1);
}

/** Every value of these initializers of the scope set to `value` (shape and type kept); names it lacks are left alone. */
function fillInitializers(scope: Scope, names: readonly string[], value: number): void {
  for (const name of names) {
    const t = scope.graph.initializers.get(name);
    if (!t) continue;
    const dims = (t.dims ?? []).map(toNumber);
    scope.graph.replaceInitializer(makeTensor(name, t.dataType, dims, new Array(dims.reduce((a, d) => a * d, 1)).fill(value)));
  }
  scope.commit();
}

/**
 * Every sliding window's W and S set to `to(W, S)` in whichever graph holds its constants (an initializer, or a
 * Constant node in a function body); the window's nodes read them at run time, so this is the window the copy runs.
 */
export function setWindows(scopes: Scope[], sites: readonly SiteRecord[], to: (w: WindowSpec) => WindowSpec): void {
  const seen = new Set<string>();
  for (const site of sites) {
    if (!site.window || seen.has(site.window.size)) continue;
    seen.add(site.window.size);
    const scope = scopes.find((s) => s.graph.producer.has(site.window!.size) || s.graph.initializers.has(site.window!.size));
    if (!scope) continue;
    const value = (name: string): number => Number(scope.graph.constValue(name)?.values[0] ?? 0);
    const next = to({ size: value(site.window.size), sinks: value(site.window.sinks) });
    setScalar(scope, site.window.size, next.size);
    setScalar(scope, site.window.sinks, next.sinks);
    scope.commit();
  }
}

function setScalar(scope: Scope, name: string, v: number): void {
  const t = makeTensor(name, DataType.INT64, [], [v]);
  if (scope.graph.initializers.has(name)) { scope.graph.replaceInitializer(t); return; }
  const node = scope.graph.producer.get(name);
  const attr = node?.opType === 'Constant' ? node.attribute.find((a) => a.name === 'value') : undefined;
  if (attr) attr.t = { ...t, name: '' };
}

/** Names of the nodes the patch inserted, per scope path (the journal's), or the factors' nodes without one. */
function insertedNodes(model: ModelProto, journal: { scope: string; nodes: string[] }[] | undefined): (scope: Scope, n: NodeProto) => boolean {
  if (journal) {
    const names = new Map<string, Set<string>>();
    for (const e of journal) names.set(e.scope, new Set([...(names.get(e.scope) ?? []), ...e.nodes]));
    return (scope, n) => names.get(scope.path)?.has(n.name) ?? false;
  }
  const factorNodes = new Set(findFactors(new Graph(model.graph!)).flatMap((f) => f.nodes.map((x) => x.name)));
  return (_scope, n) => factorNodes.has(n.name);
}

/**
 * Removes the inserted nodes nothing reads any more (the factor computation once the factor is 1). Left in,
 * onnxruntime's optimizer can fuse away a tensor they still read and then reject the model.
 */
function dropUnread(scope: Scope, inserted: (scope: Scope, n: NodeProto) => boolean): void {
  const graph = scope.graph;
  const kept = new Set<string>([...graph.proto.output.map((o) => o.name), ...(scope.fn?.output ?? [])]);
  for (let changed = true; changed;) {
    const read = new Set<string>(kept);
    for (const n of graph.nodes) for (const i of readsOf(n)) read.add(i);
    const dead = new Set(graph.nodes.filter((n) => inserted(scope, n) && !n.output.some((o) => read.has(o))));
    changed = dead.size > 0;
    if (changed) graph.removeNodes(dead);
  }
}

/**
 * A patch written with `--cache-layout split` behind the original's interface, for the runs that compare the model
 * as written with the original: each stacked cache input [2, B, N, T, H] is split inside into the halves the patch
 * reads, and each stacked present is stacked from the halves it writes. Gather and Concat copy and never round, so
 * the adapted model computes what the patch does, fed and read as the original. Other models are left as they are.
 * Edits in place and returns the model: give it a deep copy.
 */
export function withStackedCache(model: ModelProto): ModelProto {
  const splits = readRecord(model)?.cacheLayout;
  if (!splits?.length) return model;
  const graph = new Graph(model.graph!);
  const opset = defaultOpsetOf(model.opsetImport);
  const g = graph.proto;
  for (const c of splits) {
    const key = g.input.find((v) => v.name === c.pastKey), present = g.output.find((v) => v.name === c.presentKey);
    if (!key || !present) throw new InputError(`the patch record's split cache '${c.past}' does not match the model's inputs and outputs: the model was edited after patching`, 'cannot-verify');
    g.input.splice(g.input.indexOf(key), 1, stacked(key, c.past));
    g.input = g.input.filter((v) => v.name !== c.pastValue);
    g.output.splice(g.output.indexOf(present), 1, stacked(present, c.present));
    g.output = g.output.filter((v) => v.name !== c.presentValue);
    [c.pastKey, c.pastValue].forEach((half, i) => {
      const index = constant(graph, `${half}/index`, DataType.INT64, [], [i]);
      g.node.unshift(index, node('Gather', [c.past, index.output[0]], half, { axis: 0 }));
    });
    const halves = [c.presentKey, c.presentValue].flatMap((half) => versionedNodes(graph, 'Unsqueeze', [half], graph.uniqueName(`${PREFIX}${half}/stacked`), opset, { axes: [0] }));
    g.node.push(...halves, node('Concat', halves.filter((n) => n.opType === 'Unsqueeze').map((n) => n.output[0]), c.present, { axis: 0 }));
  }
  topoSort(g);
  return model;
}

/** The declaration of a stacked cache [2, …] from one of its halves. */
function stacked(half: ValueInfoProto, name: string): ValueInfoProto {
  const t = half.type?.tensorType;
  const dims = t?.shape?.dim;
  return { name, type: { tensorType: { elemType: t?.elemType ?? DataType.FLOAT, ...(dims ? { shape: { dim: [{ dimValue: 2 }, ...dims] } } : {}) } } };
}

/**
 * bf16 graph inputs become float32 inputs cast to bf16 inside the graph; bf16 outputs are cast to float32.
 * Edits nodes and value infos in place: give it a deep copy. A model without bf16 inputs or outputs is left as it is.
 */
export function carryBf16AsFloat(model: ModelProto): void {
  if (![...model.graph!.input, ...model.graph!.output].some((v) => v.type?.tensorType?.elemType === DataType.BFLOAT16)) return;
  const graph = new Graph(model.graph!);
  for (const input of graph.proto.input) {
    const t = input.type?.tensorType;
    if (!t || t.elemType !== DataType.BFLOAT16 || graph.initializers.has(input.name)) continue;
    const inner = graph.uniqueName(`${PREFIX}${input.name}/bf16`);
    graph.redirect(input.name, inner);
    for (const o of graph.proto.output) if (o.name === input.name) o.name = inner;
    t.elemType = DataType.FLOAT;
    graph.insertNode(node('Cast', [input.name], inner, { to: DataType.BFLOAT16 }));
  }
  for (const output of graph.proto.output) {
    const t = output.type?.tensorType;
    if (!t || t.elemType !== DataType.BFLOAT16) continue;
    const inner = graph.uniqueName(`${PREFIX}${output.name}/bf16`);
    renameProduced(graph, output.name, inner);
    graph.insertNode(node('Cast', [inner], output.name, { to: DataType.FLOAT }));
    t.elemType = DataType.FLOAT;
  }
  topoSort(model.graph!);
}

function renameProduced(graph: Graph, from: string, to: string): void {
  const producer = graph.producer.get(from);
  if (producer) for (const [i, name] of producer.output.entries()) if (name === from) graph.setOutput(producer, i, to);
  graph.redirect(from, to);
}
