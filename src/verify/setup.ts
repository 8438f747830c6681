/**
 * Everything verification decides before a model runs: that the two models are a pair (the patched one minus
 * what its journal added is the original), the sites from the record and its journal, the preset and where it
 * promises a factor of 1, the inputs and how their dims are sized, L, and the runs.
 */
import { Analysis, analyseModel, forcedAs } from '../analysis/analyse';
import type { Detection } from '../detect/find-attention';
import { InputError, opt } from '../errors';
import { AttentionOp, Contracts, inputOf, specOf } from '../graph/attention-ops';
import { Graph } from '../graph/graph';
import { attrInt } from '../graph/node';
import { modelScopes, Scope } from '../graph/scopes';
import { DataType, ModelProto, NodeProto, TensorProto, toNumber, ValueInfoProto } from '../io/onnx';
import { Preset } from '../policy/factor';
import { RECORD_KEY } from '../identity';
import { PatchRecord, readRecord, recordedNode, recordedPreset } from '../rewrite/record';
import { CHECK_IDS, CheckId, defaultCap, defaultSweep, FrozenPlan, makePlan, Plan, PlanInput, retrofitRuns, RunSpec, sweepShape } from './plan';
import { dimSources, synthesize } from './inputs';
import { LengthLimit, positionLimit } from '../analysis/limits';
import { evaluate, LengthBound, lengthBound, ModelLengths, modelLengths } from '../analysis/reach';
import { bindGivenDims, describeInputs, DimRule, InputSpec, pinnedShape, RunShape } from '../analysis/signature';
import { attentionMatrices, CACHE_OUTPUT_BYTES, cacheLimit, cacheOutputs, defaultBudget, gb, memoryLimit, MemoryModel, pastBytes, sharedPasts, weightBytes } from './memory';
import { findSites, VerifySite } from './sites';
import { readTensorFile } from './tensor-files';
import { elementCount, elemTypeName, Feeds, HostTensor, hostTypeOf } from './tensors';
import { Tolerance } from './compare';
import type { FileVerifyOptions } from './options';

const INTEGER_TYPES = new Set<number>([DataType.INT64, DataType.INT32, DataType.INT16, DataType.INT8, DataType.UINT8, DataType.BOOL]);

/** Where the preset promises a factor of exactly 1: rows whose n lies in [from, upTo]. */
export interface Identity {
  from: number;
  upTo: number;
  /** How messages say it: `n = L = 64`, `n ≤ L = 64`, `n < floor_scale = 16`. */
  text: string;
}

/** A setup as prepare builds it; once returned (Setup), nothing changes it. */
interface SetupDraft {
  record: PatchRecord;
  preset: Preset;
  sites: VerifySite[];
  /** Attention in the original that the patch refused (detection on the original), by node and reason. */
  refused: string[];
  graph: Graph;
  specs: InputSpec[];
  given: Feeds;
  inputFiles: Record<string, string>;
  fixed: Map<string, number>;
  /** L: the sweep's centre and, with a known train length, where the ssmax retrofit promises factor 1. */
  L: number;
  trainLenSource: string;
  identity: Identity | null;
  /** Runs beyond this total length are where the factor must show (liveness). */
  liveFrom: number;
  plan: Plan;
  seqFree: boolean;
  pastFree: boolean;
  pinned: Partial<RunShape>;
  /** The token count the inputs fix, without a free sequence axis; the fewest cached tokens a run may have. */
  fixedSeq?: number;
  minPast: number;
  checks: Set<CheckId>;
  strict: boolean;
  tolerance: Tolerance;
  toleranceGiven: boolean;
  lowPrecisionOutputs: Set<string>;
  modelOutputs: string[];
  /** The most keys the model lets any row see, when its lengths are fixed or capped: what no plan can go beyond. */
  bound: LengthBound | null;
  /** The most keys a row of the run sees, where the graph's shapes tell (a cross attention's cache, 1500 fixed frames + past), else past + sequence. */
  keysOf: (run: RunShape) => number;
  /** Every output holds integers (generated token ids): outputs that do not change prove nothing. */
  integerOutputs: boolean;
  /** What a run's peak memory is estimated from. */
  memory: MemoryModel;
  /**
   * The runs retrofit parity reads (added to the plan's runs), or why no run can reach where the factor is 1; null
   * when retrofit is not selected or the preset promises no factor of 1.
   */
  retrofitRuns: string[] | string | null;
  /** Cache outputs the sessions run without (droppedCaches): none unless the plan feeds a large cache. */
  droppedOutputs: string[];
}

