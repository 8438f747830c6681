/**
 * The patch itself: resolve the options into a plan, detect sites in every graph of the model, then either
 * update s of an existing patch or insert the factors site by site, sort, and record the journal.
 */
import { siteNodeLabel } from '../detect/site';
import { defaultOpset, Detection, rebindDetection, SkippedSoftmax } from '../detect/find-attention';
import type { Rule } from '../detect/rules';
import { InputError, opt } from '../errors';
import { nodeLabel } from '../graph/graph';
import { modelScopes, Scope } from '../graph/scopes';
import { Analysis, analyseModel, graphNotes, sameNames } from '../analysis/analyse';
import { ModelProto, toNumber } from '../io/onnx';
import { cloneModel } from '../io/model-file';
import { Preset } from '../policy/factor';
import { selectLayers } from '../policy/layers';
import { PatchPlan, PlanOptions, resolvePlan } from '../policy/plan';
import { ropeText } from '../policy/rope';
import { findFactors } from './existing';
import { isPatchNode } from '../identity';
import { checkInsertedTypes } from './type-check';
import { PatchRecord, readRecord, writeRecord } from './record';
import { PatchResult } from './report';
import type { RopeSiteRecord } from './rope';
import type { CacheSplit } from './ms-attention';
import { AnySite, CacheLayout, FusedAttention, orderedSites, scalesForSites, SitePatcher, siteNode, thetasForSites } from './sites';
import { describeSpec, specOf, StaleRecord, updateByNames, updateFromRecord, updateRenamed } from './update';
import { VERSION } from '../version';
import { lengthReport, ModelLengths, modelLengths } from '../analysis/reach';
import { positionLimit } from '../analysis/limits';
import { describeInputs } from '../analysis/signature';

export { cloneModel } from '../io/model-file';
export type { PatchedSite, PatchReport, PatchResult } from './report';

export interface PatchOptions extends PlanOptions {
  /**
   * The analysis of this model (analyseModel, with the same `force` and `rules`): patchModel then neither checks the
   * graph nor detects attention again. An analysis of another model object is an error.
   */
  analysis?: Analysis;
  /**
   * Detection already run on this model (detectAttention, with the same `force` and `rules`): patchModel then does
   * not run it again. A detection of another model is an error.
   */
  detection?: Detection;
  /** The detection rules, in the order they are tried (default: RULES; add one with `[...RULES, myRule]`). */
  rules?: readonly Rule[];
  /**
   * Write a patch that can change no output at any length the model can run (its attention lengths are fixed, or
   * capped by a position table, where the factor is 1): refused otherwise. Its s stays trainable.
   */
  allowNoOp?: boolean;
  /**
   * Plain-op attention that onnxruntime fuses at session start (BERT and GPT-2 blocks below opset 17): 'auto'
   * (default) writes it as com.microsoft MultiHeadAttention with the scaled query, so it runs fused after the patch
   * too; 'off' keeps plain ops (a model for another runtime).
   */
  fusedAttention?: FusedAttention;
  /**
   * 'split': where com.microsoft Attention keeps K and V stacked in one cache input and output of the model
   * ([2, B, N, T, H]), replace them by their halves ([B, N, T, H] each: `<past>.key`, `<past>.value`, `<present>.key`,
   * `<present>.value`) so the site runs fused (MultiHeadAttention) when decoding too. It changes the model's
   * interface (docs/factor.md); default 'stacked' keeps it.
   */
  cacheLayout?: CacheLayout;
}

/**
 * Patches a copy of `model`; the argument is left unchanged. The result carries the analysis of `model` (the one
 * given, or the one made here): it stays valid, since `model` is not changed, so verifyPatch can take it.
 */
export function patchModel(model: ModelProto, options: PatchOptions): PatchResult {
  const record = readRecord(model);
  const plan = resolvePlan(options.updateS && record ? updateOptions(options, record) : options);
  const analysis = options.analysis ? givenAnalysis(options.analysis, model, plan.force) : analysisFor(model, plan.force, options);
  // The factors go into a copy: its scopes are built, and the input's detection is bound to its nodes.
  const out = cloneModel(model);
  const scopes = modelScopes(out);
  const detection = rebindDetection(analysis.detection, model, out);
  return { ...patchClone(out, scopes, detection, plan, record, options, analysis.notes), analysis };
}

/** The analysis of the input: analyseModel's, or one around a detection the caller ran (its `detection` option). */
function analysisFor(model: ModelProto, force: readonly string[], options: PatchOptions): Analysis {
  if (!options.detection) return analyseModel(model, { force, rules: options.rules });
  return { model, notes: graphNotes(model), scopes: modelScopes(model), detection: options.detection, force, rules: options.rules };
}

