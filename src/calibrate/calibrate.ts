/**
 * calibrateSlope: s of the slope preset, c = 1 + s·max(0, ln n − ln L), chosen for a target length N from the
 * model's own attention, with no labels and no training. The model is patched with the slope, and the patched
 * copy runs on onnxruntime with s fed as an input: at s = 0 it is the original. s is searched (search.ts) until
 * the mean of the attention statistic (largest probability, or entropy) over the rows at n ≈ N equals its mean
 * over the rows at n ≈ L, one s for the model, per layer, or per head. The statistic is read at every site by
 * verification's row outputs (plain and fused sites alike), and the runs are verification's: its inputs
 * (synthesised tokens, or the user's token ids cut to each length), its lengths and their cap.
 *
 * Cost: in a causal model row i of one run at N sees i + 1 keys, so that run alone gives every window (L, N and
 * the curve between): one run per candidate s. Sites whose rows all see every key (an encoder) need a run at each
 * length of the curve, before and after.
 */
import { Analysis, analyseModel } from '../analysis/analyse';
import { Detection } from '../detect/find-attention';
import { InputError, opt, render } from '../errors';
import { ModelProto } from '../io/onnx';
import { runtimeReport } from '../onnxruntime';
import { LayerSelection } from '../policy/layers';
import { NOption, withMasksOfOnes } from '../policy/n-mode';
import { SValue } from '../policy/scale';
import { patchModel } from '../rewrite/patch';
import { PatchReport } from '../rewrite/report';
import { CachePool, cachePool, synthesize } from '../verify/inputs';
import { runId, RunSpec, sweepShape } from '../verify/plan';
import { collectGarbage, Runner } from '../verify/run';
import { firstLine, LoadFailure, SessionFactory } from '../verify/sessions';
import { isUniform } from '../verify/sharpness';
import { prepare, Setup } from '../verify/setup';
import { Feeds, HostTensor } from '../verify/tensors';
import { CalibrationModel, calibrationModel, ropeFeeds, scaleFeeds } from './model';
import { DEFAULT_ROPE_SCALE, RopeMethod } from '../policy/rope';
import { originalTheta } from '../rewrite/rope';
import { CalibrationGroup, CalibrationReport, CurvePoint, MatchStatistic } from './report';
import { gapOf, predictSlope, SlopeSearch } from './search';
import { findLogits, LossPoint, LossSearch, lossSpans, nextTokenLoss } from './loss';
import { Granularity, groupOf, RowStats, SiteLayout } from './stats';

export interface CalibrateOptions {
  /** L: the training length; the slope's factor is 1 up to it. */
  trainLen: number;
  /** N: the length to calibrate for (default 8·L, else the longest length of verification's default sweep). */
  targetLen?: number;
  /**
   * The statistic matched: the mean largest attention probability (default) or the mean entropy; or `loss`, the
   * model's own next-token loss past L on the given token ids (`inputs`), minimised (one s for the model).
   */
  match?: MatchStatistic;
  /** One s for the model (default), one per layer, or one per head of each layer. */
  granularity?: Granularity;
  /** Token ids [B, T] with T ≥ N, by input name: the runs use their first L … N tokens (default: synthesised). */
  inputs?: Record<string, HostTensor>;
  /** Sizes of named dims, as for verification. */
  dims?: Record<string, number>;
  /** How n is computed (default auto), and which layers are patched (default all), as for patchModel. */
  n?: NOption;
  layers?: LayerSelection;
  /** Bytes no run may be estimated to pass (default half the memory free): N is cut to the longest length that fits, as verification's runs are. */
  maxMemory?: number;
  /** Runs at N with a candidate s, at most (default 10; the original's run at N comes on top). */
  maxRuns?: number;
  /** The largest s tried (default 16/ln L): beyond it the target is out of reach. */
  maxS?: number;
  /** A short progress line as each run starts. */
  progress?: (line: string) => void;
  /** The original's analysis (analyseModel), when the caller has it: calibration then does not analyse it again. */
  analysis?: Analysis;
  /**
   * RoPE rescaled too (patchModel's `rope`): at `ropeScale` when given; by loss without it, the scale of lowest loss
   * of ROPE_SCALES is searched first (at s = 0), then s at that scale.
   */
  rope?: RopeMethod;
  ropeScale?: number;
}

export interface CalibrationResult {
  /** The original patched with the slope and the s found, as named initializers. */
  model: ModelProto;
  report: CalibrationReport;
  patch: PatchReport;
}

