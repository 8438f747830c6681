/**
 * The patched sites as the patch record and its journal name them, found again in the patched model: for each
 * site, the graph its tensors are in (a call's function body), what the factor multiplied (the rewired input's
 * value before the patch), the node the patch rewired and which input (what that node reads now is the scaled
 * value), the factor's Mul, and s as the model's initializer holds it. Fused sites also get their operator's
 * query layout and n plan from detection on the original model. Nothing here matches node names against
 * patterns: a journal entry that names something the model no longer has is a problem of that site.
 */
import { AttentionSite, Detection } from '../detect/find-attention';
import { softmaxNamed } from '../detect/softmax';
import { FusedSite } from '../detect/fused';
import { MS_ATTENTION } from '../graph/attention-ops';
import { Graph, nodeLabel } from '../graph/graph';
import { calledFunction, functionKey, Scope } from '../graph/scopes';
import { FunctionProto, ModelProto, NodeProto } from '../io/onnx';
import { hasPart, Part, PART } from '../identity';
import { nodeKey, ScopeEdits } from '../rewrite/journal';
import { PatchRecord, recordedNode, SiteRecord } from '../rewrite/record';
import { THETAS, ThetaName } from '../policy/prior';
import type { WindowSpec } from '../policy/window';

/** Where the probe reads a site: all names are tensors or node keys (first outputs) of `scope`. */
export interface SiteTensors {
  /** Scope path of the graph holding them: the site's own, or the function body of a call. */
  scope: string;
  /** What the factor multiplies, unscaled: what the rewired input read before the patch. */
  before: string;
  /** Key of the node whose input the patch rewired, and the input: what it reads now is the scaled value. */
  consumer: string;
  input: number;
  /** The factor's Mul (by node name). */
  apply: string;
  /** A fused operator's bias whose query part the patch folded into the scaled query: input and original tensor. */
  bias?: { input: number; from: string };
  /** The Softmax of a plain-op site (its input: the masked logits), by label. */
  softmax?: string;
  /**
   * A plain-op site with the factor on the query: the content logits its masks are added to (detection's
   * AttentionSite.logits on the original), so the probe reads the masks' terms as masked − content.
   */
  content?: string;
  /** Where the factor's product is read when a positional prior was added after it (else the consumer's input). */
  after?: string;
  /**
   * The positional prior: the input the patch rewired to add c·B, what it read before (empty: nothing, a fused
   * operator without a bias) and what it reads now.
   */
  prior?: { consumer: string; input: number; before: string; after: string };
  /** The sliding window: the input the patch rewired to add its bias, what it read before and what its Add made. */
  window?: { consumer: string; input: number; before: string; after: string };
}

export interface VerifySite {
  record: SiteRecord;
  /** How messages name the site: `layer 3`, `layer 0 of main/If.then_branch`, `layer 2 (call 'f')`. */
  label: string;
  /** s per head (one value for every head), from the initializer the record names, as the model holds it; empty without a factor. */
  s: number[];
  /** θ of the positional prior per head, as the model's initializers hold them. */
  theta?: Record<ThetaName, number[]>;
  /** The sliding window's W and S, as the model's constants hold them. */
  window?: WindowSpec;
  tensors: SiteTensors | null;
  /** Why the site's tensors were not found: the model is not what its journal says (the site fails). */
  problem?: string;
  /** For a call of a function: the call node (by key) and the scope holding it. */
  call?: { scope: string; node: string; label: string };
  /** Detection's view of a fused operator site (query layout, n plan, heads), on the original model. */
  fused?: FusedSite;
}

/** Every site of the record, found in the patched model through the journal. */
export function findSites(model: ModelProto, scopes: Scope[], record: PatchRecord, detection: Detection | null): VerifySite[] {
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  // The none preset with RoPE rescaled alone records its attention sites with nothing added to them.
  return record.sites.filter((r) => r.apply !== undefined || r.prior || r.window || r.expanded).map((r) => {
    const site: VerifySite = { record: r, label: siteLabel(r), s: [], tensors: null };
    try {
      const scope = byPath.get(r.scope ?? 'main') ?? fail(`its graph ${r.scope} is not in the model`);
      site.s = scaleValues(scope.graph, r);
      if (r.prior) site.theta = thetaValues(scope.graph, r.prior);
      if (r.expanded) locateExpanded(scope, record, r, site);
      else locate(model, byPath, record, r, site);
      if (detection) site.fused = fusedSite(detection, r, site);
      if (detection && site.tensors && !r.kind && r.target === 'query') site.tensors.content = plainSite(detection, r, site)?.logits;
    } catch (e) {
      if (!(e instanceof SiteProblem)) throw e;
      site.problem = `${site.label}: ${e.message}`;
    }
    return site;
  });
}

