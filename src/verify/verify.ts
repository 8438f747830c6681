/**
 * Proves on onnxruntime that a patch behaves, with five checks (checks/):
 *   1. wiring parity: with its factor forced to 1 the patched graph reproduces the original;
 *   2. semantic probe: at every site, wherever it is (a subgraph, a function's call, a fused operator's query),
 *      the values after the factor = the preset's factor × the values before it;
 *   3. retrofit parity: where the preset promises a factor of 1, the patch changes nothing;
 *   4. liveness: beyond that, the outputs differ from the original's, and nothing becomes NaN or Inf;
 *   5. attention sharpness: the patched model's largest attention probability does not fade like the original's.
 * The sites come from the patch record and its journal. With `strict`, anything left unverified (a skipped
 * check, a site that could not be seen, attention the patch refused) fails the verification.
 */
import { InputError, opt, rendered } from '../errors';
import { ModelProto } from '../io/onnx';
import { readRecord } from '../rewrite/record';
import { unfusedModel } from '../rewrite/revert';
import { FUSED_DOMAIN_OWNER, isFusedOwner } from '../rewrite/fuse-attention';
import { runtimeReport } from '../onnxruntime';
import { CheckId, CHECK_IDS } from './plan';
import type { FileVerifyOptions, VerifyOptions } from './options';
import { CheckResult, InputReport, RunReport, SessionReport, VerifyReport } from './report';
import { SessionFactory } from './sessions';
import { prepare, Setup } from './setup';
import { ruledDims } from '../analysis/signature';
import { SharpnessCurve } from './sharpness';
import { elemTypeName } from './tensors';
import { execute } from './execute';
import { Lifted, liftedChecks } from './lift';
import { failedParityRun, optimisationChanges } from './optimisation';
import { Optimization } from './run';
import { skippedCheck } from './checks/common';
import { CheckUnit } from './checks/unit';
import { checkUnits } from './verification-plan';

export { withUnitFactor } from './runtime-model';
export type { CheckResult, RunResult, Status, VerifyReport } from './report';
export type { CheckId } from './plan';
export type { FileVerifyOptions, VerifyOptions } from './options';

export async function verifyPatch(original: ModelProto, patched: ModelProto, options: VerifyOptions = {}): Promise<VerifyReport> {
  return runVerification(original, patched, options, 'api');
}

/** verifyPatch for the command line: input files, and messages that name options as flags. */
export async function verifyForCli(original: ModelProto, patched: ModelProto, options: FileVerifyOptions): Promise<VerifyReport> {
  return runVerification(original, patched, options, 'cli');
}

/**
 * The inputs cannot be synthesised (a lengths input, say): where onnxruntime cannot even load the original (a
 * kernel only another provider has), that is what to say; a file for the input would not help.
 */
async function prepareOrLoadError(original: ModelProto, patched: ModelProto, options: FileVerifyOptions): Promise<Setup> {
  try {
    return prepare(original, patched, options);
  } catch (e) {
    if (!(e instanceof InputError) || e.code !== 'cannot-verify') throw e;
    // A load failure of the original is an InputError of its own (originalLoadError), thrown from here.
    const factory = new SessionFactory(original, patched, [], false);
    try {
      await factory.release(await factory.openOriginal('all'));
    } finally {
      factory.cleanup();
    }
    throw e;
  }
}

/**
 * Prepares the plan once and executes it at onnxruntime's default optimisation level; where the original's own
 * outputs turn out to depend on that level, the same plan is executed again with every model at 'basic'.
 */
async function runVerification(original: ModelProto, patched: ModelProto, options: FileVerifyOptions, audience: 'api' | 'cli'): Promise<VerifyReport> {
  const started = performance.now();
  // Sites written as fused operators are read on their plain-op form; wiring parity runs the model as written.
  const plain = unfusedModel(patched);
  const setup = await prepareOrLoadError(original, plain ?? patched, options);
  const progress = options.progress ?? ((): void => undefined);
  const again = (o: ModelProto, p: ModelProto, opts: FileVerifyOptions): Promise<VerifyReport> => runVerification(o, p, opts, audience);
  const lifted = await liftedChecks(original, plain ?? patched, options, again, setup.sites.map((s) => s.label), setup.checks);
  const pair = { original, patched: plain ?? patched, written: patched, setup, lifted, progress, notes: plain ? [fusedNote(patched)] : [] };
  let done = await executePlan(pair, 'all');
  if (done.changed) {
    progress('verify: the original\'s outputs depend on onnxruntime\'s optimisation level: verifying again at \'basic\'');
    done = await executePlan(pair, 'basic', done.changed);
  }
  const { runs, checks, notes } = done;
  const report: VerifyReport = {
    passed: false, strictMode: setup.strict, unverified: unverified(setup, checks), preset: setup.record.preset, refusedAttention: [...setup.refused],
    trainLen: setup.L, trainLenSource: setup.trainLenSource, tolerance: setup.tolerance, inputs: inputReports(setup), sweep: [...setup.plan.sweep],
    notes, runs, checks, sharpness: done.curve, sessions: done.sessions, totalMs: Math.round(performance.now() - started),
    runtime: runtimeReport(),
  };
  report.passed = checks.every((c) => c.status !== 'FAILED') && (!setup.strict || report.unverified.length === 0);
  return rendered(report, audience);
}