interface Plan {
  L: number;
  N: number;
  granularity: Granularity;
  match: MatchStatistic;
  maxRuns: number;
  maxS: number;
  notes: string[];
  /** RoPE rescaled with the slope: the method, and its scale (null: searched by loss). */
  rope?: { method: RopeMethod; scale: number | null };
}

/** Rows, heads and scales of a session's sites, and how one run is fed. */
interface Context {
  plan: Plan;
  setup: Setup;
  cm: CalibrationModel;
  layouts: Map<number, SiteLayout>;
  runner: Runner;
  factory: SessionFactory;
  given?: { batch: number; ids: Record<string, HostTensor> };
  progress: (line: string) => void;
  runs: number;
  /** Each length is a few query tokens over a synthesised cache (wholePromptsShort), not a whole prompt. */
  overCache: boolean;
  /** The caches runs over a large cache share, filled once at N (verify's CachePool); set with the context. */
  pool?: CachePool;
}

export async function calibrateSlope(original: ModelProto, options: CalibrateOptions): Promise<CalibrationResult> {
  const started = performance.now();
  const progress = options.progress ?? ((): void => undefined);
  const L = checkInteger(options.trainLen, 'trainLen', 2);
  // One analysis of the original: every patch below and verification's setup reuse it.
  const analysis = options.analysis ?? analyseModel(original);
  const { detection } = analysis;
  const granularity = options.granularity ?? 'global';
  const heads = granularity === 'global' ? [] : layerHeads(original, options, analysis);
  const first = 1 / Math.log(L);
  const plan = planOf(options, L, granularity);
  const patch = (s: SValue, ropeScale = plan.rope?.scale ?? DEFAULT_ROPE_SCALE): ReturnType<typeof patchModel> => patchModel(original,
    { preset: 'slope', trainLen: L, s, n: options.n, layers: options.layers, analysis, ...(plan.rope ? { rope: plan.rope.method, ropeScale } : {}) });
  const template = patch(sValue(granularity, heads, () => first));
  // N given: runs up to it; by default within verification's default longest length (one attention matrix's budget).
  // Whole prompts even over a cache: the curve is read off every row of one causal run.
  const setupOf = (wholePrompts: boolean): Setup => prepare(original, template.model, {
    trainLen: L, maxLen: options.targetLen === undefined ? undefined : plan.N, checks: ['sharpness'], dims: options.dims, maxMemory: options.maxMemory, analysis,
  }, { wholePrompts });
  let setup = setupOf(true);
  const overCache = wholePromptsShort(plan, setup, options);
  if (overCache) setup = setupOf(false);
  fitTargetLength(plan, setup, options.targetLen !== undefined);
  if (overCache) plan.notes.push(overCache);
  const given = givenIds(setup, options.inputs ?? {}, plan.N);
  const byLoss = plan.match === 'loss';
  const cm = calibrationModel(template.model, setup.sites, byLoss ? null : plan.match === 'entropy' ? 'entropy' : 'max');
  const layouts = byLoss ? new Map<number, SiteLayout>() : siteLayouts(setup, template.report, detection, cm, granularity);
  const factory = new SessionFactory(original, template.model, setup.sites, false);
  factory.dropOutputs = new Set(setup.droppedOutputs);
  let report: CalibrationReport;
  let s: SValue;
  try {
    progress('calibrate: loading the slope patch with s as an input');
    const runner = await openCalibration(factory, cm.model, byLoss);
    const ctx: Context = { plan, setup, cm, layouts, runner, factory, given, progress, runs: 0, overCache: Boolean(overCache) };
    // Runs grow with their length: the one at N is the largest.
    ctx.pool = cachePool(setup.specs, setup.fixed, [runOf(ctx, plan.N)], new Set());
    try {
      ({ report, s } = byLoss ? await searchLoss(ctx, first) : await search(ctx, heads, first));
    } finally {
      await factory.release(runner);
    }
  } finally {
    factory.cleanup();
  }
  const result = patch(s, report.rope?.scale);
  report.totalMs = Math.round(performance.now() - started);
  report.runtime = runtimeReport();
  return { model: result.model, report, patch: result.report };
}

function checkInteger(v: number | undefined, name: 'trainLen' | 'targetLen' | 'maxRuns', min: number): number {
  if (v === undefined || !Number.isInteger(v) || v < min) throw new InputError(`${opt(name)} must be an integer ≥ ${min}, got ${v}`, 'usage');
  return v;
}

