/**
 * The JSON document `--json` prints and `--report` writes, one per command, on success and on failure: a CI job
 * always gets the sites, the skipped nodes with their reasons, the warnings and the error. Its JSON Schema is
 * docs/report.schema.json; SCHEMA_VERSION changes when a field changes meaning or goes away.
 */
import type { CalibrationReport } from '../calibrate/report';
import type { SkippedSoftmax } from '../detect/find-attention';
import { ERROR_CODES, ErrorCode } from '../errors';
import type { Placement } from '../io/model-file';
import type { Stray } from '../io/sink';
import type { Warning } from '../policy/warnings';
import type { PatchedSite, PatchReport } from '../rewrite/patch';
import type { RevertedSite } from '../rewrite/revert';
import type { VerifyReport } from '../verify/verify';
import type { VerificationPlan } from '../verify/verification-plan';
import { VERSION } from '../version';

/** 2: error became {code, message} (it was the message alone). */
export const SCHEMA_VERSION = 2;

export type CommandName = 'patch' | 'verify' | 'revert' | 'calibrate';

/** A failure: its stable code (errors.ts ERROR_CODES, which gives the exit code) and the one line printed on stderr. */
export interface ReportError {
  code: ErrorCode;
  message: string;
}

interface DocumentBase {
  schemaVersion: typeof SCHEMA_VERSION;
  tool: 'ssmax-patch';
  version: string;
  command: CommandName;
  /** ok: exit 0. failed: a check failed, or --strict found a skip or a refused site (exit 1). error: exit 2, 3 or 4. */
  status: 'ok' | 'failed' | 'error';
  exitCode: number;
  /** Why status is not ok. */
  error?: ReportError;
  warnings: Warning[];
  /** --strict's verdict: passed only when no check failed and nothing was left unverified, else one line per failed check and per thing left. */
  strict?: { passed: boolean; failures: string[] };
}

export interface PatchDocument extends DocumentBase, Partial<Omit<PatchReport, 'sites' | 'skipped'>> {
  command: 'patch';
  input: string | null;
  /** Where the output goes (also with --dry-run, or when it was not written). */
  target: string | null;
  /** The file written, or null. */
  output: string | null;
  dryRun: boolean;
  sites: PatchedSite[];
  skipped: SkippedSoftmax[];
  verification?: VerifyReport;
  externalData?: { file: string; how: Placement }[];
  removedTemporaryFiles?: Stray[];
}

export interface VerifyDocument extends DocumentBase, Partial<VerifyReport> {
  command: 'verify';
  original: string | null;
  patched: string | null;
  /** Attention nodes of the original left unpatched (refused, not forced). */
  refused: SkippedSoftmax[];
  /** With --dry-run: what the verification would run (and nothing was run). */
  plan?: VerificationPlan;
}

export interface RevertDocument extends DocumentBase {
  command: 'revert';
  input: string | null;
  output: string | null;
  sites: RevertedSite[];
  hadRecord?: boolean;
  externalData?: { file: string; how: Placement }[];
  removedTemporaryFiles?: Stray[];
}

export interface CalibrateDocument extends DocumentBase {
  command: 'calibrate';
  input: string | null;
  /** Where the output goes, and the file written (null until it is). */
  target: string | null;
  output: string | null;
  /** The sites of the slope patch written, with the s found. */
  sites: PatchedSite[];
  calibration?: CalibrationReport;
  externalData?: { file: string; how: Placement }[];
  removedTemporaryFiles?: Stray[];
}

export type ReportDocument = PatchDocument | VerifyDocument | RevertDocument | CalibrateDocument;

function base<C extends CommandName>(command: C): DocumentBase & { command: C } {
  return { schemaVersion: SCHEMA_VERSION, tool: 'ssmax-patch', version: VERSION, command, status: 'ok', exitCode: 0, warnings: [] };
}

export function newDocument(command: CommandName): ReportDocument {
  if (command === 'verify') return { ...base('verify'), original: null, patched: null, refused: [] };
  if (command === 'revert') return { ...base('revert'), input: null, output: null, sites: [] };
  if (command === 'calibrate') return { ...base('calibrate'), input: null, target: null, output: null, sites: [] };
  return { ...base('patch'), input: null, target: null, output: null, dryRun: false, sites: [], skipped: [] };
}

/** Records a failure: its code sets the exit code; `message` is the stderr line. */
export function settle(doc: ReportDocument, code: ErrorCode, message: string): void {
  doc.exitCode = ERROR_CODES[code];
  doc.status = doc.exitCode === 1 ? 'failed' : 'error';
  doc.error = { code, message };
}

export const documentJson = (doc: ReportDocument): string => JSON.stringify(doc, null, 2) + '\n';
