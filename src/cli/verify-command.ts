/**
 * `ssmax-patch verify ORIGINAL PATCHED`, and the verification options `--verify` on patch shares with it:
 * parse them, run verifyPatch, print one line per check, write the JSON report and the sharpness plot.
 */
import * as path from 'node:path';
import { Command } from 'commander';
import { InputError } from '../errors';
import { readModel } from '../io/model-file';
import { checkWritable, writeTextFile } from '../io/text-file';
import { CHECK_IDS, CheckId } from '../verify/plan';
import { sharpnessSvg } from '../verify/plot';
import { VerifyOptions, VerifyReport, verifyPatch } from '../verify/verify';
import { VERSION } from '../version';
import { formatVerify } from './format';

export interface VerifyCliOptions {
  lengths?: string;
  maxLen?: string;
  batch?: string;
  checks?: string;
  atol?: string;
  rtol?: string;
  dim?: string[];
  input?: string[];
  report?: string;
  plot?: string;
  strict?: boolean;
}

const collect = (v: string, list: string[] = []): string[] => [...list, v];

/** Adds the options every verification takes (verify subcommand and patch --verify). */
export function addVerifyOptions(cmd: Command): Command {
  return cmd
    .option('--lengths <list>', 'context lengths of the sweep, comma-separated (default L/4,L/2,L,2L,4L,8L,16L)')
    .option('--max-len <n>', 'no run longer than n tokens (default 4096, or the model\'s position table if shorter)')
    .option('--batch <n>', 'batch size of the short runs (default 2: a plain and a padded item)')
    .option('--checks <list>', `checks to run, comma-separated: ${CHECK_IDS.join(',')} (default all)`)
    .option('--atol <x>', 'absolute tolerance of the parity checks (default 1e-4; 1e-2 for fp16/bf16 outputs)')
    .option('--rtol <x>', 'relative tolerance of the parity checks (default 1e-4; 1e-2 for fp16/bf16 outputs)')
    .option('--dim <name=size>', 'size of a named input dim, e.g. seq=128 or height=224 (repeatable)', collect)
    .option('--input <name=file>', 'an input tensor from a .npy, .json or ONNX TensorProto .pb file (repeatable)', collect)
    .option('--report <file>', 'write the full verification report as JSON')
    .option('--plot <file>', 'write the attention-sharpness curve as SVG')
    .option('--strict', 'fail when anything is left unverified: a skipped check, a site not probed, attention the patch refused');
}

function integer(v: string | undefined, flag: string, min: number): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (!Number.isInteger(x) || x < min) throw new InputError(`${flag}: expected an integer ≥ ${min}, got '${v}'`);
  return x;
}

function tolerance(v: string | undefined, flag: string): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (!Number.isFinite(x) || x < 0) throw new InputError(`${flag}: expected a number ≥ 0, got '${v}'`);
  return x;
}

function pairs(list: string[], flag: string, what: string): [string, string][] {
  return list.map((item) => {
    const eq = item.indexOf('=');
    if (eq <= 0 || eq === item.length - 1) throw new InputError(`${flag} ${item}: expected ${what}`);
    return [item.slice(0, eq), item.slice(eq + 1)];
  });
}