interface PlanSubject {
  original: ModelProto;
  /** The patch the checks read (its plain-op form where it wrote fused operators). */
  patched: ModelProto;
  /** The patch as written: what wiring parity runs. */
  written: ModelProto;
  /** Notes for the report beside the plan's. */
  notes: string[];
  setup: Setup;
  lifted: Lifted;
  progress: (line: string) => void;
}

/** One execution of the plan: its runs, the checks' verdicts, and why to run it again at 'basic' (null: no need). */
interface Execution {
  runs: RunReport[];
  checks: CheckResult[];
  curve: SharpnessCurve | undefined;
  sessions: SessionReport[];
  notes: string[];
  changed: string | null;
}

/** Runs the plan with every model at `optimization`; `why` says why it is not the default level. */
async function executePlan(subject: PlanSubject, optimization: Optimization, why?: string): Promise<Execution> {
  const { original, patched, written, setup, lifted, progress } = subject;
  const factory = new SessionFactory(original, patched, setup.sites, setup.checks.has('sharpness'), optimization, written);
  factory.dropOutputs = new Set(setup.droppedOutputs);
  const notes = [...setup.plan.notes, ...subject.notes, ...(why ? [why] : [])];
  const { units, sharpness } = checkUnits({ setup, factory, lifted, notes });
  progress(`verify: L = ${setup.L} (${setup.trainLenSource}); ${setup.plan.runs.length} runs; lengths ${setup.plan.sweep.join(', ') || 'none'}`);
  try {
    const runs = await execute(setup, factory, units, notes, progress);
    const checks = judged(setup, units);
    const failed = optimization === 'all' ? failedParityRun(setup, checks) : undefined;
    const changed = failed ? await optimisationChanges(setup, factory, failed) : null;
    return { runs, checks, curve: sharpness.curve, sessions: factory.reports, notes, changed };
  } finally {
    factory.cleanup();
  }
}

/** What the report says of sites the patch wrote as fused operators: which model each check ran. */
function fusedNote(written: ModelProto): string {
  const record = readRecord(written);
  const count = record?.journal.filter((e) => isFusedOwner(e.owner) && e.owner !== FUSED_DOMAIN_OWNER).length ?? 0;
  const split = record?.cacheLayout?.length
    ? `; the model's caches are split (--cache-layout split): those runs fed it through Gather nodes splitting each stacked cache input of the original's interface and read it through a Concat stacking each present's halves, copies that cannot round`
    : '';
  const what = record?.cacheLayout?.length ? 'com.microsoft Attention with its cache split' : 'blocks in the form onnxruntime fuses';
  return `${count} site(s) are written as com.microsoft MultiHeadAttention (${what}): wiring parity ran the model as written with factor 1 `
    + '(the fused operators compute what the original\'s plain ops did) and at its real factor past L against the plain-op form of those sites, '
    + `on which the other checks read the same factors${split}`;
}

/** Each check's verdict, in check order (a check reads the verdicts before it); checks not selected are skipped. */
function judged(setup: Setup, units: CheckUnit[]): CheckResult[] {
  const done = new Map<CheckId, CheckResult>();
  for (const id of CHECK_IDS) {
    const unit = units.find((u) => u.id === id)!;
    done.set(id, setup.checks.has(id) ? unit.judge(done)
      : skippedCheck(id, unit.criterion, `not selected (${opt('checks')})`, 'not selected'));
  }
  return CHECK_IDS.map((id) => done.get(id)!);
}

/** Everything a strict verification fails on: checks skipped for lack of evidence, sites not seen, refused attention. */
function unverified(setup: Setup, checks: CheckResult[]): string[] {
  const out: string[] = [];
  for (const c of checks) {
    if (c.status === 'SKIPPED' && c.skip === 'not checked') out.push(`${c.name}: ${c.summary}`);
    for (const u of c.unchecked ?? []) out.push(`${c.name}: ${u}`);
  }
  return [...out, ...setup.refused];
}

function inputReports(setup: Setup): InputReport[] {
  return setup.specs.map((s) => {
    const sized = ruledDims(s);
    return {
      name: s.name, type: elemTypeName(s.elemType), role: s.role,
      dims: s.dims.map((d) => ('value' in d ? d.value : 'param' in d ? d.param : null)),
      ...(setup.inputFiles[s.name] ? { file: setup.inputFiles[s.name] } : {}),
      ...(sized.length ? { sized } : {}),
    };
  });
}