/** What verification decided before any run: read by the checks and the executor, changed by neither. */
export type Setup = Readonly<Omit<SetupDraft, 'plan' | 'sites' | 'refused' | 'specs' | 'checks' | 'fixed' | 'lowPrecisionOutputs' | 'modelOutputs'>> & {
  readonly plan: FrozenPlan;
  readonly sites: readonly VerifySite[];
  readonly refused: readonly string[];
  readonly specs: readonly InputSpec[];
  readonly checks: ReadonlySet<CheckId>;
  readonly fixed: ReadonlyMap<string, number>;
  readonly lowPrecisionOutputs: ReadonlySet<string>;
  readonly modelOutputs: readonly string[];
};

/** How the sweep runs: whole prompts even over a cache, for calibration (it reads every row of one causal run). */
export interface SweepForm { wholePrompts?: boolean }

/**
 * The none preset with a sliding window and no prior: the keys up to which no window hides any (W + S, the
 * smallest), so liveness looks beyond them; undefined when a prior changes the logits at every length.
 */
function windowsAlone(sites: readonly VerifySite[]): number | undefined {
  if (sites.length === 0 || sites.some((s) => s.theta || !s.window)) return undefined;
  return Math.min(...sites.map((s) => s.window!.size + s.window!.sinks));
}

export function prepare(original: ModelProto, patched: ModelProto, options: FileVerifyOptions, form: SweepForm = {}): Setup {
  const record = readRecord(patched);
  if (!record && readRecord(original)) {
    throw new InputError(`the patched model has no ssmax-patch record (metadata_props '${RECORD_KEY}'), but the original has one: the two models are likely swapped (give the original first, then the model ssmax-patch wrote)`, 'wrong-original');
  }
  if (!record) throw new InputError(`the patched model has no ssmax-patch record (metadata_props '${RECORD_KEY}' with its sites and journal): give a model written by ssmax-patch`, 'not-patched');
  checkPair(original, patched, record);
  const graph = new Graph(original.graph!);
  const specs = describeInputs(graph);
  oneBeam(graph, specs);
  sharedBuffers(graph, specs);
  const checks = new Set(options.checks ?? CHECK_IDS);
  const given = { ...readGivenInputs(specs, options.inputFiles ?? {}), ...checkGivenTensors(specs, options.inputs ?? {}) };
  const fixed = new Map(Object.entries(options.dims ?? {}));
  bindGivenDims(specs, given, fixed, new Map([...fixed.keys()].map((k) => [k, opt('dims', k)])));
  checkDimNames(specs, options.dims ?? {}, given);
  const pinned = pinnedShape(fixed);
  const sources = dimSources(specs, fixed, given);
  const pastFree = pinned.past === undefined && specs.some((s) => s.role === 'past' && !given[s.name]) && (sources.has('past') || sources.has('total'));
  const analysis = originalAnalysis(original, record, options.analysis);
  const queryRows = fewestQueryRows(analysis.scopes);
  // A total length (past + sequence) lets the sequence vary only where no cache takes up the difference.
  const seqFree = pinned.seq === undefined && queryRows === undefined && (sources.has('seq') || (sources.has('total') && !pastFree));
  const fixedSeq = seqFree ? undefined : queryRows ?? fixedTokens(specs);
  const minPast = minCachedTokens(analysis.scopes);
  const preset = recordedPreset(record);
  const { sites, refused, heads, detection } = siteSetup(analysis, patched, record);
  const { L, known, source } = trainLength(options.trainLen, record, preset, sites);
  const identity = identityOf(preset, L, known, sites, Boolean(record.rope));
  const full: MemoryModel = { weights: weightBytes(graph), matrices: attentionMatrices(detection, checks.has('sharpness')), specs, outputs: original.graph!.output, fixed };
  const table = ropeTableNote(positionLimit(graph, specs), record);
  const input: PlanInput = {
    trainLen: L, lengths: options.lengths, maxLen: options.maxLen ?? memoryLongest(options, L), batch: options.batch ?? 2,
    seqFree, pastFree, pinned, limit: null,
    canPad: specs.some((s) => s.role === 'mask' && !given[s.name]), fixedSeq, minPast, heads, wholePrompts: form.wholePrompts,
  };
  const want = wantedLongest(options, input, table);
  const dropped = droppedCaches(full, sweepShape(input, want));
  // The runs' estimates leave out the outputs the sessions will not return.
  const memory: MemoryModel = { ...full, outputs: full.outputs.filter((o) => !dropped.includes(o.name)) };
  const limits = [table, memoryCap(memory, options, input, want), defaultCacheCap(memory, options, input, want)];
  const plan = makePlan({ ...input, limit: limits.reduce((a, b) => (b && (!a || b.length < a.length) ? b : a), null) });
  if (dropped.length) plan.notes.push(droppedNote(dropped, plan, memory));
  const shared = sharedNote(plan, memory, given);
  if (shared) plan.notes.push(shared);
  const lengths = modelLengths(analysis.scopes, detection, specs);
  const lowPrecisionOutputs = new Set(original.graph!.output
    .filter((o) => o.type?.tensorType?.elemType === DataType.FLOAT16 || o.type?.tensorType?.elemType === DataType.BFLOAT16).map((o) => o.name));
  const setup: SetupDraft = {
    record, preset, sites, refused, graph, specs, given, inputFiles: options.inputFiles ?? {}, fixed, L, trainLenSource: source,
    identity, liveFrom: preset.kind === 'none' ? windowsAlone(sites) ?? 1 : identity ? identity.upTo : L, plan, seqFree, pastFree, pinned, fixedSeq, minPast, checks, strict: Boolean(options.strict),
    tolerance: { atol: options.atol ?? 1e-4, rtol: options.rtol ?? 1e-4 }, toleranceGiven: options.atol !== undefined || options.rtol !== undefined,
    lowPrecisionOutputs, modelOutputs: original.graph!.output.map((o) => o.name),
    bound: plan.runs[0] ? lengthBound(lengths, specs, plan.runs[0]) : null,
    keysOf: (run) => runKeys(lengths, specs, fixed, run),
    integerOutputs: original.graph!.output.every((o) => INTEGER_TYPES.has(o.type?.tensorType?.elemType ?? 0)),
    memory, retrofitRuns: null, droppedOutputs: dropped,
  };
  if (lowPrecisionOutputs.size && !setup.toleranceGiven) {
    plan.notes.push(`float16/bfloat16 outputs (${[...lowPrecisionOutputs].join(', ')}) compared with atol 1e-2, rtol 1e-2`);
  }
  noteScaleDrift(setup);
  if (checks.has('retrofit') && identity) setup.retrofitRuns = retrofitRunsOf(setup, identity);
  // The first run's inputs, synthesised before any session exists, so input errors come first and fast.
  const first = plan.runs[0];
  if (first) synthesize(graph, specs, first, { fixed, given, padded: first.padded });
  return setup;
}