function planOf(o: CalibrateOptions, L: number, granularity: Granularity): Plan {
  if (!['global', 'per-layer', 'per-head'].includes(granularity)) throw new InputError(`${opt('granularity')} must be global, per-layer or per-head, got '${granularity}'`, 'usage');
  const match = o.match ?? 'max-prob';
  if (match !== 'max-prob' && match !== 'entropy' && match !== 'loss') throw new InputError(`${opt('match')} must be max-prob, entropy or loss, got '${match}'`, 'usage');
  if (match === 'loss' && Object.keys(o.inputs ?? {}).length === 0) {
    throw new InputError(`${opt('match', 'loss')} minimises the model's own next-token loss on your tokens: give token ids [batch, T ≥ N] with ${opt('inputs')}`, 'usage');
  }
  // One loss, one s: a per-layer or per-head search would need a run per group and step.
  if (match === 'loss' && granularity !== 'global') throw new InputError(`${opt('match', 'loss')} calibrates one s for the model (the loss is one number); drop ${opt('granularity')}`, 'usage');
  const N = o.targetLen === undefined ? 8 * L : checkInteger(o.targetLen, 'targetLen', L + 1);
  const maxS = o.maxS ?? 16 / Math.log(L);
  if (!(maxS > 0) || !Number.isFinite(maxS)) throw new InputError(`${opt('maxS')} must be a positive number, got ${maxS}`, 'usage');
  if (o.ropeScale !== undefined && o.rope === undefined) throw new InputError(`${opt('ropeScale')} sets how far ${opt('rope')} rescales RoPE: give ${opt('rope')} too`, 'usage');
  const rope = o.rope === undefined ? undefined : { method: o.rope, scale: o.ropeScale ?? (match === 'loss' ? null : DEFAULT_ROPE_SCALE) };
  return { L, N, granularity, match, maxRuns: checkInteger(o.maxRuns ?? (match === 'loss' ? 12 : 10), 'maxRuns', 1), maxS, notes: [], ...(rope ? { rope } : {}) };
}

/**
 * N within what verification runs: the model's position table and, by default, one attention matrix's budget.
 * Where 8·L does not fit, N is the longest length of verification's own sweep (L·2^k), not the cap itself: a run
 * at the cap (3,344 for 12 heads) costs 2.7× one at 2,048, the longest verification runs there.
 */
function fitTargetLength(plan: Plan, setup: Setup, given: boolean): void {
  if (!setup.seqFree && !setup.pastFree) {
    throw new InputError(`the model's inputs fix its sequence length (${setup.plan.notes[0] ?? 'no dynamic axis'}): calibration needs runs at L = ${plan.L} and N = ${plan.N}`, 'cannot-verify');
  }
  if (plan.N <= setup.plan.cap) return;
  const longest = Math.max(...setup.plan.sweep.filter((x) => x <= setup.plan.cap));
  if (given || !(longest > plan.L)) throw new InputError(`N = ${plan.N} cannot run: ${setup.plan.capReason} (the longest length is ${setup.plan.cap})`, 'cannot-verify');
  // Calibration's notes are printed as they are: the flags in the reason are the command line's.
  plan.notes.push(render(`N = ${longest}, not 8·L = ${plan.N}, the longest length verification runs: ${setup.plan.capReason} (the longest length is ${setup.plan.cap})`, 'cli'));
  plan.N = longest;
}

/**
 * Why whole prompts give way to runs over a cache, or undefined where they do not: a model that takes a cache,
 * max-prob or entropy on synthesised tokens, and N beyond what a whole prompt may run (one attention matrix's budget,
 * or the memory budget). A run of a few query tokens over a cache of N − 4 keys reads rows at n ≈ N with memory
 * growing with the cache, as verification's sweep does; every length is then its own run. Given tokens or the loss
 * need every row of one prompt, so they keep whole prompts.
 */
function wholePromptsShort(plan: Plan, setup: Setup, o: CalibrateOptions): string | undefined {
  if (plan.N <= setup.plan.cap || plan.match === 'loss' || Object.keys(o.inputs ?? {}).length || !setup.pastFree) return undefined;
  const query = sweepShape({ ...setup, wholePrompts: false }, plan.N).seq;
  return `N = ${plan.N} is beyond a whole prompt (${render(setup.plan.capReason, 'cli')}): the model takes a KV cache, so each length is ${query} query token(s) after a synthesised cache of the rest (random keys and values, as verification's runs over a cache), one run per length`;
}

