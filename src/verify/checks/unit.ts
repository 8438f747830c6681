/**
 * A verification check as a unit: which sessions it reads on which runs, what it takes from each run's outputs,
 * and how it judges what it saw. verifyPatch composes the five (wiring, probe, retrofit, liveness, sharpness);
 * the executor runs each session once over every run some unit needs it for.
 */
import { compareOutputs, Tolerance } from '../compare';
import { CheckId, RunSpec } from '../plan';
import { CheckResult, RunResult } from '../report';
import { Outputs } from '../run';
import { SessionFactory, SessionKey } from '../sessions';
import { Setup } from '../setup';
import { Lifted } from '../lift';

/** One session's outcome on one run: its outputs, or why it failed. */
export type Outcome = { outputs: Outputs } | { error: string };

export interface CheckUnit {
  readonly id: CheckId;
  /** What the check requires, as the report states it. */
  readonly criterion: string;
  /** The sessions this check reads on `run` ('original' when it compares with the original's outputs). */
  sessions(run: RunSpec): SessionKey[];
  /** One session's outcome on one run, with the original's outputs of that run when it ran. */
  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void;
  /** The verdict of a selected check, from what it saw and the verdicts judged before it (in check order). */
  judge(done: ReadonlyMap<CheckId, CheckResult>): CheckResult;
}

/** What every unit may read: the setup, the session factory (what each probe copy brings out). */
export interface UnitContext {
  setup: Setup;
  factory: SessionFactory;
  /** Sites in graphs lifted out of an operator (lift.ts): their probe results and their graphs' verdicts, by site index. */
  lifted?: Lifted;
  /** The notes of this execution: the plan's, then what running found (the executor adds to them). */
  notes: readonly string[];
}

/** The executor's note where the original failed at a length of the sweep, which ended the sweep there. */
export function sweepEndNote(length: number, error: string): string {
  return `${SWEEP_END} ${length}, so it and longer lengths were not compared: ${error}`;
}

/** The note sweepEndNote wrote, if the executor wrote one. */
export function sweepEnd(notes: readonly string[]): string | undefined {
  return notes.find((n) => n.startsWith(SWEEP_END));
}

const SWEEP_END = 'the original model fails at length';

/** The selected checks that read `key`'s outputs on `run`: what the executor hands them, and what the plan prints. */
export function readersOf(setup: Setup, units: readonly CheckUnit[], run: RunSpec, key: SessionKey): CheckUnit[] {
  return units.filter((u) => setup.checks.has(u.id) && u.sessions(run).includes(key));
}

/** Every model output of a run against the original's, each with its own tolerance (wider for fp16/bf16). */
export function compareRun(setup: Setup, run: RunSpec, actual: Outputs, expected: Outputs): RunResult {
  const outputs = setup.modelOutputs.filter((n) => expected[n]).map((n) => compareOutputs({ [n]: actual[n] }, { [n]: expected[n] }, toleranceFor(setup, n))[0]);
  return { run: run.id, length: { batch: run.batch, seq: run.seq, past: run.past }, padded: run.padded, outputs, passed: outputs.every((o) => o.passed) };
}

export function failedRun(run: RunSpec, error: string): RunResult {
  return { run: run.id, length: { batch: run.batch, seq: run.seq, past: run.past }, padded: run.padded, outputs: [], passed: false, error };
}

function toleranceFor(setup: Setup, output: string): Tolerance {
  return setup.lowPrecisionOutputs.has(output) && !setup.toleranceGiven ? { atol: 1e-2, rtol: 1e-2 } : setup.tolerance;
}
