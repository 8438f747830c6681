/** The ssmax-patch command line: parse options, patch, optionally verify, write, report. */
import * as path from 'node:path';
import { Command, CommanderError } from 'commander';
import { InputError, SsmaxError, VerificationError } from '../errors';
import { ExternalDataMode, readModel, writeModel, WriteOptions, WriteReport } from '../io/model-file';
import { terminalProgress } from '../io/progress';
import { parseNOption } from '../policy/n-mode';
import { patchModel, PatchReport } from '../rewrite/patch';
import { revertModel } from '../rewrite/revert';
import type { VerifyReport } from '../verify/verify';
import { VERSION } from '../version';
import { explainCommand } from './explain';
import { formatPatch, formatRevert, formatVerify, formatWrite } from './format';
import { addVerifyOptions, checkVerifyOutputs, oneLineErrors, verifyCommand, VerifyCliOptions, verifyOptionsFrom, writeVerifyOutputs } from './verify-command';

interface CliOptions extends VerifyCliOptions {
  output?: string;
  force?: boolean;
  n: string;
  s?: string;
  trainLen?: string;
  sFile?: string;
  updateS?: boolean;
  dryRun?: boolean;
  json?: boolean;
  verify?: boolean;
  forceSite: string[];
  preset?: string;
  prior?: string;
  priorFile?: string;
  b?: string;
  floorScale?: string;
  attnScale?: string;
  layers?: string;
  externalData?: string;
  quiet?: boolean;
  sortNodes?: boolean;
  explain?: string;
}

const collect = (v: string, all: string[]): string[] => [...all, v];

function program(): Command {
  const cmd = new Command('ssmax-patch')
    .description('Retrofit Scalable-Softmax (softmax((s·ln n)·z)) into the attention of an ONNX model')
    .version(VERSION)
    .argument('<model>', 'input ONNX model (never modified)')
    .option('-o, --output <file>', 'output model (default <name>.ssmax.onnx beside the input)')
    .option('--force', 'overwrite an existing output file')
    .option('--n <mode>', 'how n is computed: auto | keys | causal | mask', 'auto')
    .option('--preset <name>', 'factor: ssmax (s·ln n) | qwen-logn (max(1, ln n / ln L)) | llama4 | none (a prior alone)', 'ssmax')
    .option('--prior <name>', 'add a positional prior to the logits: ggd (BAM, neutral θ = 0) | alibi')
    .option('--prior-file <file>', 'JSON {"theta_alpha": …, "theta_beta": …, "theta_mu": …}: number | [per head] | [[per head] per layer]')
    .option('--b <x>', 'ssmax bias variant: factor s·ln n + b')
    .option('--floor-scale <x>', 'llama4 preset floor_scale (default 8192)')
    .option('--attn-scale <x>', 'llama4 preset attn_scale (default 0.1)')
    .option('--layers <list>', 'patch only these attention layers: "3,7,11" or "every:4" (0-based; every:4 = 3,7,11,...)')
    .option('--s <x>', 'one s for every layer and head')
    .option('--train-len <L>', 's = 1/ln L: the factor is exactly 1 at n = L')
    .option('--s-file <file>', 'JSON {"s": x | [per head] | [[per head] per layer]}')
    .option('--update-s', 'on an already patched model, replace s instead of refusing')
    .option('--dry-run', 'report what would be patched; write nothing')
    .option('--json', 'print the report as JSON on stdout')
    .option('--verify', 'run original and patched on onnxruntime and check the patch (see also: ssmax-patch verify --help)')
    .option('--force-site <name>', 'patch this refused attention node anyway, accepting its stated deviation (repeatable)', collect, [])
    .option('--external-data <mode>', 'output in another folder: link | copy | reference (default: link, else copy)')
    .option('--sort-nodes', 'accept nodes out of topological order and write them sorted')
    .option('--quiet', 'no progress line on stderr')
    .option('--explain <node>', 'print the detection rules tried on this node (name, label or glob with *) and exit; writes nothing')
    .addHelpText('after', '\nTo remove a patch: ssmax-patch revert <patched.onnx> [-o out.onnx] (see ssmax-patch revert --help)');
  return oneLineErrors(addVerifyOptions(cmd));
}

function number(v: string | undefined, flag: string, integer = false): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (!Number.isFinite(x) || (integer && !Number.isInteger(x))) throw new InputError(`${flag}: not a${integer ? 'n integer' : ' number'}: '${v}'`);
  return x;
}

function defaultOutput(input: string): string {
  const dir = path.dirname(input);
  return path.join(dir, `${path.basename(input).replace(/\.onnx$/i, '')}.ssmax.onnx`);
}