/** Token ids given by value: each a [B, T] ids input with T ≥ N, all of one batch; the runs cut them to length. */
function givenIds(setup: Setup, inputs: Record<string, HostTensor>, N: number): Context['given'] {
  const names = Object.keys(inputs);
  if (names.length === 0) return undefined;
  if (!setup.seqFree) throw new InputError(`${opt('inputs')}: the model's sequence length cannot vary, so given tokens cannot be cut to L and N`, 'usage');
  let batch: number | undefined;
  for (const name of names) {
    const spec = setup.specs.find((x) => x.name === name);
    const t = inputs[name];
    if (!spec) throw new InputError(`${opt('inputs', name)}: the model has no input '${name}' (inputs: ${setup.specs.map((x) => x.name).join(', ')})`, 'usage');
    if (spec.role !== 'ids') throw new InputError(`${opt('inputs', name)}: calibration takes token ids only (this input holds ${spec.role}); the others are synthesised for each length`, 'usage');
    if (t.dims.length !== 2 || t.dims[1] < N) throw new InputError(`${opt('inputs', name)}: token ids [batch, T] with T ≥ N = ${N} are needed, got [${t.dims.join(', ')}]`, 'usage');
    if (t.type !== 'int64' && t.type !== 'int32') throw new InputError(`${opt('inputs', name)}: token ids are integers, got ${t.type}`, 'usage');
    if (batch !== undefined && t.dims[0] !== batch) throw new InputError(`${opt('inputs')}: the given token ids differ in batch size`, 'usage');
    batch = t.dims[0];
  }
  return { batch: batch!, ids: inputs };
}

/** Head counts per layer (every graph's layer k alike), from a patch with one s: per-layer and per-head s need them. */
function layerHeads(original: ModelProto, o: CalibrateOptions, analysis: Analysis): LayerHeads {
  const { report } = patchModel(original, { preset: 'slope', trainLen: o.trainLen, n: o.n, layers: o.layers, analysis });
  const heads: LayerHeads = [];
  for (const site of report.sites) {
    if (!site.heads) throw new InputError(`${opt('granularity')}: layer ${site.layer}'s head count is unknown (${site.headsReason}): calibrate one s for the model`, 'cannot-patch');
    if (heads[site.layer] !== undefined && heads[site.layer] !== site.heads) {
      throw new InputError(`${opt('granularity')}: layer ${site.layer} has ${heads[site.layer]} heads in one graph and ${site.heads} in another`, 'cannot-patch');
    }
    heads[site.layer] = site.heads;
  }
  return Array.from(heads);
}

/** Heads per layer index; undefined for a layer not patched (--layers). */
type LayerHeads = (number | undefined)[];

/**
 * s as patchModel takes it: one value, or one row of per-head values per layer (a per-layer s repeated over
 * heads; a layer not patched holds its row's place).
 */
function sValue(granularity: Granularity, heads: LayerHeads, of: (group: string) => number): SValue {
  if (granularity === 'global') return of('all');
  return heads.map((h, layer) => Array.from({ length: h ?? 1 }, (_, head) => of(groupOf(granularity, layer, head))));
}

/** How each seen site's rows see keys (from its n mode; a mask-counted n from detection's mask verdict) and its heads. */
function siteLayouts(setup: Setup, report: PatchReport, detection: Detection, cm: CalibrationModel, granularity: Granularity): Map<number, SiteLayout> {
  const causal = new Map([...detection.sites, ...detection.fused, ...detection.calls.map((c) => ({ ...c.inner, scope: c.scope, layer: c.layer }))]
    .map((s) => [`${s.scope}|${s.layer}`, s.mask.causal]));
  const layouts = new Map<number, SiteLayout>();
  setup.sites.forEach((site, i) => {
    if (!cm.outputs.has(i)) return;
    const mode = withMasksOfOnes(site.record.n);
    const rows = mode === 'causal' || (mode !== 'keys' && causal.get(`${site.record.scope ?? 'main'}|${site.record.layer}`)) ? 'causal' : 'keys';
    const heads = report.sites[i].heads ?? undefined;
    // Fused kernels and expanded operators give [B, N, S] statistics; a plain Softmax has the logits' head axis.
    const headAxis = granularity !== 'per-head' ? undefined : site.fused ? 1 : report.sites[i].headAxis ?? 1;
    layouts.set(i, { layer: site.record.layer, rows, heads, headAxis });
  });
  if (layouts.size === 0) throw new InputError(`no attention site shows its probabilities, so nothing can be calibrated (${cm.unseen[0] ?? 'no sites'})`, 'cannot-verify');
  return layouts;
}

/** The lengths of the curve: L/4, L/2, L, 2L, 4L, … below N, and N. */
function curveLengths(L: number, N: number): number[] {
  const out = new Set<number>();
  for (let x = L / 4; x < N; x *= 2) if (x >= 2) out.add(Math.round(x));
  out.add(N);
  return [...out].sort((a, b) => a - b);
}

