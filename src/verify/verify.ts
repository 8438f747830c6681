/**
 * Proves on onnxruntime that a patch behaves, with five checks:
 *   1. wiring parity: with its factor forced to 1 the patched graph reproduces the original;
 *   2. semantic probe: at every site, logits after the factor = s·ln(n_i) × logits before it;
 *   3. retrofit parity: at n = L (s = 1/ln L) the patched model reproduces the original;
 *   4. liveness: beyond L the outputs differ from the original's, and nothing becomes NaN or Inf;
 *   5. attention sharpness: the patched model's largest attention probability does not fade like the original's.
 * Four sessions at most (original, patched, factor 1, probe), each created once; every run feeds every check
 * that needs it, and its outputs are dropped before the next run.
 */
import { Graph } from '../graph/graph';
import { DataType, ModelProto } from '../io/onnx';
import { InputError, opt } from '../errors';
import { PatchRecord, readRecord } from '../rewrite/record';
import { scaleFromTrainLen } from '../policy/scale';
import { withMasksOfOnes } from '../policy/n-mode';
import { aliveRuns, CHECK_NAMES, LivenessData, livenessCheck, parityCheck, probeCheck, sharpnessCheck, skippedCheck } from './checks';
import { compareOutputs, Tolerance } from './compare';
import { dimSources, synthesize } from './inputs';
import { positionLimit } from './limits';
import { CHECK_IDS, CheckId, makePlan, Plan, retrofitRuns, RunSpec } from './plan';
import { SiteProbe } from './probe';
import { probeable } from './runtime-model';
import { CheckResult, InputReport, RunReport, RunResult, VerifyReport } from './report';
import { Outputs } from './run';
import { LoadFailure, openSessions, SessionKey, Sessions } from './sessions';
import { layerMeans, MIN_KEPT, sharpnessCurve, SharpnessCurve, sharpnessPoint, SharpnessPoint } from './sharpness';
import { bindGivenDims, describeInputs, InputSpec, pinnedShape, RunShape } from './signature';
import { readTensorFile } from './tensor-files';
import { elemTypeName, Feeds } from './tensors';

export { withUnitFactor } from './runtime-model';
export type { CheckResult, RunResult, Status, VerifyReport } from './report';
export type { CheckId } from './plan';

export interface VerifyOptions {
  /** L: the retrofit length (default: the patch record's, else the length where the mean s gives factor 1). */
  trainLen?: number;
  /** Context lengths of the sweep (default L/4, L/2, L, 2L, 4L, 8L, 16L). */
  lengths?: number[];
  /** No run longer than this (default 4096, or the model's position table if shorter). */
  maxLen?: number;
  /** Batch of the short runs (default 2: one plain item and one padded item). */
  batch?: number;
  /** Tolerances for parity (default 1e-4 each for float32 outputs, 1e-2 for float16/bfloat16 outputs). */
  atol?: number;
  rtol?: number;
  /** Checks to run (default all). */
  checks?: CheckId[];
  /** Sizes of named dims, e.g. {seq: 128, height: 224}. */
  dims?: Record<string, number>;
  /** Input tensors from files (.npy, .json, .pb), by input name. */
  inputFiles?: Record<string, string>;
  /** Called with a short progress line as each stage starts. */
  progress?: (line: string) => void;
}

interface Setup {
  record: PatchRecord;
  graph: Graph;
  specs: InputSpec[];
  given: Feeds;
  inputFiles: Record<string, string>;
  fixed: Map<string, number>;
  L: number;
  trainLenKnown: boolean;
  trainLenSource: string;
  plan: Plan;
  seqFree: boolean;
  pastFree: boolean;
  pinned: Partial<RunShape>;
  checks: Set<CheckId>;
  tolerance: Tolerance;
  toleranceGiven: boolean;
  lowPrecisionOutputs: Set<string>;
  retrofit: { ids: Set<string>; skip?: string; criterion: string };
  modelOutputs: string[];
}

const CRITERIA = {
  wiring: (t: Tolerance) => `with the factor forced to 1, every output equals the original's (atol ${t.atol}, rtol ${t.rtol})`,
  probe: 'logits after each factor = s_h·ln(n_i) × logits before it, every batch item, head and row',
  liveness: 'beyond L some output differs from the original\'s by more than 10× the factor-1 float noise and 1e-6 of its scale; no NaN or Inf where the original is finite',
  sharpness: `from the shortest to the longest length the patched model keeps at least ${Math.round((Math.exp(MIN_KEPT) - 1) * 100)} % more of its mean largest attention probability than the original`,
};