class SiteProblem extends Error {}

function fail(why: string): never {
  throw new SiteProblem(why);
}

function siteLabel(r: SiteRecord, call?: string): string {
  const where = r.scope && r.scope !== 'main' ? ` of ${r.scope}` : '';
  const what = call ? ` (call '${call}')` : r.kind ? ` (${r.kind.replace('com.microsoft.', '')} '${r.softmax}')` : '';
  return `layer ${r.layer}${where}${what}`;
}

/** s as the model holds it (an initializer, or a Constant in a graph without initializers). */
function scaleValues(graph: Graph, r: SiteRecord): number[] {
  if (r.sInitializer === undefined) return [];
  const value = graph.constValue(r.sInitializer);
  if (!value || value.values.length === 0) fail(`its s '${r.sInitializer}' is not a constant of the model`);
  return value.values;
}

function thetaValues(graph: Graph, names: Record<ThetaName, string>): Record<ThetaName, number[]> {
  const out = {} as Record<ThetaName, number[]>;
  for (const t of THETAS) {
    const value = graph.constValue(names[t]);
    if (!value || value.values.length === 0) fail(`its prior's θ${t} '${names[t]}' is not a constant of the model`);
    out[t] = value.values;
  }
  return out;
}

function windowValues(scope: Scope, names: { size: string; sinks: string }): WindowSpec {
  const value = (name: string, what: string): number => {
    const v = scope.graph.constValue(name);
    if (!v || v.values.length !== 1) fail(`its window's ${what} '${name}' is not a scalar constant of the model`);
    return Number(v.values[0]);
  };
  return { size: value(names.size, 'W'), sinks: value(names.sinks, 'S') };
}

/** The window's rewire: the one to the output of the window's Add (the patch names it, identity.ts PART.window). */
function windowRewire(graph: Graph, entries: ScopeEdits[]): SiteTensors['window'] {
  const w = entries.flatMap((e) => e.rewired).find((x) => x.to && hasPart(graph.producer.get(x.to)?.name ?? '', PART.window));
  if (!w) fail('no input the journal rewired adds its window');
  const consumer = nodeIn(graph, w.node) ?? fail(`the node producing '${w.node}' that the patch rewired is not in the graph`);
  // The Add can be right while nothing reads it: then the window hides nothing, which its probe alone cannot see.
  const reads = consumer.input[w.input];
  if (reads !== w.to && !graph.query.dependsOn(reads, w.to)) fail(`'${nodeLabel(consumer)}' no longer reads the window's Add (its input ${w.input} is '${reads}'): the window hides nothing`);
  return { consumer: nodeKey(consumer), input: w.input, before: w.from, after: w.to };
}

function entriesOf(record: PatchRecord, scope: string, owner?: string): ScopeEdits[] {
  return record.journal.filter((e) => e.scope === scope && (owner === undefined || e.owner === owner));
}

function nodeIn(graph: Graph, key: string): NodeProto | undefined {
  return graph.nodes.find((n) => nodeKey(n) === key);
}