async function search(ctx: Context, heads: LayerHeads, first: number): Promise<{ report: CalibrationReport; s: SValue }> {
  const { plan } = ctx;
  // One causal prompt of N holds every row from 1 to N; a run over a cache only the rows near its length.
  const causalOnly = !ctx.overCache && [...ctx.layouts.values()].every((l) => l.rows === 'causal');
  const lengths = curveLengths(plan.L, plan.N);
  const before = await measure(ctx, causalOnly ? [plan.N] : lengths, () => 0, 'the original (s = 0)');
  const searches = new Map<string, SlopeSearch>();
  for (const g of before.groups()) {
    const target = before.mean(g, plan.L), original = before.mean(g, plan.N);
    if (!Number.isFinite(target) || !Number.isFinite(original)) throw new InputError(`${g}: no rows at n ≈ ${plan.L} or n ≈ ${plan.N} were read`, 'cannot-verify');
    const gap = (v: number): number => gapOf(plan.match, v, plan.N);
    const x = new SlopeSearch(target, original, gap, predictSlope(gap(target), gap(original), plan.L, plan.N, first, plan.maxS), plan.maxS);
    // Attention about uniform at L (random weights): no factor sharpens it, so no run would reach the target.
    if (plan.match === 'max-prob' && isUniform(target, plan.L)) x.giveUp();
    searches.set(g, x);
  }
  let last: { stats: RowStats; s: Map<string, number> } | undefined;
  for (let k = 0; k < plan.maxRuns && [...searches.values()].some((x) => x.state === 'searching'); k++) {
    const s = new Map([...searches].map(([g, x]) => [g, x.next()]));
    const stats = await measure(ctx, [plan.N], (g) => s.get(g) ?? first, `s = ${describe(s)}`);
    for (const [g, x] of searches) x.observe(s.get(g)!, stats.mean(g, plan.N));
    last = { stats, s };
  }
  const found = new Map([...searches].map(([g, x]) => [g, x.result(first)]));
  // The curve after: the last run at N when it had the s found (for every group), and runs at the other lengths.
  const longer = causalOnly ? [plan.N] : lengths.filter((x) => x > plan.L);
  const reuse = last && [...found].every(([g, v]) => last!.s.get(g) === v) ? last.stats : undefined;
  // Nothing reached: no model is written, so there is no after to measure.
  const none = [...searches.values()].every((x) => x.state === 'out of reach' || x.state === 'no fade');
  const after = none ? before
    : await measure(ctx, reuse ? longer.filter((x) => x !== plan.N) : longer, (g) => found.get(g) ?? first, `the s found (${describe(found)})`, reuse);
  const curve: CurvePoint[] = lengths.map((x) => ({ length: x, before: before.pooled(x), after: x <= plan.L ? before.pooled(x) : after.pooled(x) }));
  const groups: CalibrationGroup[] = [...searches].map(([g, x]) => groupReport(g, x, found.get(g)!, before, after, plan));
  const unset = heads.length ? missingGroups(plan.granularity, heads, searches) : [];
  if (unset.length) plan.notes.push(`${unset.join(', ')}: no row of theirs was read, so their s stays 1/ln L = ${first.toPrecision(4)}`);
  const value = (g: string): number => found.get(g) ?? first;
  const s = sValue(plan.granularity, heads, value);
  return { s, report: reportOf(ctx, s, groups, curve, causalOnly) };
}

/**
 * The s of lowest next-token loss past L (loss.ts): one whole prompt of the given tokens, N long, per candidate s;
 * the original (s = 0) first. The curve is the loss per span of keys seen, before and with the s found.
 */