/** The retrofit runs, planned last: a "no run reaches" reason quotes the plan's first note. */
function retrofitRunsOf(setup: SetupDraft, identity: Identity): string[] | string {
  return retrofitRuns(setup.plan, identity, {
    seqFree: setup.seqFree, pastFree: setup.pastFree, pinned: { ...setup.pinned, seq: setup.pinned.seq ?? setup.fixedSeq }, batch: setup.pinned.batch ?? 1,
    minPast: setup.minPast,
  });
}

/**
 * The memory budget as a cap on the sweep's lengths (memory.ts): the longest length the plan would run, if its run
 * would pass the budget, is cut to the longest that fits. Its run is the sweep's (batch 1, the whole sequence, or
 * the query tokens after a cache).
 */
/**
 * The cache outputs the sessions do without, where the plan's longest run feeds a large cache: a present is the cache
 * fed plus the new tokens' keys and values, as large as the cache, and onnxruntime keeps a graph output for the
 * whole run (2.25 GB more at 32768 keys for 12 layers × 768). The new keys and values of later layers do move with
 * the factor, and so do the logits, which are compared.
 */
function droppedCaches(memory: MemoryModel, longest: RunShape): string[] {
  if (pastBytes(memory, longest) < CACHE_OUTPUT_BYTES) return [];
  const names = cacheOutputs(memory.specs, memory.outputs);
  return names.length < memory.outputs.length ? names : [];
}

function droppedNote(names: readonly string[], plan: Plan, memory: MemoryModel): string {
  const longest = longestRun(plan);
  const listed = `${names.slice(0, 2).join(', ')}${names.length > 2 ? `, … ${names.length} in all` : ''}`;
  return `the longest run feeds a cache of ${gb(longest ? pastBytes(memory, longest) : 0)}: the sessions return no cache outputs (${listed}), each as large as the cache; the logits and the other outputs are compared`;
}

