/**
 * `ssmax-patch verify ORIGINAL PATCHED`, and the verification options `patch --verify` shares with it: parse
 * them, run verifyPatch, print one line per check, write the JSON report, the sharpness plot and JUnit XML.
 */
import * as path from 'node:path';
import { Command } from 'commander';
import type { SkippedSoftmax } from '../detect/find-attention';
import { InputError } from '../errors';
import { readModel } from '../io/model-file';
import { checkWritable, writeTextFile } from '../io/text-file';
import { onnxruntime } from '../onnxruntime';
import { trainLenWarnings } from '../policy/warnings';
import { readRecord, recordedLabel } from '../rewrite/record';
import { CHECK_IDS, CheckId } from '../verify/plan';
import { noCurveSvg, sharpnessSvg } from '../verify/plot';
import { parseSize } from '../verify/memory';
import { FileVerifyOptions, VerifyReport, verifyForCli } from '../verify/verify';
import { planFor } from '../verify/verification-plan';
import type { ModelProto } from '../io/onnx';
import { junitXml } from './junit';
import { collect, dimsValue, listValue, optionalInteger, optionalReal, pairs, rejectExtraArguments } from './parse';
import { documentOf, judge, VerifyOutcome } from './outcome';
import { documentJson, ReportDocument } from './report';
import { printWarnings, Run } from './run';
import { refusedOf } from './sites';
import { Analysis, analyseModel } from '../analysis/analyse';

export interface VerifyCliOptions {
  lengths?: string;
  maxLen?: string;
  maxMemory?: string;
  batch?: string;
  checks?: string;
  atol?: string;
  rtol?: string;
  dim?: string[];
  input?: string[];
  report?: string;
  plot?: string;
  junit?: string;
  strict?: boolean;
}

/** Adds the options every verification takes (verify subcommand and patch --verify). */
export function addVerifyOptions(cmd: Command): Command {
  return cmd
    .option('--lengths <list>', 'context lengths of the sweep, comma-separated (default L/4,L/2,L,2L,4L,8L,16L)')
    .option('--max-len <n>', 'no run longer than n tokens (default 4096, less where one attention matrix would pass 2^27 values; never past the model\'s position table)')
    .option('--max-memory <size>', 'no run estimated to need more memory, e.g. 3G or 512M (default half the memory free when verification starts)')
    .option('--batch <n>', 'batch size of the short runs (default 2: a plain and a padded item)')
    .option('--checks <list>', `checks to run, comma-separated: ${CHECK_IDS.join(',')} (default all)`)
    .option('--atol <x>', 'absolute tolerance of the parity checks (default 1e-4; 1e-2 for fp16/bf16 outputs)')
    .option('--rtol <x>', 'relative tolerance of the parity checks (default 1e-4; 1e-2 for fp16/bf16 outputs)')
    .option('--dim <name=size>', 'size of a named input dim, e.g. seq=128 or height=224 (repeatable)', collect)
    .option('--input <name=file>', 'an input tensor from a .npy, .json or ONNX TensorProto .pb file (repeatable)', collect)
    .option('--strict', 'fail (exit 1) when any check is SKIPPED or any attention node was refused')
    .option('--report <file>', 'write the JSON report (the document --json prints)')
    .option('--plot <file>', 'write the attention-sharpness curve as SVG')
    .option('--junit <file>', 'write JUnit XML: one test case per check (per site for the probe) and per refused attention node');
}

