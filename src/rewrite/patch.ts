/**
 * The patch itself: detect sites in every graph of the model, choose n and s per site, insert the factors,
 * sort, record.
 */
import { AttentionSite, CallSite, defaultOpset, Detection, detectAttention, label, PATCH_PREFIX, SkippedSoftmax } from '../detect/find-attention';
import { FusedSite } from '../detect/fused';
import { InputError } from '../errors';
import { Graph } from '../graph/graph';
import { modelScopes, Scope } from '../graph/scopes';
import { makeTensor } from '../graph/tensor';
import { cloneModel as cloneTracked, DataType, GraphProto, ModelProto, NodeProto, toNumber } from '../io/onnx';
import { topoSort } from '../graph/toposort';
import { validateGraph } from '../graph/validate';
import { Factor, findFactors } from './existing';
import { maskUses } from '../detect/mask-uses';
import { SymbolicShapes } from '../graph/symbolic';
import { Preset, PresetName, presetNeedsPositions, presetScale, resolvePreset } from '../policy/factor';
import { selectLayers } from '../policy/layers';
import { chooseN, countsMasks, NMode, NOption, positionN } from '../policy/n-mode';
import { LayerScale, resolveScaleSpec, ScaleOptions, ScaleSpec, scalesForLayers } from '../policy/scale';
import { Builder } from './builder';
import { describePlan, insertFused, modeOf, planFor } from './fused';
import { insertScale, ScaleContext, Target } from './insert-scale';
import { NSources } from './n-source';
import { findScaleTensor, PatchRecord, readRecord, SiteRecord, writeRecord } from './record';
import { VERSION } from '../version';

export interface PatchOptions extends ScaleOptions {
  /** How n is computed at each site (default auto). */
  n?: NOption;
  /** Already parsed s (from a JSON file or an API caller); overrides s / trainLen / sFile. */
  scale?: ScaleSpec;
  /** On an already patched model, replace s instead of refusing. */
  updateS?: boolean;
  /** Node names of refused sites to patch anyway (the deviation from exact SSMax is accepted knowingly). */
  force?: string[];
  /** ssmax (default), qwen-logn or llama4, with their parameters. */
  preset?: string;
  b?: number;
  floorScale?: number;
  attnScale?: number;
  /** Layers to patch: "3,7,11" or "every:4" (default all). */
  layers?: string;
  /** Accept nodes out of topological order and write them sorted (otherwise such a graph is refused). */
  sortNodes?: boolean;
}

export interface PatchedSite {
  node: string;
  layer: number;
  /** The graph holding the site: `main`, a subgraph path (`main/<node>.<attribute>`), or the caller of a function. */
  scope: string;
  /** `Softmax`, the fused operator (`com.microsoft.MultiHeadAttention`, `Attention`, ...), or `call <function>`. */
  kind: string;
  n: string;
  nReason: string;
  heads: number | null;
  headAxis: number | null;
  headsReason: string;
  logitsRank: number | null;
  /** The tensor the factor multiplies: the content logits, or the fused operator's query (or weights). */
  logits: string;
  s: LayerScale;
  sInitializer: string;
  /** Set when --force-site accepted a deviation from exact SSMax at this site. */
  deviation?: string;
  /** Where the factor multiplies: the query rows (cheap) or the logits. */
  target: Target;
  /** Sites with the same key share one computation of n. */
  nShared: string;
}

export interface PatchReport {
  sites: PatchedSite[];
  skipped: SkippedSoftmax[];
  updated: boolean;
  opset: number;
  irVersion: number;
  preset: PresetName;
  /** Distinct computations of n in the patched model. */
  nSources: number;
}

export interface PatchResult {
  model: ModelProto;
  report: PatchReport;
}

/** A deep copy that keeps the provenance of every message, so it is still written losslessly. */
export function cloneModel(model: ModelProto): ModelProto {
  return cloneTracked(model);
}

/** Checks the graph before anything walks it; sorts it when asked to accept unsorted nodes. */
export function prepareGraph(graph: GraphProto, sortNodes = false): void {
  validateGraph(graph, { allowUnsorted: sortNodes });
  if (sortNodes) topoSort(graph);
}