/** The plan's run of the most keys (past + sequence), if it has runs. */
function longestRun(plan: Plan): RunSpec | undefined {
  return plan.runs.reduce<RunSpec | undefined>((a, r) => (!a || r.seq + r.past > a.seq + a.past ? r : a), undefined);
}

/** What the runs over a large cache feed (sharedPasts), said once for the longest: which inputs take whose values. */
function sharedNote(plan: Plan, memory: MemoryModel, given: Feeds): string | undefined {
  const longest = longestRun(plan);
  const shared = longest ? sharedPasts(memory.specs, longest, memory.fixed, new Set(Object.keys(given))) : new Map<string, string>();
  if (!shared.size) return undefined;
  const sources = [...new Set(shared.values())];
  return `runs over a cache of ${CACHE_OUTPUT_BYTES / 2 ** 20} MB or more feed ${shared.size + sources.length} past inputs the values of ${sources.length} (${sources.join(', ')}) in turn: every model is fed the same values, and a run holds ${sources.length} caches' worth of inputs, not one per input`;
}

/**
 * The original's cap, which the checks keep (they compare with the original), saying where --rope gave the patched
 * model longer rotary caches than the original's.
 */
function ropeTableNote(cap: LengthLimit | null, record: PatchRecord): LengthLimit | null {
  const grown = (record.rope?.sites ?? []).flatMap((r) => (r.table && r.table.newRows > r.table.rows ? [r.table.newRows] : []));
  if (!cap || !grown.length) return cap;
  return { length: cap.length, reason: `${cap.reason}; the patched model's recomputed caches have ${Math.min(...grown)}, but the checks compare with the original` };
}

/**
 * With --max-memory and no --max-len, the memory budget sets the longest length, not the default cap on the
 * attention matrix: the sweep's longest length (16·L) is the bound the budget lowers.
 */
function memoryLongest(options: FileVerifyOptions, L: number): number | undefined {
  return options.maxMemory !== undefined ? Math.max(...(options.lengths ?? defaultSweep(L))) : undefined;
}

/** The longest length the plan would run before the memory budget: the sweep's, capped by --max-len (or the default) and a table. */
function wantedLongest(options: FileVerifyOptions, p: PlanInput, table: LengthLimit | null): number {
  const longest = p.maxLen ?? defaultCap(p).cap;
  return Math.min(Math.max(p.trainLen, ...(options.lengths ?? defaultSweep(p.trainLen))), longest, table?.length ?? Infinity);
}

function memoryCap(m: MemoryModel, options: FileVerifyOptions, p: PlanInput, want: number): LengthLimit | null {
  const budget = options.maxMemory !== undefined ? { bytes: options.maxMemory, why: `given with ${opt('maxMemory')}` } : defaultBudget();
  return memoryLimit(m, want, (t) => sweepShape(p, t), budget);
}

/** The default plan's cap on a run's cache (cacheLimit): none where lengths, --max-len or --max-memory are given. */
function defaultCacheCap(m: MemoryModel, options: FileVerifyOptions, p: PlanInput, want: number): LengthLimit | null {
  if (options.lengths || options.maxLen !== undefined || options.maxMemory !== undefined) return null;
  return cacheLimit(m, want, (t) => sweepShape(p, t));
}

function runKeys(lengths: ModelLengths, specs: readonly InputSpec[], fixed: ReadonlyMap<string, number>, run: RunShape): number {
  // Value inputs as synthesis fills them: a past length, or a total.
  const values = (name: string): number | undefined => (/total/i.test(name) ? run.seq + run.past : /past/i.test(name) ? run.past : undefined);
  const keys = lengths.sites.map((s) => (s.keys ? evaluate(s.keys, specs, run, fixed, values) : undefined)).filter((k): k is number => k !== undefined);
  return keys.length ? Math.max(...keys) : run.seq + run.past;
}

/**
 * A --dim the model cannot honour is an error, never a run that only pretends to have that size: the name must be
 * an input's dim, or an alias (seq, past, batch) of an axis some input has.
 */
