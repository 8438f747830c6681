/** `ssmax-patch patch MODEL` (also `ssmax-patch MODEL`): patch, warn, optionally verify, write, report. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Command } from 'commander';
import { Analysis, analyseModel, withForce } from '../analysis/analyse';
import { Detection, explainNode } from '../detect/find-attention';
import { InputError } from '../errors';
import { externalFiles, isInside } from '../io/external';
import { checkTarget, ExternalDataMode, readModel, writeModelAsync, WriteOptions, WriteReport } from '../io/model-file';
import type { ModelProto } from '../io/onnx';
import { terminalProgress } from '../io/progress';
import { N_OPTIONS, NOption, parseNOption } from '../policy/n-mode';
import { lengthWarnings, nModeWarnings, trainLenWarnings, Warning } from '../policy/warnings';
import { patchModel, PatchOptions, PatchReport, PatchResult } from '../rewrite/patch';
import { revertModel } from '../rewrite/revert';
import { checkLoads } from '../verify/load-check';
import type { FileVerifyOptions, VerifyReport } from '../verify/verify';
import { formatExplain } from './format';
import { documentOf, judge, PatchOutcome, Verdict } from './outcome';
import { collect, optionalInteger, optionalReal, rejectExtraArguments } from './parse';
import { layersValue, presetValue, priorFileValue, priorValue, sFileValue } from './values';
import { printWarnings, Run } from './run';
import { expandForceSites, refusedOf, siteCausality } from './sites';
import { addVerifyOptions, prepareVerification, VerifyCliOptions, verifyOptionsFrom, verifyWithProgress, writeArtifacts } from './verify-command';

export interface PatchCliOptions extends VerifyCliOptions {
  output?: string;
  force?: boolean;
  n: string;
  s?: string;
  trainLen?: string;
  sFile?: string;
  updateS?: boolean;
  allowNoOp?: boolean;
  fusedAttention?: string;
  cacheLayout?: string;
  dryRun?: boolean;
  verify?: boolean;
  forceSite?: string[];
  preset?: string;
  prior?: string;
  priorFile?: string;
  window?: string;
  sinks?: string;
  rope?: string;
  ropeScale?: string;
  b?: string;
  floorScale?: string;
  attnScale?: string;
  layers?: string;
  externalData?: string;
  quiet?: boolean;
  explain?: string;
}

export function patchProgram(cmd: Command): Command {
  return addVerifyOptions(cmd
    .description('Retrofit Scalable-Softmax (softmax((s·ln n)·z)) into the attention of an ONNX model')
    .argument('<model>', 'input ONNX model (never modified)')
    .option('-o, --output <file>', 'output model (default <name>.ssmax.onnx beside the input)')
    .option('--force', 'overwrite an existing output file')
    .option('--n <mode>', `how n is computed: ${N_OPTIONS.join(' | ')}`, 'auto')
    .option('--preset <name>', 'factor: ssmax (s·ln n) | qwen-logn (max(1, ln n / ln L)) | llama4 | slope (1 + s·max(0, ln n − ln L)) | none (a prior alone); default ssmax, or with --update-s the patch\'s own')
    .option('--prior <name>', 'add a positional prior to the logits: ggd (BAM, neutral θ = 0) | alibi')
    .option('--prior-file <file>', 'JSON {"theta_alpha": …, "theta_beta": …, "theta_mu": …}: number | [per head] | [[per head] per layer]')
    .option('--window <W>', 'add a causal sliding window: keys W or more positions older than the row are hidden, and n counts the keys it leaves')
    .option('--sinks <S>', 'with --window: the first S keys stay visible at every row (attention sinks, as StreamingLLM keeps them; default 0)')
    .option('--rope <method>', 'rescale the model\'s RoPE for a longer context: pi (position interpolation) | ntk (NTK-aware base scaling) | yarn (needs --train-len)')
    .option('--rope-scale <F>', 'with --rope: the context it rescales for, as a multiple of the training length (default 16)')
    .option('--b <x>', 'ssmax bias variant: factor s·ln n + b')
    .option('--floor-scale <x>', 'llama4 preset floor_scale (default 8192)')
    .option('--attn-scale <x>', 'llama4 preset attn_scale (default 0.1)')
    .option('--layers <list>', 'patch only these attention layers: "3,7,11" or "every:4" (0-based; every:4 = 3,7,11,...)')
    .option('--s <x>', 'one s for every layer and head')
    .option('--train-len <L>', 's = 1/ln L: the factor is exactly 1 at n = L (with --s or --s-file: the training length, recorded)')
    .option('--s-file <file>', 'JSON {"s": x | [per head] | [[per head] per layer]}')
    .option('--update-s', 'on an already patched model, replace s instead of refusing')
    .option('--allow-no-op', 'write a patch that changes no output at any length the model can run (fixed lengths where the factor is 1), refused otherwise')
    .option('--fused-attention <m>', 'auto (default): plain-op attention that onnxruntime fuses at session start is written as com.microsoft MultiHeadAttention, so it stays fused | off: keep plain ops (a model for another runtime)')
    .option('--cache-layout <l>', 'stacked (default): keep the model\'s caches | split: com.microsoft Attention\'s stacked past/present [2, B, N, T, H] become key and value halves, so decoding runs fused too (changes the model\'s inputs and outputs; docs/factor.md)')
    .option('--dry-run', 'report what would be patched; write nothing')
    .option('--json', 'print the JSON report on stdout (also on errors)')
    .option('--verify', 'run original and patched on onnxruntime and check the patch before writing (see ssmax-patch verify --help)')
    .option('--force-site <name>', 'patch refused attention anyway, accepting its stated deviation: a node name, a glob (* and ?) or all (repeatable)', collect)
    .option('--external-data <mode>', EXTERNAL_DATA_HELP)
    .option('--quiet', 'no progress line on stderr')
    .option('--explain <node>', 'print the detection rules tried on this node (name, label or glob with *) and exit; writes nothing'));
}

const sentence = (items: string[]): string => (items.length > 1 ? `${items.slice(0, -1).join(', ')} and ${items[items.length - 1]}` : items[0]);

/**
 * Patches, warns, optionally verifies, loads and writes; returns what it did. What is known so far stays in
 * run.known, for the report of a failure part-way.
 */