function patchClone(out: ModelProto, scopes: Scope[], detection: Detection, plan: PatchPlan, record: PatchRecord | null,
  options: PatchOptions, notes: readonly string[]): Omit<PatchResult, 'analysis'> {
  checkForced(plan.force, detection);
  const all = orderedSites(detection, scopes);
  // A patch that expanded every site leaves no operator to detect: its record still says it is patched.
  if (all.length === 0 && !record) throw new InputError(noAttentionMessage(detection), detection.skipped.some((k) => k.attention) ? 'attention-refused' : 'no-attention');
  const existing = existingPatch(scopes, all, record);
  if (existing) {
    if (!plan.update) throw new InputError(`model is already patched (${existing.count} SSMax sites${existing.how}); ${opt('updateS')} changes s instead of adding a second factor`, 'already-patched');
    return { model: out, report: { ...update(out, scopes, detection, all, plan, existing.record), notes: [...notes] } };
  }
  if (plan.update) throw new InputError(`${opt('updateS')}: the model has no SSMax patch to update`, 'not-patched');
  // Read before the factors go in: the shapes of the model as it was.
  const lengths = modelLengths(scopes, detection);
  const report = insertFactors(out, scopes, detection, all, plan, choice('fusedAttention', options.fusedAttention, ['auto', 'off'] as const),
    choice('cacheLayout', options.cacheLayout, ['stacked', 'split'] as const));
  checkInsertedTypes(out);
  const reach = lengthReport(ropeCap(lengths, scopes, report.rope?.sites ?? []), report.sites, plan.preset, plan.trainLen);
  if (reach?.effect === 'none' && !options.allowNoOp) throw new InputError(reach.message, 'cannot-patch');
  return { model: out, report: { ...report, notes: [...notes, ...report.notes], ...(reach ? { lengths: reach } : {}) } };
}

/** An analysis handed in must be of this model object, made with the same forced names. */
function givenAnalysis(analysis: Analysis, model: ModelProto, force: readonly string[]): Analysis {
  if (analysis.model !== model) throw new InputError('the analysis given to patchModel is of another model: run analyseModel on this model', 'usage');
  if (!sameNames(force, analysis.force)) throw new InputError(`the analysis given to patchModel forces ${analysis.force.join(', ') || 'nothing'}, the options ${force.join(', ') || 'nothing'}: analyse with the same force`, 'usage');
  return analysis;
}

/**
 * An earlier patch, from its record, or from the graph itself when another tool stripped the record: by the node
 * names this tool gives (identity.ts), or, renamed too, by the structure of its factors.
 */
function existingPatch(scopes: Scope[], all: AnySite[], record: PatchRecord | null): { count: number; how: string; record?: PatchRecord } | null {
  if (record) return { count: record.sites.length, how: '', record };
  const named = all.filter(patchedBy).length;
  if (named) return { count: named, how: '' };
  const renamed = findFactors(scopes[0].graph).filter((f) => !isPatchNode(f.apply)).length;
  return renamed ? { count: renamed, how: ', renamed by another tool' } : null;
}

/**
 * An update keeps the preset the model was patched with unless another one is named, and the slope's L (in its
 * graph) with it: s must then be given, or the update would silently reset s to 1/ln L.
 */
function updateOptions(options: PatchOptions, record: PatchRecord): PatchOptions {
  const preset = options.preset ?? record.preset;
  if (preset !== 'slope' || record.preset !== 'slope' || options.trainLen !== undefined) return { ...options, preset };
  if (options.s === undefined && options.prior === undefined) {
    throw new InputError(`${opt('updateS')} on a slope patch (L = ${record.trainLen}, kept): give the new ${opt('sOrFile')}`, 'usage');
  }
  return { ...options, preset, trainLen: record.trainLen };
}

function update(model: ModelProto, scopes: Scope[], detection: Detection, all: AnySite[], plan: PatchPlan, record?: PatchRecord): PatchResult['report'] {
  if (record) {
    try {
      return updateFromRecord(model, scopes, detection, record, plan);
    } catch (e) {
      // Renamed after patching: the record's names are stale, the structure is not.
      if (!(e instanceof StaleRecord)) throw e;
    }
  }
  const named = all.filter(patchedBy);
  if (named.length) return updateByNames(model, scopes, detection, named, plan);
  const renamed = findFactors(scopes[0].graph).filter((f) => !isPatchNode(f.apply));
  return updateRenamed(model, scopes[0].graph, renamed, specOf(plan), detection.skipped);
}