function checkDimNames(specs: readonly InputSpec[], dims: Record<string, number>, given: Feeds): void {
  const open = dimSources(specs, new Map(), given);
  for (const name of Object.keys(dims)) {
    if (specs.some((s) => s.dims.some((d) => 'param' in d && d.param === name))) continue;
    const alias = pinnedShape(new Map([[name, 1]]));
    const source = (['seq', 'past', 'batch'] as const).find((k) => alias[k] !== undefined);
    if (source && open.has(source)) continue;
    const shapes = specs.map((s) => `${s.name} [${s.dims.map((d) => ('value' in d ? d.value : 'param' in d ? d.param : '?')).join(', ')}]`).join(', ');
    throw new InputError(`${opt('dims', `${name}=${dims[name]}`)}: no input of this model has a dim '${name}'${source ? ` or an axis sized by the ${source === 'seq' ? 'sequence' : source}` : ''} (inputs: ${shapes})`, 'usage');
  }
}

/** The token count the model's inputs fix (axis 1 of its ids, or of a float input [B, S, D]), if any. */
function fixedTokens(specs: readonly InputSpec[]): number | undefined {
  const tokens = specs.find((s) => ['ids', 'positions', 'token-types', 'values'].includes(s.role) && s.dims.length >= 2 && 'value' in s.dims[1]);
  const d = tokens?.dims[1];
  return d && 'value' in d ? d.value : undefined;
}

/**
 * The cached tokens every run needs: the most any operator's spec asks for (onnxruntime 1.30's CPU
 * DecoderMaskedMultiHeadAttention corrupts memory on an empty cache, so models that have one get at least one).
 */
function minCachedTokens(scopes: Scope[]): number {
  return Math.max(0, ...contractsInForce(scopes, (c) => c.minPast).map((m) => m.tokens));
}

/**
 * A cache indirection [B, beams, max length] is synthesised for one beam (beam 0 everywhere), so its beam axis
 * is 1 whatever its name says (a name like num_beams would otherwise be sized by position).
 */
function oneBeam(graph: Graph, specs: readonly InputSpec[]): void {
  for (const { op, node, contract } of contractNodes([graph], (c) => c.beams)) {
    contractRule(specs, inputOf(op, node, contract.indirection), 1, { source: 'fixed', size: 1, why: `the beams of ${op.opType}'s cache indirection: one` });
  }
}

/**
 * A past/present pair that is one buffer (the operator's shared-buffer attribute set, or its input given) holds the past and the new
 * tokens: its length axis is sized past + sequence, whatever its name says (max_sequence_length would be sized as
 * the sequence, leaving no room for a cache).
 */
function sharedBuffers(graph: Graph, specs: readonly InputSpec[]): void {
  for (const { op, node, contract: shared } of contractNodes([graph], (c) => c.sharedBuffer)) {
    if (attrInt(node, shared.attribute) !== 1 && !(shared.given && inputOf(op, node, shared.given))) continue;
    const axes: [string, number, string][] = shared.caches.map((role) => [role, shared.axis, 'shared past/present buffer: past + current tokens']);
    // A cache indirection [B, beams, max length] spans the same buffer.
    if (op.contracts.beams) axes.push([op.contracts.beams.indirection, 2, 'cache indirection spans its shared cache buffer']);
    for (const [role, axis, why] of axes) contractRule(specs, inputOf(op, node, role), axis, { source: 'total', why: `${op.opType}'s ${why}` });
  }
}

/** An operator's contract sizes this axis of the input `name` (when the model does not give it as a number). */
function contractRule(specs: readonly InputSpec[], name: string, axis: number, rule: Omit<DimRule, 'contract'>): void {
  const d = specs.find((s) => s.name === name)?.dims[axis];
  if (d && !('value' in d)) d.rule = { ...rule, contract: true };
}

/** A contract that holds whenever the node runs, or only when it is given the input `given`. */
function applies(op: AttentionOp, node: NodeProto, given: string | undefined): boolean {
  return given === undefined || inputOf(op, node, given) !== '';
}

/** The operator nodes of `graphs` that have the contract `pick` reads, with it. */
function contractNodes<T>(graphs: Graph[], pick: (c: Contracts<string>) => T | undefined): { op: AttentionOp; node: NodeProto; contract: T }[] {
  const out: { op: AttentionOp; node: NodeProto; contract: T }[] = [];
  for (const graph of graphs) {
    for (const node of graph.nodes) {
      const op = specOf(node);
      const contract = op && pick(op.contracts);
      if (op && contract) out.push({ op, node, contract });
    }
  }
  return out;
}