export async function verifyPatch(original: ModelProto, patched: ModelProto, options: VerifyOptions = {}): Promise<VerifyReport> {
  const started = performance.now();
  const setup = prepare(original, patched, options);
  const progress = options.progress ?? ((): void => undefined);
  progress(`verify: L = ${setup.L} (${setup.trainLenSource}); ${setup.plan.runs.length} runs; lengths ${setup.plan.sweep.join(', ') || 'none'}`);
  let sessions: Sessions;
  try {
    sessions = await openSessions(original, patched, setup.checks, setup.record.sites, progress);
  } catch (e) {
    if (e instanceof LoadFailure) return failedReport(setup, e.message, started);
    throw e;
  }
  try {
    const collected = await execute(setup, sessions, progress);
    return assemble(setup, sessions, collected, started);
  } finally {
    await sessions.release();
  }
}

function failedReport(setup: Setup, reason: string, started: number): VerifyReport {
  const checks = CHECK_IDS.map((id): CheckResult => (setup.checks.has(id)
    ? { id, name: CHECK_NAMES[id], status: 'FAILED', summary: reason, criterion: '', runs: [] }
    : skippedCheck(id, '', 'not selected (--checks)')));
  return {
    passed: false, trainLen: setup.L, trainLenSource: setup.trainLenSource, tolerance: setup.tolerance, inputs: inputReports(setup),
    sweep: setup.plan.sweep, notes: setup.plan.notes, runs: [], checks, sessions: [], totalMs: Math.round(performance.now() - started),
  };
}

function prepare(original: ModelProto, patched: ModelProto, options: VerifyOptions): Setup {
  const record = readRecord(patched);
  if (!record) throw new InputError("the patched model has no ssmax-patch record (metadata_props 'ssmax_patch'): give a model written by ssmax-patch");
  const graph = new Graph(original.graph!);
  const specs = describeInputs(graph);
  const patchedInputs = describeInputs(new Graph(patched.graph!)).map((s) => s.name).sort().join(', ');
  if (specs.map((s) => s.name).sort().join(', ') !== patchedInputs) {
    throw new InputError(`the original and patched models have different inputs (${specs.map((s) => s.name).join(', ')} vs ${patchedInputs})`);
  }
  const checks = new Set(options.checks ?? CHECK_IDS);
  const given = readGivenInputs(specs, options.inputFiles ?? {});
  const fixed = new Map(Object.entries(options.dims ?? {}));
  const origin = new Map([...fixed.keys()].map((k) => [k, opt('dims', k)]));
  bindGivenDims(specs, given, fixed, origin);
  const pinned = pinnedShape(fixed);
  const sources = dimSources(specs, fixed, given);
  const seqFree = pinned.seq === undefined && (sources.has('seq') || sources.has('total'));
  const pastFree = pinned.past === undefined && specs.some((s) => s.role === 'past' && !given[s.name]) && (sources.has('past') || sources.has('total'));
  const { L, known, source } = trainLength(options.trainLen, record);
  const limit = positionLimit(graph, specs);
  const plan = makePlan({
    trainLen: L, lengths: options.lengths, maxLen: options.maxLen, batch: options.batch ?? 2, limit, seqFree, pastFree, pinned,
    canPad: specs.some((s) => s.role === 'mask' && !given[s.name]),
  });
  const lowPrecisionOutputs = new Set(original.graph!.output
    .filter((o) => o.type?.tensorType?.elemType === DataType.FLOAT16 || o.type?.tensorType?.elemType === DataType.BFLOAT16).map((o) => o.name));
  const tolerance = { atol: options.atol ?? 1e-4, rtol: options.rtol ?? 1e-4 };
  const setup: Setup = {
    record, graph, specs, given, inputFiles: options.inputFiles ?? {}, fixed, L, trainLenKnown: known, trainLenSource: source, plan, seqFree,
    pastFree, pinned, checks, tolerance,
    toleranceGiven: options.atol !== undefined || options.rtol !== undefined, lowPrecisionOutputs, retrofit: { ids: new Set(), criterion: '' }, modelOutputs: original.graph!.output.map((o) => o.name),
  };
  if (lowPrecisionOutputs.size && !setup.toleranceGiven) {
    plan.notes.push(`float16/bfloat16 outputs (${[...lowPrecisionOutputs].join(', ')}) compared with atol 1e-2, rtol 1e-2`);
  }
  setup.retrofit = planRetrofit(setup);
  validateSynthesis(setup);
  return setup;
}