async function patchCommand(input: string, o: CliOptions): Promise<number> {
  if (o.explain !== undefined) return explainCommand(input, o.explain);
  const n = parseNOption(o.n);
  const trainLen = number(o.trainLen, '--train-len', true);
  const verifyOptions = verifyOptionsFrom(o, trainLen);
  if (!o.verify && (o.report || o.plot)) throw new InputError('--report and --plot need --verify');
  const output = o.output ?? defaultOutput(input);
  checkVerifyOutputs(o, [input, output]);
  const write = writeOptions(o, input);
  const original = readModel(input);
  const { model, report } = patchModel(original, {
    n, s: number(o.s, '--s'), trainLen, sFile: o.sFile, updateS: o.updateS, force: o.forceSite, preset: o.preset,
    prior: o.prior, priorFile: o.priorFile, b: number(o.b, '--b'), floorScale: number(o.floorScale, '--floor-scale'), attnScale: number(o.attnScale, '--attn-scale'),
    layers: o.layers, sortNodes: o.sortNodes,
  });
  let verification: VerifyReport | undefined;
  if (o.verify) {
    // Loaded only when asked for: onnxruntime costs start-up time and memory a plain patch does not need.
    const { verifyPatch } = await import('../verify/verify');
    verification = await verifyPatch(original, model, verifyOptions);
  }
  const written = !o.dryRun && (!verification || verification.passed) ? writeModel(output, model, write) : null;
  const files = verification ? writeVerifyOutputs(verification, o, [input, output], `Attention sharpness: ${path.basename(input)}`) : [];
  print(report, verification, o.json ? 'json' : 'text', written, files);
  if (verification && !verification.passed) throw new VerificationError('verification FAILED: output not written');
  return 0;
}

function writeOptions(o: CliOptions, input: string): WriteOptions {
  const modes = ['reference', 'copy', 'link'];
  if (o.externalData !== undefined && !modes.includes(o.externalData)) {
    throw new InputError(`--external-data must be reference, copy or link, got '${o.externalData}'`);
  }
  return { force: o.force, protect: [input], externalData: o.externalData as ExternalDataMode | undefined, progress: terminalProgress({ quiet: o.quiet }) };
}

function print(report: PatchReport, verification: VerifyReport | undefined, mode: 'json' | 'text', written: WriteReport | null, files: string[]): void {
  if (mode === 'json') {
    const output = written?.output ?? null;
    process.stdout.write(JSON.stringify({ output, ...report, verification, externalData: written?.externalData }, null, 2) + '\n');
    return;
  }
  const lines = formatPatch(report);
  if (verification) lines.push(...formatVerify(verification), ...files);
  lines.push(...formatWrite(written));
  process.stdout.write(lines.join('\n') + '\n');
}

/** `ssmax-patch revert PATCHED [-o OUT]`: removes the patch, giving back the original model. */
function revertProgram(): Command {
  const cmd = new Command('ssmax-patch revert')
    .description('Remove an SSMax patch: the result computes exactly what the original model computed')
    .argument('<model>', 'patched ONNX model (never modified)')
    .option('-o, --output <file>', 'output model (default <name>.reverted.onnx beside the input)')
    .option('--force', 'overwrite an existing output file')
    .option('--json', 'print the report as JSON on stdout')
    .option('--external-data <mode>', 'output in another folder: link | copy | reference (default: link, else copy)')
    .option('--sort-nodes', 'accept nodes out of topological order and write them sorted')
    .option('--quiet', 'no progress line on stderr');
  return oneLineErrors(cmd);
}

function revertCommand(input: string, o: CliOptions): number {
  const output = o.output ?? path.join(path.dirname(input), `${path.basename(input).replace(/(\.ssmax)?\.onnx$/i, '')}.reverted.onnx`);
  const write = writeOptions(o, input);
  const { model, report } = revertModel(readModel(input), { sortNodes: o.sortNodes });
  const written = writeModel(output, model, write);
  if (o.json) process.stdout.write(JSON.stringify({ output: written.output, ...report, externalData: written.externalData }, null, 2) + '\n');
  else process.stdout.write([...formatRevert(report), ...formatWrite(written)].join('\n') + '\n');
  return 0;
}

/** Runs the CLI and returns the exit code; all expected failures end here as one line on stderr. */
export async function main(argv: string[]): Promise<number> {
  const revert = argv[0] === 'revert';
  const cmd = revert ? revertProgram() : program();
  try {
    if (argv[0] === 'verify') return await verifyCommand(argv.slice(1));
    cmd.parse(revert ? argv.slice(1) : argv, { from: 'user' });
    if (revert) return revertCommand(cmd.args[0], cmd.opts<CliOptions>());
    return await patchCommand(cmd.args[0], cmd.opts<CliOptions>());
  } catch (err) {
    if (err instanceof CommanderError) {
      return err.code === 'commander.helpDisplayed' || err.code === 'commander.version' ? 0 : 2;
    }
    if (err instanceof SsmaxError) {
      process.stderr.write(`ssmax-patch: ${err.cliMessage}\n`);
      return err.exitCode;
    }
    process.stderr.write(`ssmax-patch: internal error: ${(err as Error)?.message ?? err}\n`);
    return 3;
  }
}