/** One contract (`pick`) of every operator node in any graph of the model, where it holds for that node. */
function contractsInForce<T extends { given?: string }>(scopes: Scope[], pick: (c: Contracts<string>) => T | undefined): T[] {
  return contractNodes(scopes.map((s) => s.graph), pick).filter((x) => applies(x.op, x.node, x.contract.given)).map((x) => x.contract);
}

/** The query rows an operator's kernel takes, when it takes only so many (DecoderMaskedMultiHeadAttention: one token). */
function fewestQueryRows(scopes: Scope[]): number | undefined {
  const rows = contractsInForce(scopes, (c) => c.queryRows).map((q) => q.rows);
  return rows.length ? Math.min(...rows) : undefined;
}

interface SiteSetup { sites: VerifySite[]; refused: string[]; heads?: number; detection: Detection }

/**
 * The original's analysis with the record's sites forced (detection accepts forced sites again by their inner node
 * labels): the one handed in where it is of this model and forcing changes nothing, else made here.
 */
function originalAnalysis(original: ModelProto, record: PatchRecord, given: Analysis | undefined): Analysis {
  const force = recordedForce(record);
  return given?.model === original ? forcedAs(given, force) : analyseModel(original, { force });
}

const recordedForce = (record: PatchRecord): string[] => record.sites.map((s) => recordedNode(s).node);

function siteSetup(analysis: Analysis, patched: ModelProto, record: PatchRecord): SiteSetup {
  const { detection } = analysis;
  const force = recordedForce(record);
  const sites = findSites(patched, modelScopes(patched), record, detection);
  const refused = detection.skipped.filter((k) => k.attention && !force.includes(k.node))
    .map((k) => `refused attention ${k.node}${k.scope ? ` [${k.scope}]` : ''}: ${k.reason}`);
  const known = [...detection.sites, ...detection.fused, ...detection.calls.map((c) => c.inner)].map((s) => s.heads.heads ?? 0);
  return { sites, refused, heads: Math.max(0, ...known) || undefined, detection };
}

/**
 * The patched model minus what its journal added must be the original: the same inputs, outputs and
 * initializers (names, types and dims). Anything else is another model's patch.
 */
function checkPair(original: ModelProto, patched: ModelProto, record: PatchRecord): void {
  const main = record.journal.filter((e) => e.scope === 'main');
  const added = new Set(main.flatMap((e) => [...e.initializers, ...e.inputs]));
  const o = original.graph!, p = patched.graph!;
  const mismatch = (what: string): never => {
    throw new InputError(`the patched model is not a patch of this original: ${what}`, 'wrong-original');
  };
  const values = (list: ValueInfoProto[]): Map<string, string> =>
    new Map(list.filter((v) => !added.has(v.name)).map((v) => [v.name, v.type?.tensorType ? String(v.type.tensorType.elemType) : 'not a tensor']));
  compareSets('input', values(o.input), values(p.input), mismatch);
  compareSets('output', values(o.output), values(p.output), mismatch);
  const inits = (list: TensorProto[]): Map<string, string> => new Map(list.filter((t) => !added.has(t.name)).map((t) => [t.name, `${t.dataType}[${t.dims.map(toNumber).join(', ')}]`]));
  compareSets('initializer', inits(o.initializer), inits(p.initializer), mismatch);
}

function compareSets(what: string, original: Map<string, string>, patched: Map<string, string>, mismatch: (why: string) => never): void {
  const missing = [...original.keys()].filter((k) => !patched.has(k));
  const extra = [...patched.keys()].filter((k) => !original.has(k));
  const list = (xs: string[]): string => `${xs.slice(0, 3).map((x) => `'${x}'`).join(', ')}${xs.length > 3 ? `, … ${xs.length} in all` : ''}`;
  if (missing.length) mismatch(`the original's ${what}${missing.length > 1 ? 's' : ''} ${list(missing)} ${missing.length > 1 ? 'are' : 'is'} not in the patched model`);
  if (extra.length) mismatch(`the patched model's ${what}${extra.length > 1 ? 's' : ''} ${list(extra)} ${extra.length > 1 ? 'are' : 'is'} neither the original's nor added by the patch`);
  for (const [k, v] of original) if (patched.get(k) !== v) mismatch(`${what} '${k}' differs (type and shape ${v} in the original, ${patched.get(k)} in the patched model)`);
}