function locate(model: ModelProto, byPath: Map<string, Scope>, record: PatchRecord, r: SiteRecord, site: VerifySite): void {
  const scope = r.scope ?? 'main';
  const own = byPath.get(scope)!;
  let body = scope;
  const call = callOf(model, own, entriesOf(record, scope, `L${r.layer}`), r);
  if (call) {
    body = `function ${functionKey(call.fn.domain, call.fn.name)}`;
    site.call = { scope, node: nodeKey(call.node), label: nodeLabel(call.node) };
    site.label = siteLabel(r, site.call.label);
    if (call.node.input[call.input] !== call.s) fail(`the call no longer passes s '${call.s}'`);
  }
  const bodyScope = byPath.get(body) ?? fail(`its graph ${body} is not in the model`);
  const graph = bodyScope.graph;
  const alpha = r.prior ? thetaIn(r, call) : undefined;
  const siteEdits = entriesOf(record, body, call ? undefined : `L${r.layer}`);
  const prior = alpha !== undefined ? priorRewire(graph, siteEdits, alpha) : undefined;
  if (r.window) site.window = windowValues(bodyScope, r.window);
  const window = r.window ? windowRewire(graph, siteEdits) : undefined;
  if (r.apply === undefined) {
    // The none preset: a prior or a window, and no factor.
    const first = window ?? prior;
    if (!first) fail('the record names neither a factor nor a prior');
    site.tensors = { scope: body, before: first.before, consumer: first.consumer, input: first.input, apply: '', ...(prior ? { prior } : {}),
      ...(window ? { window } : {}), ...(r.kind ? {} : { softmax: softmaxOf(bodyScope, r) }) };
    return;
  }
  const entries = entriesOf(record, body).filter((e) => e.nodes.includes(r.apply!));
  if (entries.length === 0) fail(`the journal lists no edit that inserted its factor '${r.apply}'`);
  const apply = graph.nodes.find((n) => n.name === r.apply) ?? fail(`its factor '${r.apply}' is not in the graph`);
  // The prior's own rewire: what it wrote depends on θα (even when a model changed since reads something else there).
  const rewires = entries.flatMap((e) => e.rewired)
    .filter((w) => !(alpha && w.to && graph.query.dependsOn(w.to, alpha)) && !(window && w.to === window.after));
  const scaled = rewires.filter((w) => w.to && graph.query.dependsOn(w.to, apply.output[0]));
  if (scaled.length === 0) fail(`no input the journal rewired reads its factor '${r.apply}'`);
  const main = scaled[0];
  const consumer = nodeIn(graph, main.node) ?? fail(`the node producing '${main.node}' that the patch rewired is not in the graph`);
  const bias = rewires.find((w) => w !== main && w.node === main.node && !graph.query.dependsOn(w.to, apply.output[0]));
  // A prior or window added on the very input the factor's product went to: the product is read where its Add reads it.
  const samePlace = [prior, window].some((x) => x && x.consumer === nodeKey(consumer) && x.input === main.input);
  site.tensors = {
    scope: body, before: main.from, consumer: nodeKey(consumer), input: main.input, apply: r.apply,
    ...(bias ? { bias: { input: bias.input, from: bias.from } } : {}),
    ...(r.kind ? {} : { softmax: softmaxOf(bodyScope, r) }),
    ...(prior ? { prior } : {}), ...(window ? { window } : {}), ...(samePlace ? { after: main.to } : {}),
  };
}

/**
 * A com.microsoft Attention expanded into its definition: the factor multiplies the projected query [B, S, N·H]
 * (its Mul, by the record's name) and the prior is added to the bias the expansion hands to its kernel; n is read
 * from the original operator's inputs (mask_index, past), which the expansion still reads. An expanded ONNX
 * Attention puts the factor on capped logits inside its own nodes, which the probe does not read yet.
 */
function locateExpanded(scope: Scope, record: PatchRecord, r: SiteRecord, site: VerifySite): void {
  const graph = scope.graph;
  const own = entriesOf(record, scope.path, `L${r.layer}`);
  const names = new Set(own.flatMap((e) => e.nodes));
  const named = (part: Part): NodeProto | undefined => graph.nodes.find((n) => names.has(n.name) && hasPart(n.name, part));
  // ONNX Attention: the factor on the capped logits and the prior added to them, as a plain-op site with its own Softmax.
  const onnx = r.kind !== MS_ATTENTION.id;
  const softmax = onnx ? named(PART.probs) ?? fail('the Softmax of its expansion is not in the graph') : undefined;
  const prior = r.prior ? expandedPrior(graph, named, onnx ? PART.logitsPrior : PART.attentionBiasPrior) : undefined;
  const logits = softmax ? { softmax: nodeLabel(softmax) } : {};
  if (r.apply === undefined) {
    if (!prior) fail('the record names neither a factor nor a prior');
    site.tensors = { scope: scope.path, before: prior.before, consumer: prior.consumer, input: prior.input, apply: '', prior, ...logits };
    return;
  }
  const apply = graph.nodes.find((n) => n.name === r.apply) ?? fail(`its factor '${r.apply}' is not in the graph`);
  site.tensors = {
    scope: scope.path, before: apply.input[0], consumer: nodeKey(apply), input: 0, apply: r.apply, after: apply.output[0],
    ...(prior ? { prior } : {}), ...logits,
  };
}

/** A site the probe reads as logits: plain ops, and an ONNX Attention expanded into them (its Softmax is the expansion's). */
export function readsLogits(site: VerifySite): boolean {
  return !site.fused || Boolean(site.record.expanded && site.tensors?.softmax);
}