export async function patchCommand(args: string[], o: PatchCliOptions, run: Run): Promise<PatchOutcome | null> {
  if (o.explain !== undefined) return explain(args, o, run);
  const known = run.known as Partial<PatchOutcome>;
  const plan = planPatch(args, o, known);
  const original = readModel(plan.input);
  const warnings: Warning[] = known.warnings = [];
  const { model, report, analysis } = patchOrExplain(original, o, plan, known);
  known.patch = report;
  warn(warnings, warningsFor(original, report, analysis.detection, o, plan));
  const verification = o.verify ? await verifyBeforeWriting(original, model, report, analysis, plan, o.quiet) : undefined;
  const verdict: Verdict = verification ? judge(verification, ': output not written') : {};
  Object.assign(known, { verification, verdict });
  const writing = !verdict.failure && !o.dryRun;
  if (writing) warn(warnings, await loadsBeforeWriting(original, model));
  const written = writing ? await writeModelAsync(plan.output, model, plan.write) : null;
  known.written = written;
  if (written) warn(warnings, linkWarnings(written));
  const outcome: PatchOutcome = { command: 'patch', input: plan.input, target: plan.output, dryRun: Boolean(o.dryRun), patch: report, warnings, verification, verdict, written, artifacts: [] };
  if (!verification) return outcome;
  const artifacts = writeArtifacts(documentOf(outcome), {
    verification, refused: refusedOf(report.skipped), title: `Attention sharpness: ${path.basename(plan.input)}`, suite: `ssmax-patch patch ${plan.input}`,
  }, o, [plan.input, plan.output]);
  return { ...outcome, artifacts };
}

/** Adds warnings to the outcome's and prints them as they arise, before a long verification or write. */
export function warn(to: Warning[], warnings: Warning[]): void {
  to.push(...warnings);
  printWarnings(warnings);
}

/** --explain prints a trace and writes nothing: options that patch, verify or write would be ignored. */
function explain(args: string[], o: PatchCliOptions, run: Run): null {
  rejectExtraArguments(args, 1, 'patch takes one model');
  const others = Object.keys(o).filter((k) => k !== 'explain' && !(k === 'n' && o.n === 'auto'));
  if (others.length) throw new InputError(`--explain prints the rules tried on a node and writes nothing: it takes no other option (got ${others.map(flag).join(', ')})`, 'usage');
  run.printed = true;
  process.stdout.write(formatExplain(explainNode(readModel(args[0]), o.explain!)).join('\n') + '\n');
  return null;
}

