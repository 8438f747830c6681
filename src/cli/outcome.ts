/**
 * What a command did, as a plain value: each command returns its outcome, and present() alone maps one to the JSON
 * document (--json, --report), the lines of the text report and the exit code. A command that fails part-way leaves
 * what it had established in Run.known, which the same mapping turns into the failure's document.
 */
import type { CalibrationReport } from '../calibrate/report';
import type { SkippedSoftmax } from '../detect/find-attention';
import type { ErrorCode } from '../errors';
import type { WriteReport } from '../io/model-file';
import type { Warning } from '../policy/warnings';
import type { PatchReport } from '../rewrite/patch';
import type { RevertReport } from '../rewrite/revert';
import type { VerifyReport } from '../verify/verify';
import type { VerificationPlan } from '../verify/verification-plan';
import { formatPatch, formatPlan, formatRevert, formatVerify, formatWrite } from './format';
import { CalibrateDocument, newDocument, PatchDocument, ReportDocument, RevertDocument, settle, VerifyDocument } from './report';

/** A finished verification judged: --strict's record, and the failure that sets the exit code, if any. */
export interface Verdict {
  strict?: { passed: boolean; failures: string[] };
  failure?: { code: ErrorCode; message: string };
}

export interface PatchOutcome {
  command: 'patch';
  input: string;
  target: string;
  dryRun: boolean;
  /** Set when detection ran but patchModel refused: the skipped nodes, for the failure's report. */
  skipped?: SkippedSoftmax[];
  patch: PatchReport;
  warnings: Warning[];
  verification?: VerifyReport;
  verdict: Verdict;
  written: WriteReport | null;
  /** A line per file --report, --plot and --junit wrote. */
  artifacts: string[];
}

export interface VerifyOutcome {
  command: 'verify';
  original: string;
  patched: string;
  warnings: Warning[];
  /** Attention nodes of the original left unpatched (refused, not forced). */
  refused: SkippedSoftmax[];
  /** `--dry-run`: the plan, and nothing run. */
  plan?: VerificationPlan;
  verification?: VerifyReport;
  verdict: Verdict;
  artifacts: string[];
}

export interface RevertOutcome {
  command: 'revert';
  input: string;
  revert: RevertReport;
  written: WriteReport;
  warnings: Warning[];
}

export interface CalibrateOutcome {
  command: 'calibrate';
  input: string;
  target: string;
  patch: PatchReport;
  calibration: CalibrationReport;
  warnings: Warning[];
  verdict: Verdict;
  written: WriteReport | null;
  /** The report and plot files, always written. */
  files: { report: string; plot: string };
  /** The calibration's own lines (its table), made where its report is read. */
  lines: string[];
}

export type Outcome = PatchOutcome | VerifyOutcome | RevertOutcome | CalibrateOutcome;

/** An outcome under way: what a failure's document can still say. */
export type Known = Partial<Outcome>;

export interface Presented {
  doc: ReportDocument;
  /** The text report; printed instead of the document without --json. */
  lines: string[];
  exitCode: number;
}

/** The document, text lines and exit code of an outcome. */
export function present(outcome: Outcome): Presented {
  const doc = documentOf(outcome);
  return { doc, lines: linesOf(outcome), exitCode: doc.exitCode };
}

/** The JSON document of a finished or partial outcome of `command`. */
export function documentOf(outcome: Known, command = outcome.command ?? 'patch'): ReportDocument {
  if (command === 'verify') return verifyDocument(outcome as Partial<VerifyOutcome>);
  if (command === 'revert') return revertDocument(outcome as Partial<RevertOutcome>);
  if (command === 'calibrate') return calibrateDocument(outcome as Partial<CalibrateOutcome>);
  return patchDocument(outcome as Partial<PatchOutcome>);
}

/**
 * A verification's verdict: a failed check fails it; with --strict anything left unverified does too, and its
 * record lists every failure. `consequence` ends the failure's line (": output not written").
 */
