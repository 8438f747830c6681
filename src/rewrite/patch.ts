/** The patch itself: detect sites, choose n and s per site, insert the factors, sort, record. */
import { AttentionSite, defaultOpset, Detection, findAttentionSoftmax, label, PATCH_PREFIX, SkippedSoftmax } from '../detect/find-attention';
import { InputError } from '../errors';
import { Graph } from '../graph/graph';
import { makeTensor } from '../graph/tensor';
import { topoSort } from '../graph/toposort';
import { DataType, decodeModel, encodeModel, ModelProto, toNumber } from '../io/onnx';
import { chooseN, NOption } from '../policy/n-mode';
import { LayerScale, resolveScaleSpec, ScaleOptions, ScaleSpec, scalesForLayers } from '../policy/scale';
import { Builder } from './builder';
import { insertScale } from './insert-scale';
import { findScaleInitializer, readRecord, SiteRecord, writeRecord } from './record';
import { VERSION } from '../version';

export interface PatchOptions extends ScaleOptions {
  /** How n is computed at each site (default auto). */
  n?: NOption;
  /** Already parsed s (from a JSON file or an API caller); overrides s / trainLen / sFile. */
  scale?: ScaleSpec;
  /** On an already patched model, replace s instead of refusing. */
  updateS?: boolean;
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

export function cloneModel(model: ModelProto): ModelProto {
  return decodeModel(encodeModel(model));
}

/** Patches a copy of `model`; the argument is left unchanged. */
export function patchModel(model: ModelProto, options: PatchOptions): PatchResult {
  const spec = options.scale ?? resolveScaleSpec(options);
  const out = cloneModel(model);
  const graph = new Graph(out.graph!);
  const detection = findAttentionSoftmax(out, graph);
  if (detection.sites.length === 0) throw new InputError(noAttentionMessage(detection));
  const scales = scalesForLayers(spec, detection.sites.map((s) => s.heads.heads));
  const already = detection.sites.filter((s) => s.patchedBy);
  if (already.length > 0) {
    if (!options.updateS) {
      throw new InputError(`model is already patched (${already.length} SSMax sites); pass --update-s to change s instead of adding a second factor`);
    }
    return { model: out, report: updateScales(out, graph, detection, scales) };
  }
  const opset = defaultOpset(out);
  const irVersion = toNumber(out.irVersion);
  const records: SiteRecord[] = [];
  const sites: PatchedSite[] = [];
  for (const site of detection.sites) {
    const n = chooseN(options.n ?? 'auto', site.mask);
    const b = new Builder(graph, `${PATCH_PREFIX}L${site.layer}/`, irVersion);
    const inserted = insertScale(b, site, scales[site.layer], n.mode, opset);
    graph.proto.node.push(...b.added);
    sites.push(describe(site, n.mode, n.reason, scales[site.layer], inserted.sName));
    records.push({ layer: site.layer, softmax: label(site.softmax), n: n.mode, s: scales[site.layer], sInitializer: inserted.sName,
      apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType });
  }
  topoSort(out.graph!);
  writeRecord(out, { tool: 'ssmax-patch', version: VERSION, preset: 'ssmax', scale: describeSpec(spec),
    trainLen: options.trainLen, sites: records });
  return { model: out, report: { sites, skipped: detection.skipped, updated: false, opset, irVersion } };
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
function updateScales(model: ModelProto, graph: Graph, detection: Detection, scales: LayerScale[]): PatchReport {
  const record = readRecord(model);
  const sites: PatchedSite[] = [];
  for (const site of detection.sites) {
    const name = site.patchedBy ? findScaleInitializer(graph, site.patchedBy) : null;
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
