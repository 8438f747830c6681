/** The verification report: what ran, each check's verdict with its numbers, and the sharpness curve. */
import type { RuntimeReport } from '../onnxruntime';
import { OutputStats, Tolerance } from './compare';
import { CheckId } from './plan';
import { ProbeSiteResult } from './probe';
import { SharpnessCurve } from './sharpness';
import { InputRole } from '../analysis/signature';

export type Status = 'PASSED' | 'FAILED' | 'SKIPPED';

/**
 * Why a check (or a site of it) was skipped: not asked for (--checks), a property this patch does not promise
 * (neither counts against --strict), or something that could not be looked at (fails --strict).
 */
export type SkipKind = 'not selected' | 'not applicable' | 'not checked';

export interface RunResult {
  run: string;
  length: { batch: number; seq: number; past: number };
  padded: boolean;
  outputs: OutputStats[];
  passed: boolean;
  error?: string;
}

export interface CheckResult {
  id: CheckId;
  name: string;
  status: Status;
  /** One line for the CI log: the verdict's numbers, or what is wrong, or why it was skipped. */
  summary: string;
  /** What the check requires. */
  criterion: string;
  runs: RunResult[];
  /** Why a SKIPPED check was skipped. */
  skip?: SkipKind;
  /** Sites (or parts) this check could not look at, each with the reason: each fails --strict. */
  unchecked?: string[];
  /** Sites this check does not apply to, each with the reason (a key count the model fixes, say). */
  notApplicable?: string[];
  /** Semantic probe: one entry per site. */
  sites?: ProbeSiteResult[];
}

export interface InputReport {
  name: string;
  type: string;
  dims: (string | number | null)[];
  role: InputRole;
  /** The file it was read from, when given with --input. */
  file?: string;
  /** How dims the rules do not recognise by name were sized (`dim 1 'tq': the sequence length`). */
  sized?: string[];
}

/** A run as the plan and the report name it: its id, what it is for, its lengths. */
export interface RunIdentity {
  id: string;
  /** Short runs feed wiring and the probe; sweep runs feed retrofit, liveness and sharpness; retrofit runs reach n = L. */
  kind: 'short' | 'sweep' | 'retrofit';
  batch: number;
  seq: number;
  past: number;
  padded: boolean;
}

export interface RunReport extends RunIdentity {
  /** Milliseconds per session that ran it. */
  ms: Record<string, number>;
  /** The run's peak memory as estimated before it ran (src/verify/memory.ts), when the attention's heads are known. */
  estimatedPeakBytes?: number;
  errors?: Record<string, string>;
}

export interface SessionReport {
  label: string;
  createMs: number;
  runMs: number;
}

export interface VerifyReport {
  /** No check failed, and with strict, nothing was left unverified. */
  passed: boolean;
  /** Whether the verification ran with strict (then `passed` also needs `unverified` empty). */
  strictMode: boolean;
  /** Everything left unverified: skipped checks, unprobed sites, refused attention (each fails --strict). */
  unverified: string[];
  /** The preset the patch was made with, as its record says. */
  preset: string;
  /** Attention in the original that the patch refused (each fails --strict). */
  refusedAttention: string[];
  trainLen?: number;
  /** Where L came from: the patch record, --train-len, or the length at which the mean s gives factor 1. */
  trainLenSource: string;
  tolerance: Tolerance;
  inputs: InputReport[];
  sweep: number[];
  notes: string[];
  runs: RunReport[];
  checks: CheckResult[];
  sharpness?: SharpnessCurve;
  sessions: SessionReport[];
  totalMs: number;
  /** The onnxruntime package the sessions ran on. */
  runtime: RuntimeReport;
}