export function judge(report: VerifyReport, consequence: string): Verdict {
  // The strict gate fails on a failed check as well as on anything left unverified, so its verdict is the exit code's.
  const failed = report.checks.filter((c) => c.status === 'FAILED').map((c) => `${c.name} FAILED: ${c.summary}`);
  const strict = report.strictMode ? { passed: report.passed, failures: [...failed, ...report.unverified] } : undefined;
  if (failed.length) return { strict, failure: { code: 'verify-failed', message: `verification FAILED${consequence}` } };
  if (strict?.failures.length) {
    const more = strict.failures.length > 1 ? ` and ${strict.failures.length - 1} more` : '';
    return { strict, failure: { code: 'strict-failed', message: `--strict: ${strict.failures[0]}${more}${consequence}` } };
  }
  return { strict };
}

export const strictLines = (verdict: Verdict | undefined): string[] => {
  const s = verdict?.strict;
  return s ? [`strict: ${s.passed ? 'PASSED' : `FAILED (${s.failures.join('; ')})`}`] : [];
};

function applyVerdict(doc: ReportDocument, verdict: Verdict | undefined): void {
  if (verdict?.strict) doc.strict = verdict.strict;
  if (verdict?.failure) settle(doc, verdict.failure.code, verdict.failure.message);
}

function applyWrite(doc: PatchDocument | RevertDocument | CalibrateDocument, written: WriteReport | null | undefined): void {
  doc.output = written?.output ?? null;
  if (!written) return;
  doc.externalData = written.externalData;
  if (written.removedTemporaryFiles.length) doc.removedTemporaryFiles = written.removedTemporaryFiles;
}

// The field order of each document is the order its fields were first filled in before outcomes existed: reports
// compared byte for byte (fixture fingerprints, the corpus net) stay the same.
function patchDocument(o: Partial<PatchOutcome>): PatchDocument {
  const doc = newDocument('patch') as PatchDocument;
  if (o.input !== undefined) Object.assign(doc, { input: o.input, target: o.target ?? null, dryRun: Boolean(o.dryRun) });
  if (o.patch) Object.assign(doc, o.patch);
  else if (o.skipped) doc.skipped = o.skipped;
  doc.warnings = o.warnings ?? [];
  if (o.verification) doc.verification = o.verification;
  applyVerdict(doc, o.verdict);
  applyWrite(doc, o.written);
  return doc;
}

function verifyDocument(o: Partial<VerifyOutcome>): VerifyDocument {
  const doc = newDocument('verify') as VerifyDocument;
  Object.assign(doc, { original: o.original ?? null, patched: o.patched ?? null });
  doc.warnings = o.warnings ?? [];
  if (o.plan) doc.plan = o.plan;
  if (o.refused) doc.refused = o.refused;
  if (o.verification) Object.assign(doc, o.verification);
  applyVerdict(doc, o.verdict);
  return doc;
}

function revertDocument(o: Partial<RevertOutcome>): RevertDocument {
  const doc = newDocument('revert') as RevertDocument;
  if (o.input !== undefined) doc.input = o.input;
  if (o.revert) Object.assign(doc, o.revert);
  doc.warnings = o.warnings ?? [];
  applyWrite(doc, o.written);
  return doc;
}

function calibrateDocument(o: Partial<CalibrateOutcome>): CalibrateDocument {
  const doc = newDocument('calibrate') as CalibrateDocument;
  if (o.input !== undefined) Object.assign(doc, { input: o.input, target: o.target ?? null });
  doc.warnings = o.warnings ?? [];
  if (o.patch && o.calibration) Object.assign(doc, { sites: o.patch.sites, calibration: o.calibration });
  applyVerdict(doc, o.verdict);
  applyWrite(doc, o.written);
  return doc;
}

function linesOf(o: Outcome): string[] {
  if (o.command === 'patch') {
    return [
      ...formatPatch(o.patch, o.dryRun),
      ...(o.verification ? [...formatVerify(o.verification), ...strictLines(o.verdict), ...o.artifacts] : []),
      ...formatWrite(o.written, o.dryRun),
    ];
  }
  if (o.command === 'verify') return o.plan ? formatPlan(o.plan) : [...formatVerify(o.verification!), ...strictLines(o.verdict), ...o.artifacts];
  if (o.command === 'revert') return [...formatRevert(o.revert), ...formatWrite(o.written)];
  return [...formatPatch(o.patch), ...o.lines, ...(o.written ? formatWrite(o.written) : []), `report: ${o.files.report}`, `plot: ${o.files.plot}`];
}