/** Tensors given by value: each of an input the model has, in the host type of its element type. */
function checkGivenTensors(specs: readonly InputSpec[], tensors: Record<string, HostTensor>): Feeds {
  for (const [name, t] of Object.entries(tensors)) {
    const spec = specs.find((s) => s.name === name);
    if (!spec) throw new InputError(`${opt('inputs', name)}: the model has no input '${name}' (inputs: ${specs.map((s) => s.name).join(', ')})`, 'usage');
    const type = hostTypeOf(spec.elemType, name);
    if (t.type !== type) throw new InputError(`${opt('inputs', name)}: a ${t.type} tensor, but the model declares ${elemTypeName(spec.elemType)} (${type})`, 'usage');
    if (t.data.length !== elementCount(t.dims)) throw new InputError(`${opt('inputs', name)}: ${t.data.length} values for dims [${t.dims.join(', ')}]`, 'usage');
  }
  return tensors;
}

function readGivenInputs(specs: readonly InputSpec[], files: Record<string, string>): Feeds {
  const given: Feeds = {};
  for (const [name, file] of Object.entries(files)) {
    const spec = specs.find((s) => s.name === name);
    if (!spec) throw new InputError(`${opt('inputFiles', name)}: the model has no input '${name}' (inputs: ${specs.map((s) => s.name).join(', ')})`, 'usage');
    given[name] = readTensorFile(file, name, spec.elemType);
  }
  return given;
}

/**
 * L per preset: the given train length, else the record's; for ssmax without one, the length where the mean s
 * gives factor 1 (e^(1/s)); for llama4, floor_scale (its factor is 1 below it).
 */
function trainLength(option: number | undefined, record: PatchRecord, preset: Preset, sites: readonly VerifySite[]):
  { L: number; known: boolean; source: string } {
  if (option !== undefined) {
    if (!Number.isInteger(option) || option < 2) throw new InputError(`${opt('trainLen')} must be an integer ≥ 2, got ${option}`, 'usage');
    return { L: option, known: true, source: 'the given train length' };
  }
  if (preset.kind === 'llama4') return { L: preset.floorScale, known: true, source: 'llama4: floor_scale, below which the factor is 1' };
  if (record.trainLen) return { L: record.trainLen, known: true, source: 'the patch record' };
  const all = sites.flatMap((s) => s.s);
  // The none preset has no s: the sweep is centred where a default retrofit would put it.
  if (all.length === 0) return { L: 256, known: false, source: 'no factor (the none preset): the sweep is centred on 256' };
  const mean = all.reduce((a, b) => a + b, 0) / all.length;
  const L = Math.min(1 << 20, Math.max(2, Math.round(Math.exp(1 / mean))));
  return { L, known: false, source: `factor 1 at n = e^(1/s) for the mean s ${mean.toPrecision(3)}` };
}

/** Rows where the preset's factor is 1 by promise: none without a train length, or with the bias variant. */
function identityOf(p: Preset, L: number, known: boolean, sites: readonly VerifySite[], rope: boolean): Identity | null {
  // A prior that varies with position (θβ ≠ 0 at some head), or RoPE rescaled, changes the logits at every length.
  if (p.kind === 'none' || rope || sites.some((s) => s.theta?.beta.some((b) => b !== 0))) return null;
  if (p.kind === 'llama4') return { from: 1, upTo: p.floorScale - 1, text: `n < floor_scale = ${p.floorScale}` };
  if (!known) return null;
  if (p.kind === 'qwen-logn' || p.kind === 'slope') return { from: 1, upTo: L, text: `n ≤ L = ${L}` };
  if (p.kind === 'ssmax' && p.b !== undefined && p.b !== 0) return null;
  return { from: L, upTo: L, text: `n = L = ${L}` };
}

/** Where the model's s differs from the record's (fine-tuned, say): a note, and the probe expects the model's. */
function noteScaleDrift(setup: SetupDraft): void {
  for (const site of setup.sites) {
    if (site.record.s === undefined) continue;
    const recorded = Array.isArray(site.record.s) ? site.record.s : [site.record.s];
    if (site.s.length && recorded.some((v, h) => Math.abs(v - site.s[h % site.s.length]) > 1e-6 * Math.abs(v))) {
      setup.plan.notes.push(`${site.label}: the record says s = ${recorded.map((v) => v.toPrecision(4)).join(', ')}, the model holds ${site.s.map((v) => v.toPrecision(4)).join(', ')}; the probe expects the model's`);
    }
  }
}