function readGivenInputs(specs: InputSpec[], files: Record<string, string>): Feeds {
  const given: Feeds = {};
  for (const [name, file] of Object.entries(files)) {
    const spec = specs.find((s) => s.name === name);
    if (!spec) throw new InputError(`${opt('inputFiles', name)}: the model has no input '${name}' (inputs: ${specs.map((s) => s.name).join(', ')})`);
    given[name] = readTensorFile(file, name, spec.elemType);
  }
  return given;
}

function trainLength(option: number | undefined, record: PatchRecord): { L: number; known: boolean; source: string } {
  if (option !== undefined) {
    if (!Number.isInteger(option) || option < 2) throw new InputError(`${opt('trainLen')} must be an integer ≥ 2, got ${option}`);
    return { L: option, known: true, source: 'the given train length' };
  }
  if (record.trainLen) return { L: record.trainLen, known: true, source: 'the patch record' };
  const all = record.sites.flatMap((s) => (s.s === undefined ? [] : Array.isArray(s.s) ? s.s : [s.s]));
  const mean = all.length ? all.reduce((a, b) => a + b, 0) / all.length : 1 / Math.log(1024);
  const L = Math.min(1 << 20, Math.max(2, Math.round(Math.exp(1 / mean))));
  return { L, known: false, source: `factor 1 at n = e^(1/s) for the mean s ${mean.toPrecision(3)}` };
}

function planRetrofit(setup: Setup): Setup['retrofit'] {
  const { record, L, plan } = setup;
  const criterion = `at n = L = ${L} every output equals the original's (atol ${setup.tolerance.atol}, rtol ${setup.tolerance.rtol})`;
  const skip = (why: string): Setup['retrofit'] => ({ ids: new Set(), skip: why, criterion });
  if (!setup.checks.has('retrofit')) return skip('not selected (--checks)');
  if (!setup.trainLenKnown) return skip('needs the train length (the patch record has none)');
  const expected = scaleFromTrainLen(L);
  if (!record.sites.every((s) => s.s !== undefined && (Array.isArray(s.s) ? s.s : [s.s]).every((v) => Math.abs(v - expected) < 1e-9))) {
    return skip(`s is not 1/ln ${L} at every site: no length gives factor 1`);
  }
  if (L > plan.cap) return skip(`L = ${L} is beyond the longest runnable length ${plan.cap} (${plan.capReason})`);
  // Synthesised masks are all ones: padding counts equal the key count, causal-padding counts equal positions.
  const modes = [...new Set(record.sites.map((s) => withMasksOfOnes(s.n)))];
  if (modes.length !== 1) return skip('sites mix keys and causal n');
  if (modes[0] !== 'keys' && modes[0] !== 'causal') return skip(`n counted from masks (${modes[0]}): no length fixes every row's n`);
  if (record.preset !== 'ssmax') return skip(`preset ${record.preset}: parity at n = L is the ssmax retrofit's property`);
  const runs = retrofitRuns(plan, modes[0] as 'keys' | 'causal', L, {
    seqFree: setup.seqFree, pastFree: setup.pastFree, pinned: setup.pinned, batch: setup.pinned.batch ?? 1,
  });
  return typeof runs === 'string' ? skip(runs) : { ids: new Set(runs), criterion };
}

/** Synthesises the first run's inputs before any session exists, so input errors come first and fast. */
function validateSynthesis(setup: Setup): void {
  for (const spec of setup.plan.runs.filter((r) => r.kind === 'short').slice(0, 1)) {
    synthesize(setup.graph, setup.specs, spec, { fixed: setup.fixed, given: setup.given, padded: spec.padded });
  }
}

interface Collected {
  runs: RunReport[];
  wiring: RunResult[];
  retrofit: RunResult[];
  liveness: LivenessData;
  probes: Map<number, SiteProbe>;
  probeRuns: string[];
  points: SharpnessPoint[];
}

function sessionsFor(spec: RunSpec, setup: Setup, sessions: Sessions): SessionKey[] {
  const c = setup.checks;
  const keys: SessionKey[] = [];
  if (spec.kind === 'short') {
    const retrofit = setup.retrofit.ids.has(spec.id);
    if (c.has('wiring') || c.has('liveness') || retrofit) keys.push('original');
    if (c.has('wiring')) keys.push('unit');
    if (c.has('probe')) keys.push('probe');
    else if (c.has('liveness') || retrofit) keys.push('patched');
  } else {
    const pair = c.has('liveness') || c.has('sharpness') || setup.retrofit.ids.has(spec.id);
    const unitHere = c.has('wiring') && spec.kind === 'sweep' && spec.seq === setup.L;
    if (pair || unitHere) keys.push('original');
    if (pair) keys.push('patched');
    if (unitHere) keys.push('unit');
  }
  return keys.filter((k) => sessions.runners[k]);
}