/** Parses the shared options; every bad value is an InputError naming its option. */
export function verifyOptionsFrom(o: VerifyCliOptions, trainLen?: number): FileVerifyOptions {
  const lengths = o.lengths === undefined ? undefined : listValue(o.lengths, '--lengths').map((v) => optionalInteger(v, '--lengths', 2)!);
  const checks = o.checks === undefined ? undefined : listValue(o.checks, '--checks');
  for (const c of checks ?? []) {
    if (!CHECK_IDS.includes(c as CheckId)) throw new InputError(`--checks: unknown check '${c}' (checks: ${CHECK_IDS.join(', ')})`, 'usage');
  }
  const dims = dimsValue(o.dim ?? []);
  const inputFiles = Object.fromEntries(pairs(o.input ?? [], '--input', 'name=file'));
  return {
    trainLen, lengths, maxLen: optionalInteger(o.maxLen, '--max-len', 2), maxMemory: memoryValue(o.maxMemory), batch: optionalInteger(o.batch, '--batch', 1),
    checks: checks as CheckId[] | undefined, atol: optionalReal(o.atol, '--atol', 0), rtol: optionalReal(o.rtol, '--rtol', 0), dims, inputFiles,
    strict: Boolean(o.strict),
  };
}

/** `--max-memory SIZE` in bytes. */
export function memoryValue(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const bytes = parseSize(text);
  if (bytes === null) throw new InputError(`--max-memory: '${text}' is not a size (bytes, or a number with K, M, G or T: 3G, 512M)`, 'usage');
  return bytes;
}

/** Show progress only once a verification has taken this long: short ones finish before a line is worth reading. */
const PROGRESS_AFTER_MS = 2000;

/**
 * Progress lines for a terminal (stderr, rewritten in place), shown once the verification has run for a few
 * seconds; nothing when stderr is not a terminal or with quiet. Call the result with no line to finish.
 */
export function verifyProgress(quiet = false, stream: { isTTY?: boolean; write(s: string): boolean } = process.stderr,
  after = PROGRESS_AFTER_MS): (line?: string) => void {
  if (quiet || !stream.isTTY) return () => undefined;
  const started = Date.now();
  let shown = false;
  return (line?: string) => {
    if (line === undefined) {
      if (shown) stream.write('\r\x1b[K');
      shown = false;
      return;
    }
    if (Date.now() - started < after) return;
    stream.write(`\r\x1b[K${line.slice(0, 160)}`);
    shown = true;
  };
}

/** verifyPatch with a progress line on the terminal, cleared when it ends. */
export async function verifyWithProgress(original: ModelProto, patched: ModelProto, options: FileVerifyOptions, quiet = false): Promise<VerifyReport> {
  const progress = verifyProgress(quiet);
  try {
    return await verifyForCli(original, patched, { ...options, progress });
  } finally {
    progress();
  }
}

/**
 * Before any model is read: the runtime is there, and the report, plot and JUnit files can be written without
 * overwriting an input.
 */
export function prepareVerification(o: VerifyCliOptions, protect: string[]): void {
  onnxruntime();
  for (const file of [o.report, o.plot, o.junit]) if (file) checkWritable(file, protect);
}

export interface Artifacts {
  verification: VerifyReport;
  refused: SkippedSoftmax[];
  /** The plot's title. */
  title: string;
  /** The JUnit test suite's name. */
  suite: string;
}

/** Writes --report, --plot and --junit once the verdict is settled; returns lines for the log. */
export function writeArtifacts(doc: ReportDocument, a: Artifacts, o: VerifyCliOptions, protect: string[]): string[] {
  const lines: string[] = [];
  if (o.report) {
    writeTextFile(o.report, documentJson(doc), protect);
    lines.push(`report: ${o.report}`);
  }
  if (o.plot) {
    const s = a.verification.sharpness;
    if (s) {
      const subtitle = `L = ${a.verification.trainLen} · ${s.points[0].length} → ${s.points[s.points.length - 1].length} tokens: the original keeps ${percent(-s.originalFall)} of its sharpness, the patched model ${percent(-s.patchedFall)}`;
      writeTextFile(o.plot, sharpnessSvg(s, { title: a.title, subtitle }), protect);
      lines.push(`plot: ${o.plot}`);
    } else {
      const why = a.verification.checks.find((c) => c.id === 'sharpness')?.summary ?? 'the check did not run';
      writeTextFile(o.plot, noCurveSvg(a.title, why), protect);
      lines.push(`plot: ${o.plot} (no curve: ${why})`);
    }
  }
  if (o.junit) {
    writeTextFile(o.junit, junitXml(a.suite, a.verification, a.refused, Boolean(o.strict)), protect);
    lines.push(`junit: ${o.junit}`);
  }
  return lines;
}