type AnySite = { kind: 'softmax'; site: AttentionSite } | { kind: 'fused'; site: FusedSite } | { kind: 'call'; site: CallSite };

/** Every site in scope order, then layer order: the order of the report and of per-layer s rows. */
function orderedSites(d: Detection, scopes: Scope[]): AnySite[] {
  const all: AnySite[] = [
    ...d.sites.map((site) => ({ kind: 'softmax' as const, site })),
    ...d.fused.map((site) => ({ kind: 'fused' as const, site })),
    ...d.calls.map((site) => ({ kind: 'call' as const, site })),
  ];
  const rank = new Map(scopes.map((s, i) => [s.path, i]));
  return all.sort((a, b) => (rank.get(a.site.scope)! - rank.get(b.site.scope)!) || a.site.layer - b.site.layer);
}

const headsOf = (a: AnySite): number | undefined => (a.kind === 'call' ? a.site.inner.heads.heads : a.site.heads.heads);

/** Patches a copy of `model`; the argument is left unchanged. */
export function patchModel(model: ModelProto, options: PatchOptions): PatchResult {
  const preset = resolvePreset(options);
  const spec = options.scale ?? scaleSpecFor(preset, options);
  const out = cloneModel(model);
  prepareGraph(out.graph!, options.sortNodes);
  const scopes = modelScopes(out);
  const detection = detectAttention(out, scopes, { force: options.force });
  checkForced(options.force ?? [], detection);
  const all = orderedSites(detection, scopes);
  if (all.length === 0) throw new InputError(noAttentionMessage(detection));
  // A patch is recognised from the graph, not only from metadata: by its node names, or, renamed by another
  // tool, by the structure of its factors.
  const renamed = findFactors(scopes[0].graph).filter((f) => !f.apply.name.startsWith(PATCH_PREFIX));
  if (renamed.length > 0 && !all.some((a) => patchedBy(a))) {
    if (!options.updateS) {
      throw new InputError(`model is already patched (${renamed.length} SSMax sites, renamed by another tool); pass --update-s to change s instead of adding a second factor`);
    }
    return { model: out, report: updateRenamed(out, scopes[0].graph, renamed, spec, detection.skipped) };
  }
  if (all.some((a) => patchedBy(a))) {
    const already = all.filter((a) => patchedBy(a));
    if (!options.updateS) {
      throw new InputError(`model is already patched (${already.length} SSMax sites); pass --update-s to change s instead of adding a second factor`);
    }
    return { model: out, report: updateScales(out, scopes, detection, already, scalesForSites(spec, already, [])) };
  }
  const { sites, skipped } = selectSites(all, detection.skipped, options.layers);
  const scales = scalesForSites(spec, sites, skipped);
  const irVersion = toNumber(out.irVersion);
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  const contexts = new Map<string, PatchContext>();
  const contextOf = (scope: Scope): PatchContext => {
    let ctx = contexts.get(scope.path);
    if (!ctx) {
      ctx = newContext(scope, preset, irVersion, options.n ?? 'auto');
      contexts.set(scope.path, ctx);
    }
    return ctx;
  };
  const records: SiteRecord[] = [];
  const patched: PatchedSite[] = [];
  const bodies = new Map<object, PatchedBody>();
  const builders: [Scope, Builder][] = [];
  for (const [i, a] of sites.entries()) {
    const scope = byPath.get(a.site.scope)!;
    const s = scales[i];
    const b = builderFor(scope, a.site.layer, irVersion);
    let result: { site: PatchedSite; record: SiteRecord };
    if (a.kind === 'softmax') result = patchSoftmax(contextOf(scope), b, a.site, s);
    else if (a.kind === 'fused') result = patchFused(b, scope, a.site, s, options.n ?? 'auto', preset);
    else result = patchCall(b, a.site, s, contextOf, byPath, irVersion, bodies, options.n ?? 'auto', preset);
    builders.push([scope, b]);
    patched.push(result.site);
    records.push(result.record);
  }
  // Shared computations of n first, so each graph's nodes read in pipeline order before the topological sort.
  for (const ctx of contexts.values()) ctx.scope.graph.proto.node.push(...ctx.shared.added);
  for (const [scope, b] of builders) scope.graph.proto.node.push(...b.added);
  for (const scope of scopes) scope.commit();
  writeRecord(out, { tool: 'ssmax-patch', version: VERSION, preset: preset.kind, scale: describeSpec(spec),
    trainLen: options.trainLen, ...presetParams(preset), sites: records });
  const nSources = [...contexts.values()].reduce((acc, c) => acc + c.ctx.sources.size, 0);
  return {
    model: out,
    report: { sites: patched, skipped, updated: false, opset: defaultOpset(out), irVersion, preset: preset.kind, nSources },
  };
}