/** A string option's value among `allowed` (the first is the default when it is absent); anything else is refused. */
function choice<T extends string>(option: 'fusedAttention' | 'cacheLayout', value: unknown, allowed: readonly [T, T]): T {
  if (value === undefined) return allowed[0];
  if ((allowed as readonly unknown[]).includes(value)) return value as T;
  throw new InputError(`${opt(option, String(value))}: expected ${allowed.join(' or ')}`, 'usage');
}

/**
 * The cap on the patched model's lengths where RoPE's caches were recomputed: the operators read the new caches,
 * so their rows are the cap, or another table of the patched graph where it is shorter.
 */
function ropeCap(lengths: ModelLengths, scopes: Scope[], rope: readonly RopeSiteRecord[]): ModelLengths {
  const tables = rope.flatMap((r) => r.table ?? []);
  if (!tables.length) return lengths;
  const rows = Math.min(...tables.map((t) => t.newRows));
  const other = positionLimit(scopes[0].graph, describeInputs(scopes[0].graph));
  const cap = other && other.length < rows ? other : { length: rows, reason: `the rotary caches --rope recomputed have ${rows} rows` };
  return { ...lengths, cap };
}

/** How the patch's note names one rescaled RoPE: its constant of frequencies, or the caches it recomputed. */
function ropeSiteText(r: RopeSiteRecord): string {
  if (!r.table) return `the constant of frequencies '${r.constant}'`;
  const grown = r.table.newRows > r.table.rows ? `, for ${r.table.newRows} positions where they had ${r.table.rows} rows (the operators' cap on the length rises with them)` : ` (${r.table.rows} rows)`;
  return `the rotary caches '${r.table.cos}', '${r.table.sin}', recomputed from the frequencies fitted to them${grown}`;
}

function insertFactors(out: ModelProto, scopes: Scope[], detection: Detection, all: AnySite[], plan: PatchPlan, fusion: FusedAttention,
  layout: CacheLayout): PatchResult['report'] {
  const { sites, skipped } = selectSites(all, detection.skipped, plan);
  const scales = plan.spec && scalesForSites(plan.spec, sites, skipped);
  const thetas = plan.prior && thetasForSites(plan.prior, sites, skipped);
  const irVersion = toNumber(out.irVersion);
  const patcher = new SitePatcher(out, scopes, plan.preset, plan.n, irVersion, fusion, plan.window, layout);
  const results = sites.map((a, i) => patcher.patch(a, { s: scales?.[i], theta: thetas?.[i] }));
  const splitNotes = layout === 'split' ? splitReport(patcher.splits, patcher.unsplit) : [];
  const rope = plan.rope && { ...plan.rope, sites: patcher.rope(plan.rope) };
  const { journal, nSources, notes } = patcher.finish();
  writeRecord(out, { tool: 'ssmax-patch', version: VERSION, preset: plan.preset.kind, scale: plan.spec ? describeSpec(plan.spec) : 'none',
    ...(plan.prior ? { prior: { kind: plan.prior.kind, from: plan.prior.from } } : {}), ...(plan.window ? { window: plan.window } : {}),
    ...(rope ? { rope } : {}), ...(patcher.splits.length ? { cacheLayout: patcher.splits } : {}),
    trainLen: plan.trainLen, ...presetParams(plan.preset), sites: results.map((r) => r.record), journal });
  const fused = results.filter((r) => r.site.fused).length;
  const fusedNote = fused ? [`${fused} site(s) written as com.microsoft MultiHeadAttention, so they stay fused on onnxruntime: the patched model now needs onnxruntime (--fused-attention off, or the option fusedAttention 'off', keeps plain ONNX ops for other runtimes)`] : [];
  const ropeNote = rope ? [`RoPE rescaled: ${ropeText(rope)} at ${rope.sites.map(ropeSiteText).join(', ')}; the angles change at every position, inside L too`] : [];
  return {
    sites: results.map((r) => r.site), skipped, updated: false, opset: defaultOpset(out), irVersion, preset: plan.preset.kind, nSources,
    notes: [...notes, ...fusedNote, ...ropeNote, ...splitNotes], ...(rope ? { rope } : {}),
  };
}

/**
 * What `--cache-layout split` did: the inputs and outputs it replaced, and each site whose cache stays stacked
 * with the reason; refused where it split nothing (the flag would otherwise be silently ignored).
 */
