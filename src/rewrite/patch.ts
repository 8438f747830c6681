/** The patch itself: detect sites, choose n and s per site, insert the factors, sort, record. */
import { AttentionSite, defaultOpset, Detection, findAttentionSoftmax, label, PATCH_PREFIX, SkippedSoftmax } from '../detect/find-attention';
import { InputError } from '../errors';
import { Graph } from '../graph/graph';
import { makeTensor } from '../graph/tensor';
import { topoSort } from '../graph/toposort';
import { validateGraph } from '../graph/validate';
import { cloneModel as cloneTracked, DataType, GraphProto, ModelProto, NodeProto, toNumber } from '../io/onnx';
import { chooseN, NOption } from '../policy/n-mode';
import { LayerScale, resolveScaleSpec, ScaleOptions, ScaleSpec, scalesForLayers } from '../policy/scale';
import { Builder } from './builder';
import { insertScale } from './insert-scale';
import { Factor, findFactors } from './existing';
import { findScaleInitializer, readRecord, SiteRecord, writeRecord } from './record';
import { VERSION } from '../version';

export interface PatchOptions extends ScaleOptions {
  /** How n is computed at each site (default auto). */
  n?: NOption;
  /** Already parsed s (from a JSON file or an API caller); overrides s / trainLen / sFile. */
  scale?: ScaleSpec;
  /** On an already patched model, replace s instead of refusing. */
  updateS?: boolean;
  /** Accept nodes out of topological order and write them sorted (otherwise such a graph is refused). */
  sortNodes?: boolean;
}

export interface PatchedSite {
  node: string;
  layer: number;
  n: string;
  nReason: string;
  heads: number | null;
  headAxis: number | null;
  headsReason: string;
  logitsRank: number | null;
  logits: string;
  s: LayerScale;
  sInitializer: string;
}

export interface PatchReport {
  sites: PatchedSite[];
  skipped: SkippedSoftmax[];
  updated: boolean;
  opset: number;
  irVersion: number;
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

/** Patches a copy of `model`; the argument is left unchanged. */
export function patchModel(model: ModelProto, options: PatchOptions): PatchResult {
  const spec = options.scale ?? resolveScaleSpec(options);
  const out = cloneModel(model);
  prepareGraph(out.graph!, options.sortNodes);
  const graph = new Graph(out.graph!);
  const detection = findAttentionSoftmax(out, graph);
  if (detection.sites.length === 0) throw new InputError(noAttentionMessage(detection));
  const scales = scalesForLayers(spec, detection.sites.map((s) => s.heads.heads));
  const factors = findFactors(graph);
  const applied = (site: AttentionSite): NodeProto | undefined =>
    site.patchedBy ?? factors.find((f) => f.softmax === site.softmax)?.apply;
  const already = Math.max(detection.sites.filter(applied).length, factors.length);
  if (already > 0) {
    if (!options.updateS) {
      throw new InputError(`model is already patched (${already} SSMax sites); pass --update-s to change s instead of adding a second factor`);
    }
    return { model: out, report: updateScales(out, graph, detection, scales, applied, factors) };
  }
  const opset = defaultOpset(out);
  const irVersion = toNumber(out.irVersion);
  const records: SiteRecord[] = [];
  const sites: PatchedSite[] = [];
  for (const site of detection.sites) {
    const n = chooseN(options.n ?? 'auto', site.mask);
    const b = new Builder(graph, `${PATCH_PREFIX}L${site.layer}/`, irVersion);
    const inserted = insertScale(b, site, scales[site.layer], n.mode, opset);
    placeBefore(graph.proto.node, site.consumer.node, b.added);
    sites.push(describe(site, n.mode, n.reason, scales[site.layer], inserted.sName));
    records.push({ layer: site.layer, softmax: label(site.softmax), n: n.mode, s: scales[site.layer], sInitializer: inserted.sName,
      apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType });
  }
  writeRecord(out, { tool: 'ssmax-patch', version: VERSION, preset: 'ssmax', scale: describeSpec(spec),
    trainLen: options.trainLen, sites: records });
  return { model: out, report: { sites, skipped: detection.skipped, updated: false, opset, irVersion } };
}

/**
 * Puts a site's new nodes just before the node that reads the scaled logits: a valid order (they read only
 * the logits and constants), and every original node keeps its place, so a revert restores the same order.
 */
function placeBefore(nodes: NodeProto[], consumer: NodeProto, added: NodeProto[]): void {
  const at = nodes.indexOf(consumer);
  nodes.splice(at < 0 ? nodes.length : at, 0, ...added);
}

function describe(site: AttentionSite, n: string, nReason: string, s: LayerScale, sInitializer: string): PatchedSite {
  return {
    node: label(site.softmax), layer: site.layer, n, nReason, heads: site.heads.heads ?? null,
    headAxis: site.heads.axis ?? null, headsReason: site.heads.reason, logitsRank: site.logitsRank ?? null,
    logits: site.logits, s, sInitializer,
  };
}

function describeSpec(spec: ScaleSpec): string {
  if (spec.kind === 'scalar') return `s=${spec.s} (${spec.from})`;
  return spec.kind === 'per-head' ? 'per-head s' : 'per-layer, per-head s';
}

function noAttentionMessage(d: Detection): string {
  if (d.skipped.length === 0) return 'no Softmax in the model: nothing to patch';
  const reasons = [...new Set(d.skipped.map((s) => s.reason))].join('; ');
  return `no attention Softmax found (${d.skipped.length} Softmax skipped: ${reasons})`;
}

/** Replaces the s initializers of an earlier patch in place; the factor structure stays as it is. */
function updateScales(
  model: ModelProto, graph: Graph, detection: Detection, scales: LayerScale[],
  applied: (site: AttentionSite) => NodeProto | undefined, factors: Factor[],
): PatchReport {
  const record = readRecord(model);
  const sites: PatchedSite[] = [];
  for (const site of detection.sites) {
    const apply = applied(site);
    const factor = factors.find((f) => f.apply === apply);
    const name = apply ? findScaleInitializer(graph, apply, factor?.factor, factor?.logits) : null;
    if (!name) throw new InputError(`layer ${site.layer}: patched, but its s initializer was not found`);
    const old = graph.initializers.get(name)!;
    const s = scales[site.layer];
    const dims = Array.isArray(s) ? [s.length, 1, 1] : [];
    if (old.dims.map(toNumber).join() !== dims.join()) {
      throw new InputError(`layer ${site.layer}: cannot change s from shape [${old.dims.join(',')}] to [${dims.join(',')}] in place; patch the original model instead`);
    }
    const index = graph.proto.initializer.indexOf(old);
    graph.proto.initializer[index] = makeTensor(name, DataType.FLOAT, dims, Array.isArray(s) ? s : [s]);
    const rec = record?.sites.find((r) => r.sInitializer === name);
    if (rec) rec.s = s;
    sites.push(describe(site, rec?.n ?? 'unchanged', 'kept from the earlier patch', s, name));
  }
  if (record) writeRecord(model, record);
  return { sites, skipped: detection.skipped, updated: true, opset: defaultOpset(model), irVersion: toNumber(model.irVersion) };
}