async function searchLoss(ctx: Context, first: number): Promise<{ report: CalibrationReport; s: SValue }> {
  const { plan } = ctx;
  const run = runOf(ctx, plan.N);
  if (run.past > 0 || !ctx.given) throw new InputError(`${opt('match', 'loss')} scores whole prompts of the given tokens, and this model's runs need ${run.past} cached tokens`, 'cannot-verify');
  const names = Object.keys(ctx.given.ids);
  if (names.length !== 1) throw new InputError(`${opt('match', 'loss')} scores the next token of one ids input; ${names.length} were given (${names.join(', ')})`, 'usage');
  const ids = ctx.given.ids[names[0]];
  const spans = lossSpans(plan.L, run.seq);
  let logits: string | undefined;
  const measured: LossPoint[] = [];
  let rope: number | null = null;
  const at = async (s: number, what: string, scale = rope): Promise<LossPoint> => {
    ctx.progress(`calibrate: run ${++ctx.runs} (${run.id}), ${what}`);
    const feeds = { ...inputsOf(ctx, run), ...scaleFeeds(ctx.cm, () => s), ...ropeFeedsAt(ctx, scale) };
    let out;
    try {
      out = await ctx.runner.run(feeds, logits ? [logits] : ctx.setup.modelOutputs);
    } catch (e) {
      throw await runFailure(ctx, run, e);
    }
    logits ??= findLogits(out, run.batch, run.seq);
    const p = { s, ...nextTokenLoss(out[logits], ids, plan.L, spans) };
    measured.push(p);
    return p;
  };
  const original = await at(0, 'the original (s = 0)', null);
  const scales = plan.rope ? await ropeScan(plan, at) : undefined;
  rope = scales ? scales.best.scale : null;
  const x = new LossSearch(first, plan.maxS, LOSS_WIDTH * first);
  x.observe(scales ? scales.best.point : original);
  // The s tried: the original, then the search's points (from s = 0 at the scale chosen, where RoPE is rescaled).
  const tried: LossPoint[] = [original, ...(scales ? [scales.best.point] : [])];
  for (let k = 0, s = x.next(); k < plan.maxRuns && s !== undefined; k++, s = x.next()) {
    const p = await at(s, `s = ${s.toPrecision(4)}`);
    x.observe(p);
    tried.push(p);
  }
  const best = x.best().loss < original.loss ? x.best() : original;
  const state = best === original ? 'no gain' : x.state() === 'no gain' ? 'found' : x.state();
  if (state === 'no gain') plan.notes.push(`the loss past L is lowest at s = 0 (the original) of the ${measured.length} runs: the slope${plan.rope ? ' and the RoPE rescaling do' : ' does'} not lower this model's loss on these tokens`);
  if (state === 'out of reach') plan.notes.push(`the loss still falls at the largest s allowed, ${plan.maxS.toPrecision(3)}: that s is written`);
  if (state === 'searching') plan.notes.push(`not narrowed in ${plan.maxRuns} runs: the best s measured is kept`);
  const group: CalibrationGroup = {
    group: 'all', s: best.s, state, residual: best.loss / original.loss - 1, target: best.loss, beforeAtN: original.loss, afterAtN: best.loss,
    tried: tried.map((p) => ({ s: p.s, value: p.loss })),
  };
  const curve = spans.map(([, hi], k) => ({ length: hi, before: original.spans[k], after: best.spans[k] }));
  const report = reportOf(ctx, best.s, [group], curve, true);
  const ropeReport = scales && plan.rope ? { rope: { method: plan.rope.method, scale: rope!, tried: scales.tried } } : {};
  return {
    s: best.s,
    report: { ...report, ...ropeReport, reached: best !== original, rows: `one whole prompt of ${run.seq} given tokens per s: row t predicts token t + 1`, windows: `rows seeing L < t + 1 ≤ ${run.seq - 1} keys, reported in spans ${spans.map(([lo, hi]) => `${lo - 1}–${hi}`).join(', ')}` },
  };
}

/**
 * The feeds of RoPE's multipliers at `scale` (null: the original's RoPE), from the original's frequency constants;
 * none without --rope.
 */
function ropeFeedsAt(ctx: Context, scale: number | null): Feeds {
  const rope = ctx.plan.rope;
  if (!rope) return {};
  return ropeFeeds(ctx.cm, { method: rope.method, trainLen: ctx.plan.L }, (site) => originalTheta(site, ctx.setup.graph), scale);
}

/** The RoPE scales tried by loss (where the scale is not given): powers of 2 up to 4·N/L. */
const ROPE_SCALES = [2, 4, 8, 16, 32, 64, 128];

/** The RoPE scale of lowest loss at s = 0, each scale one run (or the one given). */
interface RopeScan { best: { scale: number; point: LossPoint }; tried: { scale: number; loss: number }[] }

async function ropeScan(plan: Plan, at: (s: number, what: string, scale: number) => Promise<LossPoint>): Promise<RopeScan> {
  const given = plan.rope!.scale;
  const candidates = given !== null ? [given] : ROPE_SCALES.filter((f) => f <= (4 * plan.N) / plan.L);
  const tried: { scale: number; loss: number; point: LossPoint }[] = [];
  for (const scale of candidates) {
    const point = await at(0, `RoPE ×${scale}, s = 0`, scale);
    tried.push({ scale, loss: point.loss, point });
  }
  const best = tried.reduce((a, b) => (b.loss < a.loss ? b : a));
  return { best: { scale: best.scale, point: best.point }, tried: tried.map(({ scale, loss }) => ({ scale, loss })) };
}

