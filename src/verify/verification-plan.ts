/**
 * A verification's plan as a plain value, before anything runs: each subject (the main pair, and each graph lifted
 * out of an operator into a pair of its own), its runs (lengths, the keys its rows see), and on each run which checks
 * read which session. `verify --dry-run` prints it; runVerification executes the same units.
 */
import type { ModelProto } from '../io/onnx';
import { InputError, rendered } from '../errors';
import { LIFTED_CHECKS, LiftedPair, liftedPairs } from './lift';
import type { FileVerifyOptions, VerifyOptions } from './options';
import type { RunShape } from '../analysis/signature';
import { estimatePeak } from './memory';
import { CHECK_IDS, CheckId } from './plan';
import type { RunIdentity } from './report';
import { SESSION_LABELS, SESSION_ORDER, SessionFactory } from './sessions';
import { unfusedModel } from '../rewrite/revert';
import { prepare, Setup } from './setup';
import { LivenessCheck } from './checks/liveness';
import { ProbeCheck } from './checks/probe';
import { RetrofitCheck } from './checks/retrofit';
import { SharpnessCheck } from './checks/sharpness';
import { CheckUnit, readersOf, UnitContext } from './checks/unit';
import { WiringCheck } from './checks/wiring';

/** The five checks as units, in the order the executor hands each run's outputs to them. */
export function checkUnits(ctx: UnitContext): { units: CheckUnit[]; sharpness: SharpnessCheck } {
  const sharpness = new SharpnessCheck(ctx);
  return { units: [new RetrofitCheck(ctx), new WiringCheck(ctx), new ProbeCheck(ctx), new LivenessCheck(ctx), sharpness], sharpness };
}

export interface PlannedRun extends RunIdentity {
  /** The most keys a row of this run sees. */
  keys: number;
  /** The run's peak memory as estimated before it runs (src/verify/memory.ts), when the attention's heads are known. */
  estimatedPeakBytes?: number;
  /** Per session it runs in (in the order sessions run), the checks that read its outputs. */
  reads: { session: string; checks: CheckId[] }[];
}

export interface SubjectPlan {
  /** `the main pair`, or how the lifted graph is named. */
  subject: string;
  /** Why this subject is not verified (a graph that cannot be lifted), instead of its runs. */
  notVerified?: string;
  trainLen?: number;
  trainLenSource?: string;
  checks: CheckId[];
  sweep: number[];
  /** The longest total length any run may have, and why. */
  cap?: number;
  capReason?: string;
  runs: PlannedRun[];
  notes: string[];
}

export interface VerificationPlan { subjects: SubjectPlan[] }

/** The runs of a setup, with what reads each, as runVerification would execute them. */
export function plannedRuns(setup: Setup, units: CheckUnit[]): PlannedRun[] {
  return setup.plan.runs.map((r) => ({
    id: r.id, kind: r.kind, batch: r.batch, seq: r.seq, past: r.past, padded: r.padded, keys: setup.keysOf(r),
    ...peakOf(setup, r),
    reads: SESSION_ORDER.map((key) => ({ session: SESSION_LABELS[key], checks: readersOf(setup, units, r, key).map((u) => u.id) }))
      .filter((x) => x.checks.length > 0),
  })).filter((r) => r.reads.length > 0);
}

function peakOf(setup: Setup, run: RunShape): { estimatedPeakBytes?: number } {
  const peak = estimatePeak(setup.memory, run);
  return peak ? { estimatedPeakBytes: peak.total } : {};
}

function subjectPlan(original: ModelProto, patched: ModelProto, options: FileVerifyOptions, subject: string): SubjectPlan {
  // As runVerification does: the checks read the plain-op form of fused sites, and the patch as written is compared with it.
  const plain = unfusedModel(patched);
  const setup = prepare(original, plain ?? patched, options);
  const factory = new SessionFactory(original, plain ?? patched, setup.sites, setup.checks.has('sharpness'), 'all', patched);
  try {
    const { units } = checkUnits({ setup, factory, notes: setup.plan.notes });
    return {
      subject, trainLen: setup.L, trainLenSource: setup.trainLenSource, checks: CHECK_IDS.filter((c) => setup.checks.has(c)), sweep: [...setup.plan.sweep],
      cap: setup.plan.cap, capReason: setup.plan.capReason, runs: plannedRuns(setup, units), notes: [...setup.plan.notes],
    };
  } finally {
    factory.cleanup();
  }
}

/**
 * The plan of a verification of `patched` against `original`: what verifyPatch would run, and no more; nothing is
 * run and no runtime is needed. Input errors (a dim the model does not have, an input it cannot take) are thrown as
 * verifyPatch throws them.
 */
export function planVerification(original: ModelProto, patched: ModelProto, options: VerifyOptions = {}): VerificationPlan {
  return planFor(original, patched, options, 'api');
}

/** planVerification with its messages naming options for `audience` (the command line names flags). */
export function planFor(original: ModelProto, patched: ModelProto, options: FileVerifyOptions, audience: 'api' | 'cli'): VerificationPlan {
  const main = subjectPlan(original, patched, options, 'the main pair');
  const checks = main.checks.filter((c) => LIFTED_CHECKS.includes(c));
  const lifted = checks.length ? liftedPairs(original, patched) : [];
  return rendered({ subjects: [main, ...lifted.map((l) => liftedPlan(l, checks, options))] }, audience);
}

/** A lifted graph's plan, with the outer verification's L and lengths (its dims and inputs name the outer model's inputs). */
function liftedPlan({ where, pair }: LiftedPair, checks: CheckId[], options: FileVerifyOptions): SubjectPlan {
  const none = (why: string): SubjectPlan => ({ subject: where, notVerified: why, checks: [], sweep: [], runs: [], notes: [] });
  if (typeof pair === 'string') return none(pair);
  const own = { checks, strict: false, dims: undefined, inputFiles: undefined, inputs: undefined, analysis: undefined };
  try {
    return subjectPlan(pair.original, pair.patched, { ...options, ...own }, `${where}, run on its own`);
  } catch (e) {
    if (e instanceof InputError) return none(`${where}, lifted into a model of its own, cannot run on synthesised inputs: ${e.message}`);
    throw e;
  }
}