const flag = (key: string): string => `--${key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;

interface PatchPlan {
  input: string;
  output: string;
  n: NOption;
  trainLen?: number;
  /** The library's options from the flags and files (--force-site patterns are expanded once the model is read). */
  values: PatchOptions;
  verifyOptions: FileVerifyOptions;
  write: WriteOptions;
}

/** `-o FILE`, else `<name>.<kind>.onnx` beside the input (`strip`: what of the input's name the kind replaces). */
export function defaultOutput(input: string, output: string | undefined, kind = 'ssmax', strip = /\.onnx$/i): string {
  return output ?? path.join(path.dirname(input), `${path.basename(input).replace(strip, '')}.${kind}.onnx`);
}

/** The options addVerifyOptions adds: on patch, each matters only with --verify. */
const VERIFY_ONLY = addVerifyOptions(new Command()).options.map((o) => ({ key: o.attributeName() as keyof VerifyCliOptions, flag: o.long! }));

/**
 * What `ssmax-patch in.onnx out.onnx` probably meant: -o out.onnx, unless out.onnx exists, when it is more likely a
 * second model to patch, which -o would overwrite.
 */
export function outputHint(command: 'patch' | 'revert' | 'calibrate', args: string[]): string {
  if (args.length !== 2) return '';
  if (!fs.existsSync(args[1])) return ` (the output file is given with -o ${args[1]})`;
  return ` (${args[1]} exists, so it is not taken for the output: ${command} one model per command; -o names a new output file)`;
}

/** Arguments and option values, all checked before any model is read. */
function planPatch(args: string[], o: PatchCliOptions, known: Partial<PatchOutcome>): PatchPlan {
  rejectExtraArguments(args, 1, 'patch takes one model', outputHint('patch', args));
  const input = args[0];
  const output = defaultOutput(input, o.output);
  Object.assign(known, { input, target: output, dryRun: Boolean(o.dryRun) });
  const n = parseNOption(o.n);
  const trainLen = optionalInteger(o.trainLen, '--train-len', 2);
  const values = patchValues(o, n, trainLen);
  const verifyOptions = verifyOptionsFrom(o, trainLen);
  const needVerify = VERIFY_ONLY.filter((v) => o[v.key] !== undefined).map((v) => v.flag);
  if (!o.verify && needVerify.length) throw new InputError(`${sentence(needVerify)} ${needVerify.length > 1 ? 'need' : 'needs'} --verify`, 'usage');
  const write = writeOptions(o, input);
  // The write refuses these too, but only after patching and verifying: a verification can take minutes.
  if (!o.dryRun) checkTarget(output, write);
  if (o.verify) prepareVerification(o, [input, output]);
  return { input, output, n, trainLen, values, verifyOptions, write };
}

/** Flags and files as the library's typed options. */
function patchValues(o: PatchCliOptions, n: NOption, trainLen: number | undefined): PatchOptions {
  if (o.s !== undefined && o.sFile !== undefined) throw new InputError('--s and --s-file are exclusive: give one', 'usage');
  const s = o.sFile !== undefined ? sFileValue(o.sFile) : optionalReal(o.s, '--s');
  const theta = o.priorFile !== undefined ? priorFileValue(o.priorFile) : undefined;
  return {
    n, s, sSource: o.sFile !== undefined ? `--s-file ${o.sFile}` : undefined, trainLen, updateS: o.updateS, preset: o.preset === undefined ? undefined : presetValue(o.preset),
    prior: priorValue(o.prior), theta, thetaSource: o.priorFile,
    window: optionalInteger(o.window, '--window', 1), sinks: optionalInteger(o.sinks, '--sinks', 0),
    rope: o.rope as PatchOptions['rope'], ropeScale: optionalReal(o.ropeScale, '--rope-scale'),
    b: optionalReal(o.b, '--b'), floorScale: optionalReal(o.floorScale, '--floor-scale'), attnScale: optionalReal(o.attnScale, '--attn-scale'),
    layers: layersValue(o.layers), allowNoOp: o.allowNoOp,
    // patchModel checks the value (auto | off) and names the flag in its error.
    fusedAttention: o.fusedAttention as PatchOptions['fusedAttention'],
    cacheLayout: o.cacheLayout as PatchOptions['cacheLayout'],
  };
}

/**
 * patchModel on the model analysed here once (detection runs again only to force refused sites a --force-site
 * pattern names), the analysis reused for the warnings and verification; when it refuses, the document still lists
 * every skipped node and why, for --json.
 */
function patchOrExplain(original: ModelProto, o: PatchCliOptions, plan: PatchPlan, known: Partial<PatchOutcome>): PatchResult {
  let analysis: Analysis | undefined;
  try {
    analysis = analyseModel(original);
    const force = expandForceSites(o.forceSite ?? [], analysis.detection);
    warn(known.warnings!, force.empty.map((p) => ({ code: 'force-site-none', message: `--force-site ${p}: no refused attention node to force` })));
    analysis = withForce(analysis, force.names);
    return patchModel(original, { ...plan.values, force: force.names, analysis });
  } catch (e) {
    known.skipped = analysis?.detection.skipped ?? [];
    throw e;
  }
}

/** Refuses to write a patch onnxruntime does not load (load-check.ts); warns where it refuses the original too. */
async function loadsBeforeWriting(original: ModelProto, model: ModelProto): Promise<Warning[]> {
  const check = await checkLoads(original, model);
  if (check.status === 'no-runtime') {
    return [{
      code: 'load-not-checked',
      message: `the patched model was not loaded in onnxruntime before writing: that check needs onnxruntime-node (${check.reason}); docs/install.md installs it`,
    }];
  }
  if (check.status !== 'original-refused') return [];
  return [{
    code: 'original-does-not-load',
    message: `onnxruntime refuses the original model too (${check.reason}): whether the patched model loads was not checked`,
  }];
}

/** Verification (and --strict) before anything is written. */
async function verifyBeforeWriting(
  original: ModelProto, model: ModelProto, report: PatchReport, analysis: Analysis, plan: PatchPlan, quiet?: boolean,
): Promise<VerifyReport> {
  // An update replaces s of an existing patch: what it must be compared with is the input without that patch.
  const baseline = report.updated ? revertModel(original).model : original;
  return verifyWithProgress(baseline, model, { ...plan.verifyOptions, ...(report.updated ? {} : { analysis }) }, quiet);
}

function warningsFor(original: ModelProto, report: PatchReport, detection: Detection, o: PatchCliOptions, plan: PatchPlan): Warning[] {
  const warnings: Warning[] = [];
  // Causality is only questioned where the user overrode auto.
  if (plan.n !== 'auto' && !report.updated) warnings.push(...nModeWarnings(plan.n, siteCausality(detection, report.sites)));
  // The slope's L is where its factor leaves 1, whatever s: s·ln L says nothing there.
  if (plan.trainLen !== undefined && (o.s !== undefined || o.sFile !== undefined) && plan.values.preset !== 'slope') warnings.push(...trainLenWarnings(plan.trainLen, report.sites));
  if (o.externalData === 'reference') warnings.push(...referenceWarnings(original, plan.output));
  warnings.push(...lengthWarnings(report.lengths));
  return warnings;
}

/** onnxruntime refuses data locations outside the model's folder (1.30); `reference` may write exactly that. */
function referenceWarnings(model: ModelProto, output: string): Warning[] {
  const dir = path.dirname(path.resolve(output));
  const outside = externalFiles(model).filter((f) => f.file !== path.resolve(dir, f.location) && !isInside(dir, f.file));
  if (outside.length === 0) return [];
  const rel = outside.map((f) => path.relative(dir, f.file));
  return [{
    code: 'external-data-reference',
    message: `--external-data reference: the output refers to ${rel.join(', ')}, outside its folder; onnxruntime 1.30 refuses to load such a model (use --external-data link or copy)`,
  }];
}

/** A hard-linked data file is the input's own: what a later write through the output does to the input. */
export function linkWarnings(written: WriteReport): Warning[] {
  const linked = written.externalData.filter((e) => e.how === 'linked' || e.how === 'already there');
  if (linked.length === 0) return [];
  const names = linked.map((e) => path.relative(path.dirname(path.resolve(written.output)), e.file));
  return [{
    code: 'external-data-link',
    message: `--external-data link: ${names.join(', ')} beside the output ${linked.length > 1 ? 'are hard links' : 'is a hard link'} to the input's data: `
      + 'a later write through the output (a save that appends to it, as onnx.save_model with save_as_external_data to the same location does) '
      + 'changes the input\'s data too; without the option the output gets data of its own',
  }];
}

export const EXTERNAL_DATA_HELP = 'output in another folder than its input: copy (default: data files of its own, copy-on-write clones where the file '
  + 'system has them) | link (hard links to the input\'s: a write through one changes the other) | reference (the input\'s, by relative path)';

export function writeOptions(o: Pick<PatchCliOptions, 'externalData' | 'force' | 'quiet'>, input: string): WriteOptions {
  const modes = ['reference', 'copy', 'link'];
  if (o.externalData !== undefined && !modes.includes(o.externalData)) {
    throw new InputError(`--external-data must be reference, copy or link, got '${o.externalData}'`, 'usage');
  }
  return { force: o.force, protect: [input], externalData: o.externalData as ExternalDataMode | undefined, progress: terminalProgress({ quiet: o.quiet }) };
}