/** Parses the shared options; every bad value is an InputError naming its option. */
export function verifyOptionsFrom(o: VerifyCliOptions, trainLen?: number): VerifyOptions {
  const lengths = o.lengths?.split(',').map((v) => integer(v.trim(), '--lengths', 2)!);
  const checks = o.checks?.split(',').map((c) => c.trim());
  for (const c of checks ?? []) {
    if (!CHECK_IDS.includes(c as CheckId)) throw new InputError(`--checks: unknown check '${c}' (checks: ${CHECK_IDS.join(', ')})`);
  }
  const dims = Object.fromEntries(pairs(o.dim ?? [], '--dim', 'name=size').map(([k, v]) => [k, integer(v, `--dim ${k}`, 0)!]));
  const inputFiles = Object.fromEntries(pairs(o.input ?? [], '--input', 'name=file'));
  return {
    trainLen, lengths, maxLen: integer(o.maxLen, '--max-len', 2), batch: integer(o.batch, '--batch', 1),
    checks: checks as CheckId[] | undefined, atol: tolerance(o.atol, '--atol'), rtol: tolerance(o.rtol, '--rtol'), dims, inputFiles,
    strict: Boolean(o.strict), audience: 'cli',
  };
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

/** Checks, before any model runs, that the report and plot can be written and do not overwrite an input. */
export function checkVerifyOutputs(o: VerifyCliOptions, protect: string[]): void {
  if (o.report) checkWritable(o.report, protect);
  if (o.plot) checkWritable(o.plot, protect);
}

/** Writes --report and --plot; returns lines for the log. */
export function writeVerifyOutputs(report: VerifyReport, o: VerifyCliOptions, protect: string[], title: string): string[] {
  const lines: string[] = [];
  if (o.report) {
    writeTextFile(o.report, JSON.stringify({ tool: 'ssmax-patch', version: VERSION, ...report }, null, 2) + '\n', protect);
    lines.push(`report: ${o.report}`);
  }
  if (o.plot) {
    if (report.sharpness) {
      const s = report.sharpness;
      writeTextFile(o.plot, sharpnessSvg(s, { title, subtitle: `L = ${report.trainLen} · ${s.points[0].length} → ${s.points[s.points.length - 1].length} tokens: the original keeps ${percent(-s.originalFall)} of its sharpness, the patched model ${percent(-s.patchedFall)}`}), protect);
      lines.push(`plot: ${o.plot}`);
    } else {
      lines.push(`plot: not written (${report.checks.find((c) => c.id === 'sharpness')?.summary ?? 'no sharpness curve'})`);
    }
  }
  return lines;
}

const percent = (lnRatio: number): string => `${Math.round(Math.exp(lnRatio) * 100)} %`;

interface VerifyCommandOptions extends VerifyCliOptions {
  trainLen?: string;
  json?: boolean;
}

function verifyProgram(): Command {
  const cmd = new Command('ssmax-patch verify')
    .description('Check a model patched by ssmax-patch against its original on onnxruntime (exit 0 passed, 1 failed, 2 usage or input error)')
    .argument('<original>', 'the unpatched ONNX model')
    .argument('<patched>', 'the model ssmax-patch wrote')
    .option('--train-len <L>', 'the retrofit length L (default: from the patch record)')
    .option('--json', 'print the report as JSON on stdout instead of one line per check');
  return oneLineErrors(addVerifyOptions(cmd));
}

/** Commander errors become one line on stderr and an exception the caller turns into exit code 2. */
export function oneLineErrors(cmd: Command): Command {
  return cmd.exitOverride().configureOutput({ writeErr: (s) => process.stderr.write(s.split('\n')[0] + '\n') });
}

/** Runs `verify` with the arguments after the subcommand name; returns the exit code. */
export async function verifyCommand(argv: string[]): Promise<number> {
  const cmd = verifyProgram();
  cmd.parse(argv, { from: 'user' });
  const [originalFile, patchedFile] = cmd.args;
  const o = cmd.opts<VerifyCommandOptions>();
  const options = verifyOptionsFrom(o, integer(o.trainLen, '--train-len', 2));
  const protect = [originalFile, patchedFile];
  checkVerifyOutputs(o, protect);
  const progress = verifyProgress();
  let report: VerifyReport;
  try {
    report = await verifyPatch(readModel(originalFile), readModel(patchedFile), { ...options, progress });
  } finally {
    progress();
  }
  const written = writeVerifyOutputs(report, o, protect, `Attention sharpness: ${path.basename(patchedFile)}`);
  if (o.json) process.stdout.write(JSON.stringify({ tool: 'ssmax-patch', version: VERSION, ...report }, null, 2) + '\n');
  else process.stdout.write([...formatVerify(report), ...written].join('\n') + '\n');
  return report.passed ? 0 : 1;
}
