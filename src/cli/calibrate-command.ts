/**
 * `ssmax-patch calibrate MODEL --train-len L`: the slope preset with s chosen from the model's own attention
 * (calibrateSlope), written as a patched model, a JSON calibration report and an SVG of the statistic against n.
 */
import * as path from 'node:path';
import { Command } from 'commander';
import { CalibrationReport, MatchStatistic } from '../calibrate/report';
import { calibrateSlope, CalibrateOptions } from '../calibrate/calibrate';
import { calibrationSvg } from '../calibrate/report';
import { Granularity } from '../calibrate/stats';
import { InputError } from '../errors';
import { checkTarget, readModel, writeModelAsync } from '../io/model-file';
import { writeTextFile } from '../io/text-file';
import { ModelProto } from '../io/onnx';
import { onnxruntime } from '../onnxruntime';
import { N_OPTIONS, parseNOption } from '../policy/n-mode';
import { readTensorFile } from '../verify/tensor-files';
import { HostTensor } from '../verify/tensors';
import { collect, dimsValue, optionalInteger, optionalReal, pairs, rejectExtraArguments } from './parse';
import type { Warning } from '../policy/warnings';
import { CalibrateOutcome, documentOf, Verdict } from './outcome';
import { defaultOutput, EXTERNAL_DATA_HELP, linkWarnings, outputHint, warn, writeOptions } from './patch-command';
import { documentJson } from './report';
import { Run } from './run';
import { layersValue } from './values';
import { memoryValue, verifyProgress } from './verify-command';

export interface CalibrateCliOptions {
  trainLen?: string;
  maxLen?: string;
  match?: string;
  per?: string;
  input?: string[];
  dim?: string[];
  n: string;
  layers?: string;
  maxRuns?: string;
  maxMemory?: string;
  rope?: string;
  ropeScale?: string;
  output?: string;
  force?: boolean;
  report?: string;
  plot?: string;
  json?: boolean;
  externalData?: string;
  quiet?: boolean;
}

export function calibrateProgram(cmd: Command): Command {
  return cmd
    .description('Patch with the slope preset, 1 + s·max(0, ln n − ln L), choosing s so that attention at n ≈ N is as sharp as at n ≈ L (no labels, no training)')
    .argument('<model>', 'input ONNX model (never modified)')
    .option('--train-len <L>', 'the training length L (required): the factor is 1 up to it')
    .option('--max-len <N>', 'the length to calibrate for (default 8·L, less where one attention matrix would pass 2^27 values or the position table ends)')
    .option('--match <stat>', 'the statistic matched at n ≈ N to its value at n ≈ L: max-prob (mean largest attention probability, default) | entropy; or loss: the s of lowest next-token loss past L on the --input token ids')
    .option('--per <what>', 'one s per layer or per head of each layer (default: one s for the model)')
    .option('--input <name=file>', 'token ids [batch, T ≥ N] from a .npy, .json or .pb file, cut to each length (default: tokens drawn uniformly from the vocabulary)', collect)
    .option('--dim <name=size>', 'size of a named input dim (repeatable)', collect)
    .option('--n <mode>', `how n is computed: ${N_OPTIONS.join(' | ')}`, 'auto')
    .option('--layers <list>', 'patch only these attention layers: "3,7,11" or "every:4"')
    .option('--max-runs <k>', 'runs at N with a candidate s, at most (default 10)')
    .option('--max-memory <size>', 'no run estimated to need more memory, e.g. 3G (default half the memory free): N is cut to fit')
    .option('--rope <method>', 'rescale RoPE too (pi | ntk | yarn, as the patch does); with --match loss and no --rope-scale, the scale of lowest loss is searched first')
    .option('--rope-scale <F>', 'with --rope: the context it rescales for, as a multiple of L (default 16; searched by --match loss)')
    .option('-o, --output <file>', 'output model (default <name>.slope.onnx beside the input)')
    .option('--force', 'overwrite existing output files')
    .option('--report <file>', 'the JSON report (default <output>.calibration.json)')
    .option('--plot <file>', 'the statistic against n, before and after, as SVG (default <output>.calibration.svg)')
    .option('--json', 'print the JSON report on stdout (also on errors)')
    .option('--external-data <mode>', EXTERNAL_DATA_HELP)
    .option('--quiet', 'no progress line on stderr');
}

export async function calibrateCommand(args: string[], o: CalibrateCliOptions, run: Run): Promise<CalibrateOutcome> {
  rejectExtraArguments(args, 1, 'calibrate takes one model', outputHint('calibrate', args));
  const input = args[0];
  const output = defaultOutput(input, o.output, 'slope');
  const base = output.replace(/\.onnx$/i, '');
  const files = { report: o.report ?? `${base}.calibration.json`, plot: o.plot ?? `${base}.calibration.svg` };
  Object.assign(run.known, { input, target: output });
  const options = optionsFrom(o);
  const write = writeOptions(o, input);
  onnxruntime();
  // Before the runs: every file can be written, none overwrites the input, and none exists without --force.
  for (const f of [output, files.report, files.plot]) checkTarget(f, { force: o.force, protect: [input] });
  const original = readModel(input);
  const progress = verifyProgress(o.quiet);
  let result;
  try {
    result = await calibrateSlope(original, { ...options, inputs: givenInputs(original, o.input ?? []), progress });
  } finally {
    progress();
  }
  const { report } = result;
  // A calibration that reached no target writes its report and plot (what was measured) and no model.
  const verdict: Verdict = report.reached ? {} : { failure: { code: 'calibrate-failed', message: `calibration found no s: ${report.notes[0] ?? 'no group reached its target'}; no model written` } };
  Object.assign(run.known, { patch: result.patch, calibration: report, verdict });
  const written = report.reached ? await writeModelAsync(output, result.model, write) : null;
  const warnings: Warning[] = [];
  if (written) warn(warnings, linkWarnings(written));
  const outcome: CalibrateOutcome = { command: 'calibrate', input, target: output, patch: result.patch, calibration: report, warnings, verdict, written, files, lines: formatCalibration(report) };
  writeTextFile(files.plot, calibrationSvg(report, `Calibration: ${path.basename(input)}`), [input]);
  writeTextFile(files.report, documentJson(documentOf(outcome)), [input]);
  return outcome;
}

