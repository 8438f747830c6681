/** The ssmax-patch command line: parse options, patch, optionally verify, write, report. */
import * as path from 'node:path';
import { Command, CommanderError } from 'commander';
import { InputError, SsmaxError, VerificationError } from '../errors';
import { readModel, writeModel } from '../io/model-file';
import { parseNOption } from '../policy/n-mode';
import { patchModel, PatchReport } from '../rewrite/patch';
import { verifyPatch, VerifyReport } from '../verify/verify';
import { VERSION } from '../version';
import { formatPatch, formatVerify } from './format';
import { addVerifyOptions, checkVerifyOutputs, verifyCommand, VerifyCliOptions, verifyOptionsFrom, writeVerifyOutputs } from './verify-command';

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
  b?: string;
  floorScale?: string;
  attnScale?: string;
  layers?: string;
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
    .option('--preset <name>', 'factor: ssmax (s·ln n) | qwen-logn (max(1, ln n / ln L)) | llama4', 'ssmax')
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
    .option('--force-site <name>', 'patch this refused attention node anyway, accepting its stated deviation (repeatable)', collect, []);
  return addVerifyOptions(cmd)
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s.split('\n')[0] + '\n') });
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
  const n = parseNOption(o.n);
  const trainLen = number(o.trainLen, '--train-len', true);
  const verifyOptions = verifyOptionsFrom(o, trainLen);
  if (!o.verify && (o.report || o.plot)) throw new InputError('--report and --plot need --verify');
  const output = o.output ?? defaultOutput(input);
  checkVerifyOutputs(o, [input, output]);
  const original = readModel(input);
  const { model, report } = patchModel(original, {
    n, s: number(o.s, '--s'), trainLen, sFile: o.sFile, updateS: o.updateS, force: o.forceSite, preset: o.preset,
    b: number(o.b, '--b'), floorScale: number(o.floorScale, '--floor-scale'), attnScale: number(o.attnScale, '--attn-scale'),
    layers: o.layers,
  });
  let verification: VerifyReport | undefined;
  if (o.verify) verification = await verifyPatch(original, model, verifyOptions);
  const written = !o.dryRun && (!verification || verification.passed);
  if (written) writeModel(output, model, { force: o.force, protect: [input] });
  const files = verification ? writeVerifyOutputs(verification, o, [input, output], `Attention sharpness: ${path.basename(input)}`) : [];
  print(report, verification, o.json ? 'json' : 'text', written ? output : null, files);
  if (verification && !verification.passed) throw new VerificationError('verification FAILED: output not written');
  return 0;
}

function print(report: PatchReport, verification: VerifyReport | undefined, mode: 'json' | 'text', output: string | null, files: string[]): void {
  if (mode === 'json') {
    process.stdout.write(JSON.stringify({ output, ...report, verification }, null, 2) + '\n');
    return;
  }
  const lines = formatPatch(report);
  if (verification) lines.push(...formatVerify(verification), ...files);
  lines.push(output ? `wrote ${output}` : 'nothing written');
  process.stdout.write(lines.join('\n') + '\n');
}

/** Runs the CLI and returns the exit code; all expected failures end here as one line on stderr. */
export async function main(argv: string[]): Promise<number> {
  const cmd = program();
  try {
    if (argv[0] === 'verify') return await verifyCommand(argv.slice(1));
    cmd.parse(argv, { from: 'user' });
    return await patchCommand(cmd.args[0], cmd.opts<CliOptions>());
  } catch (err) {
    if (err instanceof CommanderError) {
      return err.code === 'commander.helpDisplayed' || err.code === 'commander.version' ? 0 : 2;
    }
    if (err instanceof SsmaxError) {
      process.stderr.write(`ssmax-patch: ${err.message}\n`);
      return err.exitCode;
    }
    process.stderr.write(`ssmax-patch: internal error: ${(err as Error)?.message ?? err}\n`);
    return 3;
  }
}