function seedOf(id: string): number {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619);
  return h >>> 0;
}

async function execute(setup: Setup, sessions: Sessions, progress: (l: string) => void): Promise<Collected> {
  const others = setup.record.sites;
  const collected: Collected = {
    runs: [], wiring: [], retrofit: [], probeRuns: [], points: [],
    probes: new Map(others.filter(probeable).map((s) => [s.layer, new SiteProbe(s, others.filter(probeable))])),
    liveness: { longRuns: [], saturated: new Set(), finiteRuns: 0, nonFinite: [], errors: [], L: setup.L },
  };
  let sweepStopped = false;
  for (const spec of setup.plan.runs) {
    if (spec.kind === 'sweep' && sweepStopped) continue;
    const keys = sessionsFor(spec, setup, sessions);
    if (keys.length === 0) continue;
    progress(`verify: run ${spec.id}`);
    const feeds = synthesize(setup.graph, setup.specs, spec, { fixed: setup.fixed, given: setup.given, padded: spec.padded, seed: seedOf(spec.id) });
    const out: Partial<Record<SessionKey, Outputs>> = {};
    const errors: Partial<Record<SessionKey, string>> = {};
    const report: RunReport = { id: spec.id, kind: spec.kind, batch: spec.batch, seq: spec.seq, past: spec.past, padded: spec.padded, ms: {} };
    for (const key of keys) {
      const runner = sessions.runners[key]!;
      const start = performance.now();
      try {
        out[key] = await runner.run(feeds);
      } catch (e) {
        errors[key] = oneLine(e);
      }
      report.ms[runner.label] = Math.round(performance.now() - start);
    }
    if (Object.keys(errors).length) report.errors = Object.fromEntries(Object.entries(errors).map(([k, v]) => [sessions.runners[k as SessionKey]!.label, v]));
    collected.runs.push(report);
    if (errors.original) {
      if (spec === setup.plan.runs[0]) {
        throw new InputError(`the original model fails on the synthesised inputs (${spec.id}): ${errors.original}; set sizes with ${opt('dims', 'NAME=N')} or give inputs with ${opt('inputFiles', 'NAME=FILE')}`);
      }
      if (spec.kind === 'sweep') sweepStopped = true;
      setup.plan.notes.push(spec.kind === 'sweep'
        ? `the original model fails at length ${spec.seq}, so it and longer lengths were not compared: ${errors.original}`
        : `the original model fails at ${spec.id}, so that run was not compared: ${errors.original}`);
      continue;
    }
    observe(spec, setup, sessions, out, errors, collected);
  }
  return collected;
}

function pick(outputs: Outputs, names: string[]): Outputs {
  return Object.fromEntries(names.filter((n) => outputs[n]).map((n) => [n, outputs[n]]));
}

function observe(spec: RunSpec, setup: Setup, sessions: Sessions, out: Partial<Record<SessionKey, Outputs>>,
  errors: Partial<Record<SessionKey, string>>, c: Collected): void {
  const names = setup.modelOutputs;
  const length = { batch: spec.batch, seq: spec.seq, past: spec.past };
  const compare = (actual: Outputs, expected: Outputs): RunResult => {
    const outputs = names.filter((n) => expected[n]).map((n) => compareOutputs(pick(actual, [n]), pick(expected, [n]), toleranceFor(setup, n))[0]);
    return { run: spec.id, length, padded: spec.padded, outputs, passed: outputs.every((o) => o.passed) };
  };
  const failedRun = (error: string): RunResult => ({ run: spec.id, length, padded: spec.padded, outputs: [], passed: false, error });
  if (errors.unit) c.wiring.push(failedRun(`the factor-1 model fails: ${errors.unit}`));
  else if (out.unit && out.original) c.wiring.push(compare(out.unit, out.original));
  if (errors.probe) sessions.probeProblems.push(`${spec.id}: the patched model fails: ${errors.probe}`);
  if (out.probe) {
    c.probeRuns.push(spec.id);
    for (const p of sessions.probes) {
      c.probes.get(p.layer)!.observe(spec.id, out.probe[p.before], out.probe[p.after], p.masked ? out.probe[p.masked] : undefined);
    }
  }
  if (errors.patched) c.liveness.errors.push(`${spec.id}: the patched model fails where the original runs: ${errors.patched}`);
  const patchedOut = out.patched ?? out.probe;
  if (patchedOut && out.original) {
    const r = compare(patchedOut, out.original);
    c.liveness.finiteRuns++;
    for (const o of r.outputs.filter((x) => x.newNonFinite > 0)) {
      c.liveness.nonFinite.push(`${spec.id}: ${o.name} has ${o.newNonFinite} NaN/Inf values where the original's are finite`);
    }
    if (setup.retrofit.ids.has(spec.id)) c.retrofit.push(r);
    if (spec.kind === 'sweep' && spec.seq + spec.past > setup.L) c.liveness.longRuns.push(r);
  }
  if (spec.kind === 'sweep' && out.original && out.patched && sessions.rowMax.original.size && sessions.rowMax.patched.size) {
    const means = (o: Outputs, m: Map<number, string>): number[] => layerMeans(new Map([...m].map(([layer, name]) => [layer, o[name]])), spec.seq);
    const point = sharpnessPoint(spec.seq, means(out.original, sessions.rowMax.original), means(out.patched, sessions.rowMax.patched));
    c.points.push(point);
    if (point.original >= 0.99) c.liveness.saturated.add(spec.id);
  }
}