const GRANULARITY: Record<string, Granularity> = { layer: 'per-layer', head: 'per-head' };

function optionsFrom(o: CalibrateCliOptions): Omit<CalibrateOptions, 'inputs'> {
  const trainLen = optionalInteger(o.trainLen, '--train-len', 2);
  if (trainLen === undefined) throw new InputError('--train-len is required: the slope is 1 up to the training length', 'usage');
  if (o.match !== undefined && o.match !== 'max-prob' && o.match !== 'entropy' && o.match !== 'loss') throw new InputError(`--match must be max-prob, entropy or loss, got '${o.match}'`, 'usage');
  if (o.per !== undefined && !GRANULARITY[o.per]) throw new InputError(`--per must be layer or head, got '${o.per}'`, 'usage');
  const dims = dimsValue(o.dim ?? []);
  return {
    trainLen, targetLen: optionalInteger(o.maxLen, '--max-len', trainLen + 1), match: o.match as MatchStatistic | undefined,
    granularity: o.per === undefined ? 'global' : GRANULARITY[o.per], dims, n: parseNOption(o.n), layers: layersValue(o.layers),
    maxRuns: optionalInteger(o.maxRuns, '--max-runs', 1), maxMemory: memoryValue(o.maxMemory),
    rope: o.rope as CalibrateOptions['rope'], ropeScale: optionalReal(o.ropeScale, '--rope-scale'),
  };
}

/** `--input NAME=FILE`, read in the element type the model declares for NAME. */
function givenInputs(model: ModelProto, list: string[]): Record<string, HostTensor> {
  const inputs: Record<string, HostTensor> = {};
  for (const [name, file] of pairs(list, '--input', 'name=file')) {
    const decl = model.graph!.input.find((v) => v.name === name);
    if (!decl) throw new InputError(`--input ${name}: the model has no input '${name}'`, 'usage');
    inputs[name] = readTensorFile(file, name, decl.type?.tensorType?.elemType ?? 0);
  }
  return inputs;
}

const p3 = (x: number): string => x.toPrecision(3);

export function formatCalibration(r: CalibrationReport): string[] {
  if (r.match === 'loss') return formatLoss(r);
  const what = r.match === 'entropy' ? 'mean attention entropy' : 'mean max attention probability';
  const lines = [`calibrate: L = ${r.trainLen}, N = ${r.targetLen}, ${what}, ${r.granularity === 'global' ? 'one s' : r.granularity}; ${r.tokens} tokens, batch ${r.batch}`];
  for (const g of r.groups) {
    lines.push(`  ${g.group}  s = ${p3(g.s)}  ${g.state}  at n ≈ ${r.targetLen}: ${p3(g.beforeAtN)} → ${p3(g.afterAtN)} (target ${p3(g.target)}, the value at n ≈ ${r.trainLen}; residual ${(100 * g.residual).toFixed(2)} %)`);
  }
  lines.push(`  curve (before → after): ${r.curve.map((c) => `${c.length}: ${p3(c.before)} → ${p3(c.after)}`).join(', ')}`);
  for (const n of r.notes) lines.push(`  note: ${n}`);
  for (const u of r.unseen) lines.push(`  not read: ${u}`);
  lines.push(`calibrate: ${r.runs} runs in ${(r.totalMs / 1000).toFixed(1)} s`);
  return lines;
}

/** By loss: the s found, the loss past L before and with it, each s tried, and the loss per span. */
function formatLoss(r: CalibrationReport): string[] {
  const g = r.groups[0];
  const change = `${g.residual <= 0 ? '' : '+'}${(100 * g.residual).toFixed(2)} %`;
  const lines = [`calibrate: L = ${r.trainLen}, N = ${r.targetLen}, next-token loss past L, one s; given tokens, batch ${r.batch}`,
    `  s = ${p3(g.s)}  ${g.state}  loss past L (nats per token): ${g.beforeAtN.toFixed(4)} → ${g.afterAtN.toFixed(4)} (${change})`,
    ...(r.rope ? [`  RoPE ${r.rope.method} ×${r.rope.scale} of ${r.rope.tried.map((t) => `×${t.scale}: ${t.loss.toFixed(4)}`).join(', ')} (at s = 0)`] : []),
    `  tried: ${g.tried.map((t) => `s = ${p3(t.s)}: ${t.value.toFixed(4)}`).join(', ')}`,
    `  per span of keys seen (before → after): ${r.curve.map((c, k) => `${k === 0 ? r.trainLen : r.curve[k - 1].length}–${c.length}: ${c.before.toFixed(3)} → ${c.after.toFixed(3)}`).join(', ')}`];
  for (const n of r.notes) lines.push(`  note: ${n}`);
  lines.push(`calibrate: ${r.runs} runs in ${(r.totalMs / 1000).toFixed(1)} s`);
  return lines;
}