/** The expansion's prior: c·B (prior_cast, prior_scaled or prior) and the Add that joins it to the logits or the mask's bias, if any. */
function expandedPrior(graph: Graph, named: (part: Part) => NodeProto | undefined, joinName: Part): SiteTensors['prior'] {
  // The last of them the graph still reads: a model edited since may bypass the factor's Mul.
  const read = (n: NodeProto | undefined): NodeProto | undefined => (n && graph.consumersOf(n.output[0]).length ? n : undefined);
  const made = read(named(PART.priorCast)) ?? read(named(PART.priorScaled)) ?? named(PART.prior) ?? fail('the nodes that make its prior are not in the graph');
  const out = made.output[0];
  const join = named(joinName);
  if (join && join.input.includes(out)) {
    const k = join.input.indexOf(out);
    return { consumer: nodeKey(join), input: k, before: join.input[1 - k], after: join.output[0] };
  }
  return { consumer: nodeKey(made), input: 0, before: '', after: out };
}

/** The θα tensor as the site's graph names it: the initializer, or in a function body the input the call passes it to. */
function thetaIn(r: SiteRecord, call: { node: NodeProto; fn: FunctionProto } | null): string {
  const alpha = r.prior!.alpha;
  if (!call) return alpha;
  const k = call.node.input.indexOf(alpha);
  if (k < 0 || !call.fn.input[k]) fail(`the call no longer passes θα '${alpha}'`);
  return call.fn.input[k];
}

/** The input the journal rewired to add the prior: the one whose new value depends on θα. */
function priorRewire(graph: Graph, entries: ScopeEdits[], alpha: string): SiteTensors['prior'] {
  const w = entries.flatMap((e) => e.rewired).find((x) => x.to && graph.query.dependsOn(x.to, alpha));
  if (!w) fail(`no input the journal rewired adds its prior (θα '${alpha}')`);
  const consumer = nodeIn(graph, w.node) ?? fail(`the node producing '${w.node}' that the patch rewired is not in the graph`);
  return { consumer: nodeKey(consumer), input: w.input, before: w.from, after: consumer.input[w.input] };
}

/**
 * A call site: the journal rewired an input of a call of a model-local function to pass s, and the factor
 * itself is in the function body (not among this scope's inserted nodes).
 */
function callOf(model: ModelProto, scope: Scope, own: ScopeEdits[], r: SiteRecord): { node: NodeProto; fn: FunctionProto; input: number; s: string } | null {
  if (r.apply !== undefined && own.some((e) => e.nodes.includes(r.apply!))) return null;
  for (const w of own.flatMap((e) => e.rewired)) {
    const node = nodeIn(scope.graph, w.node);
    const fn = node && calledFunction(model, node);
    if (node && fn) return { node, fn, input: w.input, s: w.to };
  }
  return null;
}

/** The Softmax of a plain-op site, by label (for a site inside a function, the node in its body). */
function softmaxOf(scope: Scope, r: SiteRecord): string {
  const label = recordedNode(r).node;
  if (!softmaxNamed(scope.graph, scope.shapes, label)) fail(`its Softmax '${label}' is not in the graph`);
  return label;
}

/** Detection's fused site for a fused record (or a call whose body holds a fused operator). */
/** Detection's view of a plain-op site on the original model (in a call's function body, its inner site). */
function plainSite(d: Detection, r: SiteRecord, site: VerifySite): AttentionSite | undefined {
  const scope = r.scope ?? 'main';
  if (site.call) {
    const inner = d.calls.find((c) => c.scope === scope && c.layer === r.layer)?.inner;
    return inner && 'softmax' in inner ? inner : undefined;
  }
  return d.sites.find((s) => s.scope === scope && nodeLabel(s.softmax) === r.softmax);
}

function fusedSite(d: Detection, r: SiteRecord, site: VerifySite): FusedSite | undefined {
  if (!r.kind) return undefined;
  const scope = r.scope ?? 'main';
  if (site.call) {
    const call = d.calls.find((c) => c.scope === scope && c.layer === r.layer);
    return call && !('softmax' in call.inner) ? call.inner : undefined;
  }
  const found = d.fused.find((f) => f.scope === scope && nodeLabel(f.node) === r.softmax);
  if (!found) fail(`detection on the original model finds no ${r.kind} '${r.softmax}' in ${scope}`);
  return found;
}