/** Per graph: the shared builder for n, the symbolic shapes it is keyed by, and the options every site shares. */
interface PatchContext {
  scope: Scope;
  shared: Builder;
  ctx: ScaleContext;
  option: NOption;
}

function newContext(scope: Scope, preset: Preset, irVersion: number, option: NOption): PatchContext {
  const shared = builderFor(scope, 'shared', irVersion);
  const sources = new NSources(shared, new SymbolicShapes(scope.graph), scope.opset);
  return { scope, shared, option, ctx: { graph: scope.graph, sources, preset, opset: scope.opset, ranks: scope.ranks, types: scope.types } };
}

/** --layers: the sites in the chosen layers; the others are reported as skipped. */
function selectSites(all: AnySite[], skipped: SkippedSoftmax[], layers: string | undefined): { sites: AnySite[]; skipped: SkippedSoftmax[] } {
  if (layers === undefined) return { sites: all, skipped };
  const count = Math.max(...all.map((a) => a.site.layer)) + 1;
  const chosen = selectLayers(layers, count);
  const sites = all.filter((a) => chosen.has(a.site.layer));
  if (sites.length === 0) throw new InputError(`--layers ${layers} selects none of the ${count} attention layers`);
  const left = all.filter((a) => !chosen.has(a.site.layer)).map((a) => ({
    node: label(a.kind === 'softmax' ? a.site.softmax : a.kind === 'fused' ? a.site.node : a.site.call),
    reason: `layer ${a.site.layer} not in --layers ${layers}`, scope: a.site.scope,
  }));
  return { sites, skipped: [...skipped, ...left] };
}

/** s per preset: llama4's s is its attn_scale; the others take --s, --train-len or --s-file. */
function scaleSpecFor(preset: Preset, options: PatchOptions): ScaleSpec {
  if (preset.kind !== 'ssmax' && (options.s !== undefined || options.sFile !== undefined)) {
    throw new InputError(`--preset ${preset.kind} takes ${preset.kind === 'llama4' ? '--attn-scale' : 's = 1/ln L from --train-len'}, not --s or --s-file`);
  }
  if (preset.kind === 'llama4') {
    return { kind: 'scalar', s: presetScale(preset)!, from: '--attn-scale' };
  }
  return resolveScaleSpec(options);
}

function presetParams(p: Preset): Partial<PatchRecord> {
  if (p.kind === 'llama4') return { floorScale: p.floorScale, attnScale: p.attnScale };
  if (p.kind === 'ssmax' && p.b !== undefined) return { b: p.b };
  return {};
}

function builderFor(scope: Scope, layer: number | 'shared', irVersion: number): Builder {
  // Function bodies have no initializers; an IR < 4 subgraph would need each initializer declared as an input.
  const constantNodes = scope.kind === 'function' || (scope.kind === 'subgraph' && irVersion < 4);
  const prefix = layer === 'shared' ? `${PATCH_PREFIX}shared/` : `${PATCH_PREFIX}L${layer}/`;
  return new Builder(scope.graph, prefix, scope.kind === 'main' ? irVersion : Math.max(irVersion, 4), { constantNodes });
}

function patchSoftmax(pc: PatchContext, b: Builder, site: AttentionSite, s: LayerScale, sInput?: string): { site: PatchedSite; record: SiteRecord } {
  const uses = maskUses(pc.scope.graph, site.afterLogits, pc.scope.ranks);
  const n = presetNeedsPositions(pc.ctx.preset) ? positionN(pc.option) : chooseN(pc.option, uses, site.mask.reason, `layer ${site.layer}${site.scope === 'main' ? '' : ` of ${site.scope}`}`);
  const inserted = insertScale(pc.ctx, b, site, s, n, uses, sInput);
  return {
    site: { ...describe(site, n.mode, n.reason, s, inserted.sName), target: inserted.target, nShared: inserted.nKey },
    record: { layer: site.layer, scope: site.scope, softmax: label(site.softmax), n: n.mode, s, sInitializer: inserted.sName,
      apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType, target: inserted.target,
      logits: site.qkMatMul.output[0] },
  };
}

