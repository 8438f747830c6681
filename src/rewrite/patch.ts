/** The patch itself: detect sites, choose n and s per site, insert the factors, sort, record. */
import { AttentionSite, defaultOpset, Detection, findAttentionSoftmax, label, PATCH_PREFIX, SkippedSoftmax } from '../detect/find-attention';
import { InputError } from '../errors';
import { Graph } from '../graph/graph';
import { makeTensor } from '../graph/tensor';
import { topoSort } from '../graph/toposort';
import { DataType, decodeModel, encodeModel, ModelProto, toNumber } from '../io/onnx';
import { maskUses } from '../detect/mask-uses';
import { inferRanks } from '../graph/ranks';
import { SymbolicShapes } from '../graph/symbolic';
import { inferElemTypes } from '../graph/types';
import { Preset, PresetName, presetNeedsPositions, presetScale, resolvePreset } from '../policy/factor';
import { selectLayers } from '../policy/layers';
import { chooseN, NOption, positionN } from '../policy/n-mode';
import { LayerScale, resolveScaleSpec, ScaleOptions, ScaleSpec, scalesForLayers } from '../policy/scale';
import { Builder } from './builder';
import { insertScale, InsertedScale, ScaleContext, Target } from './insert-scale';
import { NSources } from './n-source';
import { findScaleInitializer, PatchRecord, readRecord, SiteRecord, writeRecord } from './record';
import { VERSION } from '../version';

export interface PatchOptions extends ScaleOptions {
  /** How n is computed at each site (default auto). */
  n?: NOption;
  /** Already parsed s (from a JSON file or an API caller); overrides s / trainLen / sFile. */
  scale?: ScaleSpec;
  /** On an already patched model, replace s instead of refusing. */
  updateS?: boolean;
  /** ssmax (default), qwen-logn or llama4, with their parameters. */
  preset?: string;
  b?: number;
  floorScale?: number;
  attnScale?: number;
  /** Layers to patch: "3,7,11" or "every:4" (default all). */
  layers?: string;
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
  /** Distinct computations of n in the patched graph. */
  nSources: number;
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
  const preset = resolvePreset(options);
  const spec = options.scale ?? scaleSpecFor(preset, options);
  const out = cloneModel(model);
  const graph = new Graph(out.graph!);
  const detection = findAttentionSoftmax(out, graph);
  if (detection.sites.length === 0) throw new InputError(noAttentionMessage(detection));
  const already = detection.sites.filter((s) => s.patchedBy);
  if (already.length > 0) {
    if (!options.updateS) {
      throw new InputError(`model is already patched (${already.length} SSMax sites); pass --update-s to change s instead of adding a second factor`);
    }
    return { model: out, report: updateScales(out, graph, already, spec, detection.skipped) };
  }
  const chosen = selectLayers(options.layers, detection.sites.length);
  const selected = detection.sites.filter((s) => chosen.has(s.layer));
  if (selected.length === 0) throw new InputError(`--layers ${options.layers} selects none of the ${detection.sites.length} attention layers`);
  const skipped = [...detection.skipped, ...detection.sites.filter((s) => !chosen.has(s.layer))
    .map((s) => ({ node: label(s.softmax), reason: `layer ${s.layer} not in --layers ${options.layers}` }))];
  const scales = scalesForLayers(spec, selected.map((s) => s.heads.heads));
  const opset = defaultOpset(out);
  const irVersion = toNumber(out.irVersion);
  const ranks = inferRanks(graph);
  const shared = new Builder(graph, `${PATCH_PREFIX}shared/`, irVersion);
  const ctx: ScaleContext = {
    graph, preset, opset, ranks, types: inferElemTypes(graph), sources: new NSources(shared, new SymbolicShapes(graph), opset),
  };
  const records: SiteRecord[] = [];
  const sites: PatchedSite[] = [];
  const layerBuilders: Builder[] = [];
  selected.forEach((site, i) => {
    const uses = maskUses(graph, site.afterLogits, ranks);
    const n = presetNeedsPositions(preset) ? positionN(options.n ?? 'auto') : chooseN(options.n ?? 'auto', uses, site.mask.reason);
    const b = new Builder(graph, `${PATCH_PREFIX}L${site.layer}/`, irVersion);
    const inserted = insertScale(ctx, b, site, scales[i], n, uses);
    layerBuilders.push(b);
    sites.push(describe(site, n.mode, n.reason, scales[i], inserted));
    records.push({ layer: site.layer, softmax: label(site.softmax), n: n.mode, s: scales[i], sInitializer: inserted.sName,
      apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType, target: inserted.target,
      logits: site.qkMatMul.output[0] });
  });
  graph.proto.node.push(...shared.added, ...layerBuilders.flatMap((b) => b.added));
  topoSort(out.graph!);
  writeRecord(out, { tool: 'ssmax-patch', version: VERSION, preset: preset.kind, scale: describeSpec(spec),
    trainLen: options.trainLen, ...presetParams(preset), sites: records });
  return { model: out, report: { sites, skipped, updated: false, opset, irVersion, preset: preset.kind, nSources: ctx.sources.size } };
}