const percent = (lnRatio: number): string => `${Math.round(Math.exp(lnRatio) * 100)} %`;

export function verifyProgram(cmd: Command): Command {
  return addVerifyOptions(cmd
    .description('Check a model patched by ssmax-patch against its original on onnxruntime (exit 0 passed; 1 a check failed, or with --strict one was skipped or a site refused; 2 usage or input error)')
    .argument('<original>', 'the unpatched ONNX model')
    .argument('<patched>', 'the model ssmax-patch wrote')
    .option('--train-len <L>', 'the retrofit length L (default: from the patch record)')
    .option('--json', 'print the JSON report on stdout instead of one line per check')
    .option('--dry-run', 'print the verification plan (each pair verified, its runs and which check reads which session on each) and run nothing'));
}

/** Runs `verify` (or with --dry-run plans it); returns what it found. */
export async function verifyCommand(args: string[], o: VerifyCliOptions & { trainLen?: string; dryRun?: boolean }, run: Run): Promise<VerifyOutcome> {
  rejectExtraArguments(args, 2, 'verify takes two models: the original and the patched one');
  const [originalFile, patchedFile] = args;
  const known = run.known as Partial<VerifyOutcome>;
  Object.assign(known, { original: originalFile, patched: patchedFile });
  const trainLen = optionalInteger(o.trainLen, '--train-len', 2);
  const options = verifyOptionsFrom(o, trainLen);
  const protect = [originalFile, patchedFile];
  if (o.dryRun) return dryRun(originalFile, patchedFile, o, options);
  prepareVerification(o, protect);
  const original = readModel(originalFile);
  const patched = readModel(patchedFile);
  const record = readRecord(patched);
  const warnings = known.warnings = trainLen !== undefined && record && record.preset !== 'slope' ? trainLenWarnings(trainLen, record.sites.map((r) => ({ node: recordedLabel(r), s: r.s }))) : [];
  printWarnings(warnings);
  // Refused in the original and not forced into the patch: left as they were.
  const analysis = analysed(original);
  const refused = known.refused = refusedOf(analysis?.detection.skipped ?? []).filter((k) => !record?.sites.some((r) => recordedLabel(r) === k.node));
  const verification = await verifyWithProgress(original, patched, { ...options, analysis });
  const outcome: VerifyOutcome = { command: 'verify', original: originalFile, patched: patchedFile, warnings, refused, verification, verdict: judge(verification, ''), artifacts: [] };
  const artifacts = writeArtifacts(documentOf(outcome), { verification, refused, title: `Attention sharpness: ${path.basename(patchedFile)}`, suite: `ssmax-patch verify ${patchedFile}` }, o, protect);
  return { ...outcome, artifacts };
}

/** `verify --dry-run`: the plan; no runtime is needed and nothing runs or is written. */
function dryRun(originalFile: string, patchedFile: string, o: VerifyCliOptions, options: FileVerifyOptions): VerifyOutcome {
  const writes = (['report', 'plot', 'junit', 'strict'] as const).filter((k) => o[k] !== undefined).map((k) => `--${k}`);
  if (writes.length) throw new InputError(`--dry-run runs nothing, so it takes no ${writes.join(', ')}`, 'usage');
  const original = readModel(originalFile);
  const plan = planFor(original, readModel(patchedFile), { ...options, analysis: analysed(original) }, 'cli');
  return { command: 'verify', original: originalFile, patched: patchedFile, warnings: [], refused: [], plan, verdict: {}, artifacts: [] };
}

/** The original's analysis for the report being assembled; an unreadable graph is verification's to report, in its words. */
function analysed(model: ModelProto): Analysis | undefined {
  try {
    return analyseModel(model);
  } catch {
    return undefined;
  }
}
