/**
 * Updating s of an existing patch in place: the factor's structure stays, only the s initializers change. The
 * record says which initializer belongs to which site; without a record (another tool dropped it, or renamed
 * every node), the factors are found from the graph.
 */
import { CallSite, defaultOpset, Detection, SkippedSoftmax } from '../detect/find-attention';
import { InputError, opt } from '../errors';
import { THETAS } from '../policy/prior';
import { Graph, nodeLabel } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { makeTensor } from '../graph/tensor';
import { DataType, ModelProto, NodeProto, toNumber } from '../io/onnx';
import { PatchPlan } from '../policy/plan';
import { LayerScale, ScaleSpec, scalesForLayers } from '../policy/scale';
import { Factor } from './existing';
import { findScaleTensor, PatchRecord, readRecord, recordedLabel, SiteRecord, writeRecord } from './record';
import { PatchedSite, PatchReport } from './report';
import { AnySite, headsByScope, headsOf, orderedSites, scalesForSites, siteNode, thetasForSites } from './sites';

/**
 * The record's sites get the s (and θ) the plan gives their layers, in place; the record notes the new s, train
 * length and prior. Sites whose operator the patch expanded are found by the record alone (their node is gone).
 */
export function updateFromRecord(model: ModelProto, scopes: Scope[], detection: Detection, record: PatchRecord, plan: PatchPlan): PatchReport {
  if (record.preset !== plan.preset.kind) {
    throw new InputError(`the model is patched with the ${record.preset} preset; an update keeps it: give no other preset, or revert and patch again`, 'usage');
  }
  if (plan.preset.kind === 'slope' && plan.preset.trainLen !== record.trainLen) {
    throw new InputError(`the slope patch has L = ${record.trainLen} in its graph; an update keeps it: give ${opt('trainLen', String(record.trainLen))} or none, or revert and patch again`, 'usage');
  }
  if (plan.prior && !record.prior) throw new InputError(`the patch has no positional prior to update: revert and patch again with ${opt('prior')}`, 'cannot-patch');
  const all = orderedSites(detection, scopes);
  const rows = plan.spec && layerScales(plan.spec, all, record, detection.skipped);
  const thetas = plan.prior && thetasForSites(plan.prior, all, detection.skipped);
  const byLayer = new Map(all.map((a, i) => [`${a.site.scope}|${a.site.layer}`, i]));
  const graphOf = new Map(scopes.map((s) => [s.path, s.graph]));
  const sites = record.sites.map((rec): PatchedSite => {
    const scope = rec.scope ?? 'main';
    const i = byLayer.get(`${scope}|${rec.layer}`);
    if (i === undefined && !rec.expanded) throw new InputError(`layer ${rec.layer}${scope === 'main' ? '' : ` of ${scope}`}: patched, but no longer found as attention`, 'cannot-patch');
    const graph = graphOf.get(scope)!;
    if (rows && rec.sInitializer) {
      const s = rows.get(scope)![rec.layer];
      replaceScale(graph, rec.sInitializer, s, rec.layer);
      rec.s = s;
    }
    if (thetas && rec.prior && i !== undefined) for (const t of THETAS) replaceValues(graph, rec.prior[t], [thetas[i][t].length], thetas[i][t], rec.layer, `theta_${t}`);
    return i !== undefined ? updatedSite(all[i], rec.s ?? null, rec.sInitializer ?? '', rec.n, rec.target) : expandedSite(rec);
  });
  if (plan.spec) {
    record.scale = describeSpec(plan.spec);
    record.trainLen = plan.trainLen;
  }
  if (plan.prior) record.prior = { kind: plan.prior.kind, from: plan.prior.from };
  if (plan.preset.kind === 'llama4') record.attnScale = plan.preset.attnScale;
  writeRecord(model, record);
  return report(model, sites, detection.skipped, record.preset);
}

/** s per layer of each scope, head counts from the sites found and from the record's expanded sites. */
function layerScales(spec: ScaleSpec, all: AnySite[], record: PatchRecord, skipped: SkippedSoftmax[]): Map<string, LayerScale[]> {
  const expanded = record.sites.filter((r) => r.expanded).map((r) => ({ scope: r.scope ?? 'main', layer: r.layer, heads: r.expanded!.heads }));
  const heads = headsByScope(all, skipped, expanded);
  return new Map([...heads].map(([scope, list]) => [scope, scalesForLayers(spec, list)]));
}

function expandedSite(rec: SiteRecord): PatchedSite {
  return {
    node: recordedLabel(rec), layer: rec.layer, scope: rec.scope ?? 'main', kind: rec.kind ?? 'fused', n: rec.n, nReason: 'kept from the earlier patch',
    heads: rec.expanded?.heads ?? null, headAxis: null, headsReason: '', logitsRank: null, logits: '', s: rec.s ?? null,
    sInitializer: rec.sInitializer ?? '', target: rec.target ?? 'query', nShared: 'unchanged', expanded: 'expanded by the earlier patch',
  };
}