function splitReport(splits: readonly CacheSplit[], unsplit: readonly string[]): string[] {
  if (!splits.length) {
    const why = unsplit.length ? unsplit.join('; ') : 'no com.microsoft Attention with a stacked cache (past and present) was patched';
    throw new InputError(`${opt('cacheLayout', 'split')} splits the stacked KV cache of com.microsoft Attention, and this model has none to split: ${why}`, 'cannot-patch');
  }
  const pairs = splits.map((c) => `'${c.past}' → '${c.pastKey}', '${c.pastValue}'; '${c.present}' → '${c.presentKey}', '${c.presentValue}'`);
  return [`the model's interface changed (cache layout split): each stacked cache [2, B, N, T, H] is two inputs and two outputs [B, N, T, H]: ${pairs.join('; ')}`,
    ...unsplit];
}

/** The sites in the chosen layers; the others are reported as skipped. */
function selectSites(all: AnySite[], skipped: SkippedSoftmax[], plan: PatchPlan): { sites: AnySite[]; skipped: SkippedSoftmax[] } {
  const spec = plan.layers;
  if (spec.kind === 'all') return { sites: all, skipped };
  const count = Math.max(...all.map((a) => a.site.layer)) + 1;
  const chosen = selectLayers(spec, count);
  const sites = all.filter((a) => chosen.has(a.site.layer));
  if (sites.length === 0) throw new InputError(`${opt('layers', spec.text)} selects none of the ${count} attention layers`, 'usage');
  refuseSplitFunctions(all, chosen, spec.text);
  const left = all.filter((a) => !chosen.has(a.site.layer)).map((a) => ({
    node: siteNode(a), reason: `layer ${a.site.layer} not among the layers asked for (${spec.text})`, scope: a.site.scope,
  }));
  return { sites, skipped: [...skipped, ...left] };
}

/**
 * A function's body is patched once for all its calls (each passes its own s): layers that call the same
 * function are all patched or none, or the calls left out would run the factor without an s.
 */
function refuseSplitFunctions(all: AnySite[], chosen: Set<number>, text: string): void {
  for (const a of all) {
    if (a.kind !== 'call' || !chosen.has(a.site.layer)) continue;
    const left = all.filter((b) => b.kind === 'call' && b.site.fn === a.site.fn && !chosen.has(b.site.layer)).map((b) => b.site.layer);
    if (left.length) {
      throw new InputError(`${opt('layers', text)} selects layer ${a.site.layer} but not layer(s) ${left.join(', ')}, which call the same function '${a.site.fn.name}'; its body is patched once for every call: select all of them or none`, 'usage');
    }
  }
}

function presetParams(p: Preset): Partial<PatchRecord> {
  if (p.kind === 'llama4') return { floorScale: p.floorScale, attnScale: p.attnScale };
  if (p.kind === 'ssmax' && p.b !== undefined) return { b: p.b };
  return {};
}

function noAttentionMessage(d: Detection): string {
  if (d.skipped.length === 0) return 'no Softmax in the model: nothing to patch';
  const reasons = [...new Set(d.skipped.map((s) => s.reason))].join('; ');
  const forcible = d.skipped.filter((s) => s.forcible).map((s) => s.node);
  const hint = forcible.length ? ` (${opt('force', forcible[0])} patches a refused site anyway)` : '';
  // Refused attention is attention (exit 2, attention-refused): the message must not say there is none.
  if (d.skipped.some((k) => k.attention)) return `attention found, none of it patched (${d.skipped.length} node(s) refused or skipped: ${reasons})${hint}`;
  return `no attention Softmax found (${d.skipped.length} Softmax skipped: ${reasons})${hint}`;
}

/** Every forced name must name a refused or patched site, so a typo is not silently ignored. */
function checkForced(force: string[], d: Detection): void {
  const known = new Set([
    ...d.sites.map((s) => nodeLabel(s.softmax)), ...d.fused.map((s) => nodeLabel(s.node)),
    ...d.calls.map((c) => siteNodeLabel(c.inner)),
  ]);
  for (const name of force) {
    if (known.has(name)) continue;
    const skipped = d.skipped.find((s) => s.node === name);
    if (skipped) throw new InputError(`${opt('force', name)}: cannot be forced (${skipped.reason})`, 'usage');
    const refusable = d.skipped.filter((s) => s.forcible).map((s) => s.node);
    throw new InputError(`${opt('force', name)}: no such attention node${refusable.length ? ` (refused sites: ${refusable.join(', ')})` : ''}`, 'usage');
  }
}

function patchedBy(a: AnySite): boolean {
  return Boolean(a.kind === 'call' ? a.site.inner.patchedBy : a.site.patchedBy);
}