function patchFused(b: Builder, scope: Scope, site: FusedSite, s: LayerScale, option: NOption, preset: Preset, sInput?: string): { site: PatchedSite; record: SiteRecord } {
  if (preset.kind !== 'ssmax' || preset.b !== undefined) {
    throw new InputError(`${label(site.node)} (${site.op}): --preset ${preset.kind}${preset.kind === 'ssmax' ? ' with --b' : ''} is not supported on fused attention operators yet`);
  }
  if (countsMasks(option)) throw new InputError(`${label(site.node)} (${site.op}): --n ${option} needs the mask outside the kernel; use --n auto, keys or causal`);
  const plan = planFor(site, option === 'auto' ? modeOf(site.n) : option);
  const mode = modeOf(plan);
  const logits = site.node.input[site.query.layout === 'weights' ? site.query.weights : site.query.input];
  const inserted = insertFused(b, site, s, plan, scope.opset, sInput);
  const why = option === 'auto' ? `auto: ${site.mask.reason}` : `--n ${option}`;
  const nReason = `${why}; ${describePlan(plan)}${option === 'causal' && mode === 'keys' ? ' (this operator cannot take a per-row n)' : ''}`;
  return {
    site: {
      node: label(site.node), layer: site.layer, scope: site.scope, kind: site.op, n: mode, nReason,
      heads: site.heads.heads ?? null, headAxis: site.heads.axis ?? null, headsReason: site.heads.reason,
      logitsRank: 4, logits, s, sInitializer: inserted.sName, ...(site.forced ? { deviation: site.deviation } : {}),
      target: 'query', nShared: `site:${label(site.node)}`,
    },
    record: { layer: site.layer, scope: site.scope, softmax: label(site.node), kind: site.op, n: mode, s, sInitializer: inserted.sName,
      apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType },
  };
}

/**
 * A function body holding attention is patched once, with s coming in through a new function input; every
 * call passes its own s (its own layer), so one function used by N layers gets N independent s values.
 */
function patchCall(b: Builder, call: CallSite, s: LayerScale, contextOf: (scope: Scope) => PatchContext, byPath: Map<string, Scope>,
  irVersion: number, bodies: Map<object, PatchedBody>, option: NOption, preset: Preset): { site: PatchedSite; record: SiteRecord } {
  let body = bodies.get(call.inner);
  if (!body) {
    const fnScope = byPath.get(call.inner.scope)!;
    const input = fnScope.graph.uniqueName(`ssmax_s_${call.inner.layer}`);
    fnScope.fn!.input.push(input);
    fnScope.graph.proto.input.push({ name: input });
    const bb = builderFor(fnScope, call.inner.layer, irVersion);
    const inner = 'softmax' in call.inner
      ? patchSoftmax(contextOf(fnScope), bb, call.inner, s, input)
      : patchFused(bb, fnScope, call.inner, s, option, preset, input);
    fnScope.graph.proto.node.push(...bb.added);
    body = { input, ...inner };
    bodies.set(call.inner, body);
  }
  const position = call.fn.input.indexOf(body.input);
  const perHead = Array.isArray(s);
  const sName = b.constant('s', DataType.FLOAT, perHead ? [s.length, 1, 1] : [], perHead ? s : [s]);
  while (call.call.input.length < position) call.call.input.push('');
  call.call.input[position] = sName;
  const node = `${label(call.call)} → ${body.site.node}`;
  const site = { ...body.site, layer: call.layer, scope: call.scope, kind: `call ${call.fn.domain}:${call.fn.name}`, node, s, sInitializer: sName };
  return { site, record: { ...body.record, layer: call.layer, scope: call.scope, softmax: node, s, sInitializer: sName } };
}

interface PatchedBody { input: string; site: PatchedSite; record: SiteRecord }