/** Sites patched by this tool whose record is gone: the inserted apply nodes are found by their names. */
export function updateByNames(model: ModelProto, scopes: Scope[], detection: Detection, sites: AnySite[], plan: PatchPlan): PatchReport {
  const scales = scalesForSites(specOf(plan), sites, []);
  const record = readRecord(model);
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  const out = sites.map((a, i): PatchedSite => {
    const scope = byPath.get(a.site.scope)!;
    const apply = a.kind === 'call' ? a.site.inner.patchedBy : a.site.patchedBy;
    if (!apply) throw new InputError(`layer ${a.site.layer}: not patched while other layers are; patch the original model instead`, 'cannot-patch');
    const name = a.kind === 'call' ? callScaleName(a.site, byPath, apply) : findScaleTensor(scope.graph, apply);
    if (!name || !scope.graph.initializers.has(name)) throw new InputError(`layer ${a.site.layer}: patched, but its s initializer was not found`, 'cannot-patch');
    replaceScale(scope.graph, name, scales[i], a.site.layer);
    return updatedSite(a, scales[i], name, 'unchanged');
  });
  if (record) writeRecord(model, record);
  return report(model, out, detection.skipped, record?.preset ?? 'ssmax');
}

/** Factors found by structure only (renamed, no record): s is the one float initializer each uses. */
export function updateRenamed(model: ModelProto, graph: Graph, factors: Factor[], spec: ScaleSpec, skipped: SkippedSoftmax[]): PatchReport {
  const scales = scalesForLayers(spec, factors.map(() => undefined));
  const sites = factors.map((f, i): PatchedSite => {
    const name = findScaleTensor(graph, f.apply, f.factor, f.logits);
    if (!name || !graph.initializers.has(name)) throw new InputError(`factor ${nodeLabel(f.apply)}: its s initializer was not found`, 'cannot-patch');
    replaceScale(graph, name, scales[i], i);
    return {
      node: f.softmax ? nodeLabel(f.softmax) : nodeLabel(f.apply), layer: f.layer ?? i, scope: 'main', kind: 'Softmax', n: 'unchanged',
      nReason: 'kept from the earlier patch', heads: null, headAxis: null, headsReason: '', logitsRank: null, logits: f.logits,
      s: scales[i], sInitializer: name, target: 'logits', nShared: 'unchanged',
    };
  });
  return report(model, sites, skipped, 'ssmax');
}

export function describeSpec(spec: ScaleSpec): string {
  if (spec.kind === 'scalar') return `s=${spec.s} (${spec.from})`;
  return spec.kind === 'per-head' ? 'per-head s' : 'per-layer, per-head s';
}

function report(model: ModelProto, sites: PatchedSite[], skipped: SkippedSoftmax[], preset: PatchReport['preset']): PatchReport {
  return { sites, skipped, updated: true, opset: defaultOpset(model), irVersion: toNumber(model.irVersion), preset, nSources: 0, notes: [] };
}

/** Without the record, only s can be found (from the structure of each factor). */
export function specOf(plan: PatchPlan): ScaleSpec {
  if (plan.prior) throw new InputError(`updating a prior needs the patch record (it is gone): revert and patch again`, 'cannot-patch');
  return plan.spec!;
}

function updatedSite(a: AnySite, s: LayerScale | null, sInitializer: string, n: string, target: PatchedSite['target'] = 'logits'): PatchedSite {
  return {
    node: siteNode(a), layer: a.site.layer, scope: a.site.scope,
    kind: a.kind === 'softmax' ? 'Softmax' : a.kind === 'fused' ? a.site.op : `call ${a.site.fn.name}`,
    n, nReason: 'kept from the earlier patch', heads: headsOf(a) ?? null, headAxis: null, headsReason: '', logitsRank: null, logits: '',
    s, sInitializer, target, nShared: 'unchanged',
  };
}

/** The record names an s initializer the model no longer has: renamed by another tool after patching. */
export class StaleRecord extends InputError {}

/** Replaces an s initializer (of this graph or an enclosing one) with the new values, same shape. */
function replaceScale(graph: Graph, name: string, s: LayerScale, layer: number): void {
  replaceValues(graph, name, Array.isArray(s) ? [s.length, 1, 1] : [], s, layer, 's');
}

/** Replaces the values of a float initializer in place; its shape must stay. */
function replaceValues(graph: Graph, name: string, dims: number[], values: number | number[], layer: number, what: string): void {
  const old = graph.initializers.get(name);
  if (!old) throw new StaleRecord(`layer ${layer}: its initializer '${name}' is not in the model (renamed after patching?)`, 'cannot-patch');
  if (old.dims.map(toNumber).join() !== dims.join()) {
    throw new InputError(`layer ${layer}: cannot change ${what} from shape [${old.dims.join(',')}] to [${dims.join(',')}] in place; patch the original model instead`, 'cannot-patch');
  }
  // The initializer may belong to an enclosing graph.
  let owner: Graph | undefined = graph;
  while (owner && !owner.proto.initializer.includes(old)) owner = owner.parent;
  owner!.replaceInitializer(makeTensor(name, DataType.FLOAT, dims, Array.isArray(values) ? values : [values]));
}

function callScaleName(call: CallSite, byPath: Map<string, Scope>, apply: NodeProto): string | null {
  const fnInput = findScaleTensor(byPath.get(call.inner.scope)!.graph, apply);
  const position = fnInput ? call.fn.input.indexOf(fnInput) : -1;
  return position >= 0 ? call.call.input[position] ?? null : null;
}