/** s per preset: llama4's s is its attn_scale; the others take --s, --train-len or --s-file. */
function scaleSpecFor(preset: Preset, options: PatchOptions): ScaleSpec {
  const fixed = presetScale(preset);
  if (preset.kind === 'llama4') {
    if (options.s !== undefined || options.sFile !== undefined) throw new InputError('--preset llama4 takes --attn-scale, not --s or --s-file');
    return { kind: 'scalar', s: fixed!, from: '--attn-scale' };
  }
  return resolveScaleSpec(options);
}

function presetParams(p: Preset): Partial<PatchRecord> {
  if (p.kind === 'llama4') return { floorScale: p.floorScale, attnScale: p.attnScale };
  if (p.kind === 'ssmax' && p.b !== undefined) return { b: p.b };
  return {};
}

function describe(site: AttentionSite, n: string, nReason: string, s: LayerScale, inserted: Pick<InsertedScale, 'sName' | 'target' | 'nKey'>): PatchedSite {
  return {
    node: label(site.softmax), layer: site.layer, n, nReason, heads: site.heads.heads ?? null,
    headAxis: site.heads.axis ?? null, headsReason: site.heads.reason, logitsRank: site.logitsRank ?? null,
    logits: site.logits, s, sInitializer: inserted.sName, target: inserted.target, nShared: inserted.nKey,
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
function updateScales(model: ModelProto, graph: Graph, patched: AttentionSite[], spec: ScaleSpec, skipped: SkippedSoftmax[]): PatchReport {
  const record = readRecord(model);
  const scales = scalesForLayers(spec, patched.map((s) => s.heads.heads));
  const sites: PatchedSite[] = [];
  patched.forEach((site, i) => {
    const name = findScaleInitializer(graph, site.patchedBy!);
    if (!name) throw new InputError(`layer ${site.layer}: patched, but its s initializer was not found`);
    const old = graph.initializers.get(name)!;
    const s = scales[i];
    const dims = Array.isArray(s) ? [s.length, 1, 1] : [];
    if (old.dims.map(toNumber).join() !== dims.join()) {
      throw new InputError(`layer ${site.layer}: cannot change s from shape [${old.dims.join(',')}] to [${dims.join(',')}] in place; patch the original model instead`);
    }
    const index = graph.proto.initializer.indexOf(old);
    graph.proto.initializer[index] = makeTensor(name, DataType.FLOAT, dims, Array.isArray(s) ? s : [s]);
    const rec = record?.sites.find((r) => r.sInitializer === name);
    if (rec) rec.s = s;
    sites.push(describe(site, rec?.n ?? 'unchanged', 'kept from the earlier patch', s,
      { sName: name, target: rec?.target ?? 'logits', nKey: 'unchanged' }));
  });
  if (record) writeRecord(model, record);
  return { sites, skipped, updated: true, opset: defaultOpset(model), irVersion: toNumber(model.irVersion),
    preset: record?.preset ?? 'ssmax', nSources: 0 };
}