function describe(site: AttentionSite, n: NMode, nReason: string, s: LayerScale, sInitializer: string): Omit<PatchedSite, 'target' | 'nShared'> {
  return {
    node: label(site.softmax), layer: site.layer, scope: site.scope, kind: 'Softmax', n, nReason, heads: site.heads.heads ?? null,
    headAxis: site.heads.axis ?? null, headsReason: site.heads.reason, logitsRank: site.logitsRank ?? null,
    logits: site.logits, s, sInitializer, ...(site.forced ? { deviation: site.forced } : {}),
  };
}

function describeSpec(spec: ScaleSpec): string {
  if (spec.kind === 'scalar') return `s=${spec.s} (${spec.from})`;
  return spec.kind === 'per-head' ? 'per-head s' : 'per-layer, per-head s';
}

function noAttentionMessage(d: Detection): string {
  if (d.skipped.length === 0) return 'no Softmax in the model: nothing to patch';
  const reasons = [...new Set(d.skipped.map((s) => s.reason))].join('; ');
  const forcible = d.skipped.filter((s) => s.forcible).map((s) => s.node);
  const hint = forcible.length ? ` (--force-site ${forcible[0]} patches a refused site anyway)` : '';
  const what = d.skipped.some((k) => k.attention) ? 'node(s)' : 'Softmax';
  return `no attention Softmax found (${d.skipped.length} ${what} skipped: ${reasons})${hint}`;
}

/** Every --force-site name must name a refused or patched site, so a typo is not silently ignored. */
function checkForced(force: string[], d: Detection): void {
  const known = new Set([
    ...d.sites.map((s) => label(s.softmax)), ...d.fused.map((s) => label(s.node)),
    ...d.calls.map((c) => label('softmax' in c.inner ? c.inner.softmax : c.inner.node)),
  ]);
  for (const name of force) {
    if (known.has(name)) continue;
    const skipped = d.skipped.find((s) => s.node === name);
    if (skipped) throw new InputError(`--force-site ${name}: cannot be forced (${skipped.reason})`);
    const refusable = d.skipped.filter((s) => s.forcible).map((s) => s.node);
    throw new InputError(`--force-site ${name}: no such attention node${refusable.length ? ` (refused sites: ${refusable.join(', ')})` : ''}`);
  }
}

/**
 * s for every site. Layers are numbered per graph, so a per-layer s file gives row k to layer k of every graph
 * that holds attention (e.g. both branches of an If, or the init and step decoders of a GreedySearch).
 * Refused attention keeps its layer number: its row is read and not used.
 */
function scalesForSites(spec: ScaleSpec, sites: AnySite[], skipped: SkippedSoftmax[]): LayerScale[] {
  const heads = new Map<string, (number | undefined)[]>();
  const slot = (scope: string, layer: number, h: number | undefined): void => {
    const list = heads.get(scope) ?? [];
    while (list.length <= layer) list.push(undefined);
    list[layer] = h;
    heads.set(scope, list);
  };
  for (const k of skipped) if (k.layer !== undefined) slot(k.scope ?? 'main', k.layer, undefined);
  for (const a of sites) slot(a.site.scope, a.site.layer, headsOf(a));
  const rows = new Map<string, LayerScale[]>();
  for (const [scope, list] of heads) {
    try {
      rows.set(scope, scalesForLayers(spec, list));
    } catch (e) {
      if (e instanceof InputError && scope !== 'main') throw new InputError(`${scope}: ${e.message}`);
      throw e;
    }
  }
  return sites.map((a) => {
    const row = rows.get(a.site.scope)![a.site.layer];
    if (Array.isArray(row) && row.length > 1 && headsOf(a) === undefined) {
      const why = a.kind === 'call' ? a.site.inner.heads.reason : a.site.heads.reason;
      const where = a.site.scope === 'main' ? '' : ` of ${a.site.scope}`;
      throw new InputError(`layer ${a.site.layer}${where}: per-head s given, but the head count is unknown (${why}); give one s for the layer`);
    }
    return row;
  });
}

function patchedBy(a: AnySite): boolean {
  return Boolean(a.kind === 'call' ? a.site.inner.patchedBy : a.site.patchedBy);
}