function toleranceFor(setup: Setup, output: string): Tolerance {
  return setup.lowPrecisionOutputs.has(output) && !setup.toleranceGiven ? { atol: 1e-2, rtol: 1e-2 } : setup.tolerance;
}

function assemble(setup: Setup, sessions: Sessions, c: Collected, started: number): VerifyReport {
  const checks: CheckResult[] = [];
  const selected = (id: CheckId): boolean => setup.checks.has(id);
  const notSelected = (id: CheckId, criterion: string): CheckResult => skippedCheck(id, criterion, 'not selected (--checks)');
  const t = setup.tolerance;
  checks.push(selected('wiring') ? parityCheck('wiring', CRITERIA.wiring(t), c.wiring, t, 'the factor-1 model equals the original') : notSelected('wiring', CRITERIA.wiring(t)));
  checks.push(selected('probe')
    ? probeCheck(CRITERIA.probe, [...c.probes.values()].map((p) => p.result()), sessions.probeProblems, c.probeRuns)
    : notSelected('probe', CRITERIA.probe));
  checks.push(setup.retrofit.skip ? skippedCheck('retrofit', setup.retrofit.criterion, setup.retrofit.skip)
    : parityCheck('retrofit', setup.retrofit.criterion, c.retrofit, t, 'equals the original'));
  const liveness = { ...c.liveness, longRuns: aliveRuns(c.liveness.longRuns, [...c.wiring, ...c.retrofit]) };
  checks.push(selected('liveness') ? livenessCheck(CRITERIA.liveness, liveness) : notSelected('liveness', CRITERIA.liveness));
  const { curve, why } = curveOf(setup, sessions, c.points);
  checks.push(selected('sharpness') ? sharpnessCheck(CRITERIA.sharpness, curve, why) : notSelected('sharpness', CRITERIA.sharpness));
  return {
    passed: checks.every((k) => k.status !== 'FAILED'),
    trainLen: setup.L,
    trainLenSource: setup.trainLenSource,
    tolerance: setup.tolerance,
    inputs: inputReports(setup),
    sweep: setup.plan.sweep,
    notes: setup.plan.notes,
    runs: c.runs,
    checks,
    sharpness: curve,
    sessions: Object.values(sessions.runners).map((r) => ({ label: r.label, createMs: Math.round(r.createMs), runMs: Math.round(r.runMs) })),
    totalMs: Math.round(performance.now() - started),
  };
}

function inputReports(setup: Setup): InputReport[] {
  return setup.specs.map((s) => ({
    name: s.name, type: elemTypeName(s.elemType), role: s.role,
    dims: s.dims.map((d) => ('value' in d ? d.value : 'param' in d ? d.param : null)),
    ...(setup.inputFiles[s.name] ? { file: setup.inputFiles[s.name] } : {}),
  }));
}

function curveOf(setup: Setup, sessions: Sessions, points: SharpnessPoint[]): { curve?: SharpnessCurve; why: string | null } {
  if (!setup.checks.has('sharpness')) return { why: null };
  if (sessions.rowMax.original.size === 0 || sessions.rowMax.patched.size === 0) {
    return { why: 'the attention Softmax nodes named in the patch record were not found' };
  }
  if (points.length < 2) return { why: `needs two or more lengths (${setup.plan.notes[0] ?? `ran ${points.length}`})` };
  const curve = sharpnessCurve(setup.L, points);
  if (curve.points[curve.points.length - 1].length <= setup.L) {
    return { why: `no length beyond L = ${setup.L} ran (${setup.plan.notes[0] ?? 'see the lengths option'})` };
  }
  return { curve, why: null };
}

function oneLine(e: unknown): string {
  return String((e as Error)?.message ?? e).split('\n')[0];
}