/** The loss search ends when its bracket is narrower than this share of 1/ln L. */
const LOSS_WIDTH = 0.05;

function missingGroups(granularity: Granularity, heads: LayerHeads, searches: Map<string, SlopeSearch>): string[] {
  return heads.flatMap((h, layer) => (h === undefined ? [] : Array.from({ length: granularity === 'per-head' ? h : 1 }, (_, head) => groupOf(granularity, layer, head))))
    .filter((g) => !searches.has(g));
}

const describe = (s: Map<string, number>): string => {
  const values = [...new Set([...s.values()].map((v) => v.toPrecision(4)))];
  return values.length === 1 ? values[0] : `${values.length} values, ${values.slice(0, 3).join(', ')}${values.length > 3 ? ', …' : ''}`;
};

/**
 * Runs the calibration session at each length with the s `valueOf` gives each group, and bins every site's rows
 * into `stats` (new by default).
 */
async function measure(ctx: Context, lengths: number[], valueOf: (group: string) => number, what: string, stats = new RowStats()): Promise<RowStats> {
  const { plan, cm, layouts } = ctx;
  const sFeeds = scaleFeeds(cm, (i, head) => {
    const layout = layouts.get(i);
    return layout ? valueOf(groupOf(plan.granularity, layout.layer, head)) : valueOf(groupOf(plan.granularity, ctx.setup.sites[i].record.layer, head));
  });
  // A RoPE rescaled with the slope runs at its one scale (the calibration model takes its multipliers as inputs).
  const rope = ropeFeedsAt(ctx, plan.rope?.scale ?? null);
  for (const length of lengths) {
    const run = runOf(ctx, length);
    ctx.progress(`calibrate: run ${++ctx.runs} (${run.id}), ${what}`);
    const feeds: Feeds = { ...inputsOf(ctx, run), ...sFeeds, ...rope };
    let out;
    try {
      out = await ctx.runner.run(feeds, [...cm.outputs.values(), ...cm.keys.values()]);
    } catch (e) {
      throw await runFailure(ctx, run, e);
    }
    for (const [i, layout] of layouts) {
      const t = out[cm.outputs.get(i)!];
      if (!t) continue;
      const axis = layout.headAxis;
      if (axis !== undefined && layout.heads && !(t.dims.length > axis + 1 && t.dims[axis] % layout.heads === 0)) {
        throw new InputError(`${opt('granularity')}: ${ctx.setup.sites[i].label}'s attention rows [${t.dims.join(', ')}] do not hold its ${layout.heads} heads on axis ${axis}: calibrate per layer or one s`, 'cannot-patch');
      }
      // The keys the site's rows are over: the run's length, except in cross attention (an encoder's frames).
      const keys = out[cm.keys.get(i) ?? '']?.data[0];
      stats.add(t, layout, keys && keys > 0 ? keys : run.past + run.seq, plan.granularity);
    }
    // A synthesised cache outside the pool (a run below its threshold) is garbage now, and V8 does not count it as pressure.
    if (ctx.overCache) await collectGarbage();
  }
  return stats;
}

/**
 * The calibration model, or why not: the original's own load error is the user's (exit 2), the patch's a bug.
 * `sameShape`: the loss search runs the one whole prompt of the given tokens for every s.
 */
async function openCalibration(factory: SessionFactory, model: ModelProto, sameShape: boolean): Promise<Runner> {
  try {
    return await factory.openModel(model, 'calibration', sameShape);
  } catch (e) {
    if (!(e instanceof LoadFailure)) throw e;
    await factory.release(await factory.open('original'));
    throw e;
  }
}

/** A failed run blamed where it belongs: the original run on the same inputs fails too (the inputs), or not (the patch). */
async function runFailure(ctx: Context, run: RunSpec, e: unknown): Promise<Error> {
  const first = firstLine(e);
  let original: string | undefined;
  const runner = await ctx.factory.open('original');
  try {
    await runner.run(inputsOf(ctx, run));
  } catch (o) {
    original = firstLine(o);
  } finally {
    await ctx.factory.release(runner);
  }
  if (original !== undefined) {
    return new InputError(`the original model fails on the calibration inputs (${run.id}): ${original}; set sizes with --dim NAME=N, give token ids with --input or a shorter --max-len`, 'cannot-verify');
  }
  return new Error(`the slope patch fails at ${run.id} where the original runs: ${first}`);
}