/** Replaces the s values of an earlier patch in place; the factor structure stays as it is. */
function updateScales(model: ModelProto, scopes: Scope[], detection: Detection, sites: AnySite[], scales: LayerScale[]): PatchReport {
  const record = readRecord(model);
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  const out: PatchedSite[] = [];
  sites.forEach((a, i) => {
    const scope = byPath.get(a.site.scope)!;
    const apply = a.kind === 'call' ? a.site.inner.patchedBy : a.site.patchedBy;
    if (!apply) throw new InputError(`layer ${a.site.layer}: not patched while other layers are; patch the original model instead`);
    const name = a.kind === 'call' ? callScaleName(a.site, byPath, apply) : findScaleTensor(scope.graph, apply);
    if (!name || !scope.graph.initializers.has(name)) throw new InputError(`layer ${a.site.layer}: patched, but its s initializer was not found`);
    replaceScale(scope.graph, name, scales[i], a.site.layer);
    const rec = record?.sites.find((r) => r.sInitializer === name && (r.scope ?? 'main') === a.site.scope);
    if (rec) rec.s = scales[i];
    const node = a.kind === 'softmax' ? a.site.softmax : a.kind === 'fused' ? a.site.node : a.site.call;
    const heads = headsOf(a);
    out.push({
      node: label(node), layer: a.site.layer, scope: a.site.scope, kind: a.kind === 'softmax' ? 'Softmax' : a.kind === 'fused' ? a.site.op : `call ${a.site.fn.name}`,
      n: rec?.n ?? 'unchanged', nReason: 'kept from the earlier patch', heads: heads ?? null, headAxis: null, headsReason: '',
      logitsRank: null, logits: '', s: scales[i], sInitializer: name, target: rec?.target ?? 'logits', nShared: 'unchanged',
    });
  });
  if (record) writeRecord(model, record);
  return { sites: out, skipped: detection.skipped, updated: true, opset: defaultOpset(model), irVersion: toNumber(model.irVersion),
    preset: record?.preset ?? 'ssmax', nSources: 0 };
}

/** --update-s on factors found by structure only (renamed, no record): s is the one float initializer each uses. */
function updateRenamed(model: ModelProto, graph: Graph, factors: Factor[], spec: ScaleSpec, skipped: SkippedSoftmax[]): PatchReport {
  const scales = scalesForLayers(spec, factors.map(() => undefined));
  const sites = factors.map((f, i): PatchedSite => {
    const name = findScaleTensor(graph, f.apply, f.factor, f.logits);
    if (!name || !graph.initializers.has(name)) throw new InputError(`factor ${label(f.apply)}: its s initializer was not found`);
    replaceScale(graph, name, scales[i], i);
    return {
      node: f.softmax ? label(f.softmax) : label(f.apply), layer: f.layer ?? i, scope: 'main', kind: 'Softmax', n: 'unchanged',
      nReason: 'kept from the earlier patch', heads: null, headAxis: null, headsReason: '', logitsRank: null, logits: f.logits,
      s: scales[i], sInitializer: name, target: 'logits', nShared: 'unchanged',
    };
  });
  return { sites, skipped, updated: true, opset: defaultOpset(model), irVersion: toNumber(model.irVersion), preset: 'ssmax', nSources: 0 };
}

function replaceScale(graph: Graph, name: string, s: LayerScale, layer: number): void {
  const old = graph.initializers.get(name)!;
  const dims = Array.isArray(s) ? [s.length, 1, 1] : [];
  if (old.dims.map(toNumber).join() !== dims.join()) {
    throw new InputError(`layer ${layer}: cannot change s from shape [${old.dims.join(',')}] to [${dims.join(',')}] in place; patch the original model instead`);
  }
  // The initializer may belong to an enclosing graph.
  let owner: Graph | undefined = graph;
  while (owner && !owner.proto.initializer.includes(old)) owner = owner.parent;
  const list = owner!.proto.initializer;
  list[list.indexOf(old)] = makeTensor(name, DataType.FLOAT, dims, Array.isArray(s) ? s : [s]);
}

function callScaleName(call: CallSite, byPath: Map<string, Scope>, apply: NodeProto): string | null {
  const fnInput = findScaleTensor(byPath.get(call.inner.scope)!.graph, apply);
  const position = fnInput ? call.fn.input.indexOf(fnInput) : -1;
  return position >= 0 ? call.call.input[position] ?? null : null;
}