/** A run of `length` tokens in context, as verification's sweep makes it: the sequence, or the cache when only it grows. */
function runOf(ctx: Context, length: number): RunSpec {
  const { setup } = ctx;
  if (ctx.overCache) {
    const shape = sweepShape({ ...setup, wholePrompts: false }, length);
    return { id: runId(shape), kind: 'sweep', ...shape, padded: false };
  }
  const batch = ctx.given?.batch ?? setup.pinned.batch ?? 1;
  const minPast = setup.pastFree ? setup.minPast : 0;
  const past = setup.pinned.past ?? minPast;
  if (setup.seqFree) return { id: runId({ batch, seq: length - past, past }), kind: 'sweep', batch, seq: length - past, past, padded: false };
  const seq = setup.pinned.seq ?? setup.fixedSeq ?? 1;
  // Fixed tokens beyond the length asked for (Whisper's 1,500 frames): one run of them alone, whose causal rows
  // still see every n from 1 up.
  const grown = Math.max(length - seq, minPast);
  return { id: runId({ batch, seq, past: grown }), kind: 'sweep', batch, seq, past: grown, padded: false };
}

/** Synthesised inputs for the run, with given token ids cut to its length. */
function inputsOf(ctx: Context, run: RunSpec): Feeds {
  const { setup } = ctx;
  const feeds = synthesize(setup.graph, setup.specs, run, { fixed: setup.fixed, given: {}, padded: false, seed: 1 + run.seq + run.past, pool: ctx.pool });
  for (const [name, t] of Object.entries(ctx.given?.ids ?? {})) {
    const [b, T] = t.dims;
    const data = t.data as BigInt64Array | Int32Array;
    const cut = t.type === 'int64' ? new BigInt64Array(b * run.seq) : new Int32Array(b * run.seq);
    for (let i = 0; i < b; i++) cut.set(data.subarray(i * T, i * T + run.seq) as never, i * run.seq);
    feeds[name] = { type: t.type, dims: [b, run.seq], data: cut } as HostTensor;
  }
  return feeds;
}

function groupReport(g: string, x: SlopeSearch, s: number, before: RowStats, after: RowStats, plan: Plan): CalibrationGroup {
  return {
    group: g, s, state: x.state, residual: x.residual(), target: x.target, beforeAtN: before.mean(g, plan.N), afterAtN: after.mean(g, plan.N),
    tried: x.points.map((p) => ({ s: p.s, value: p.value })),
  };
}

function reportOf(ctx: Context, s: SValue, groups: CalibrationGroup[], curve: CurvePoint[], causalOnly: boolean): CalibrationReport {
  const { plan, setup } = ctx;
  const notes = [...plan.notes];
  // By loss the search wrote its own notes (searchLoss): these speak of a statistic's target.
  for (const g of plan.match === 'loss' ? [] : groups) {
    if (g.state === 'no fade') notes.push(`${g.group}: the original's statistic at n ≈ ${plan.N} is already at its value at n ≈ ${plan.L}: s = 0 (no change)`);
    if (g.state === 'out of reach') {
      const s = `s stays 1/ln L = ${(1 / Math.log(plan.L)).toPrecision(4)}`;
      notes.push(plan.match === 'max-prob' && isUniform(g.target, plan.L)
        ? `${g.group}: its attention at n ≈ ${plan.L} is about uniform (largest probability ≈ 1/n), which no factor sharpens: not searched; ${s}`
        : `${g.group}: no s up to ${plan.maxS.toPrecision(3)} brings the statistic at n ≈ ${plan.N} to its value at n ≈ ${plan.L}; ${s}`);
    }
    if (g.state === 'searching') notes.push(`${g.group}: not converged in ${plan.maxRuns} runs (residual ${(100 * g.residual).toFixed(1)} %); the closest s measured is kept`);
  }
  return {
    reached: groups.some((g) => g.state === 'found' || g.state === 'searching'),
    trainLen: plan.L, targetLen: plan.N, match: plan.match, granularity: plan.granularity, s,
    tokens: ctx.given ? 'given' : 'synthesised', batch: ctx.given?.batch ?? setup.pinned.batch ?? 1,
    rows: causalOnly ? 'one causal run per s: row i sees i + 1 keys' : ctx.overCache ? 'runs at each length: a few query tokens over a synthesised cache of the rest'
      : 'runs at each length (some site\'s rows see every key)',
    windows: `rows with 3X/4 < n ≤ X for n ≈ X (X = ${plan.L} and ${plan.N})`,
    runs: ctx.runs, groups, curve, unseen: ctx.cm.unseen, notes, totalMs: 0, runtime: runtimeReport(),
  };
}
