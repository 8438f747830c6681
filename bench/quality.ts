/**
 * `npm run bench -- quality [--count N]` (N sequences per length and model, default 128): does the retrofit help a trained model beyond its training length?
 *
 * The models are the tiny retrieval transformers of fixtures/quality (train.py: 2 layers, 4 heads, trained at
 * L = 64, RoPE and NoPE, 3 seeds each). Every variant is made by the CLI from the committed original, then run on
 * onnxruntime over the evaluation sets of quality-data.ts at 1×–16× L. Printed per length, averaged over seeds:
 *   - accuracy of the answers read at the query positions, ± its standard error: per seed, the variance of the
 *     sequences' fractions of right answers over the number of sequences (the queries of one sequence share its
 *     records, so they are not counted as independent), combined over seeds as the error of their mean;
 *   - mean entropy (nats) and mean largest probability of the query rows of every attention layer, averaged over
 *     layers, heads and queries: read from the Softmax outputs of an in-memory copy of each model with those rows
 *     brought out as graph outputs.
 * A variant is a name and the CLI's arguments: adding a preset is one line in VARIANTS.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CalibrateDocument } from '../src/cli/report';
import { findAttentionSoftmax } from '../src/detect/find-attention';
import { readModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { Exposer } from '../src/verify/expose';
import { lastRows } from '../src/verify/nodes';
import { OutputTensor, Runner } from '../src/verify/run';
import { HostTensor } from '../src/verify/tensors';
import { BIN } from './io';
import { EVAL_LENGTHS, evalSet, Layout, TASK } from './quality-data';

interface Variant {
  name: string;
  /** Arguments of `ssmax-patch <model>` (or of `ssmax-patch calibrate <model>`); null: the original model. */
  args: string[] | null;
  calibrate?: boolean;
  /** The variant rescales RoPE (`--rope`): RoPE models only. */
  rope?: true;
}

const L = String(TASK.trainLen);
/** Attention layers of every model (train.py). */
const LAYERS = 2;

export const VARIANTS: Variant[] = [
  { name: 'original softmax', args: null },
  { name: 'ssmax, s = 1/ln L', args: ['--train-len', L] },
  { name: 'qwen-logn', args: ['--preset', 'qwen-logn', '--train-len', L] },
  // Llama 4's floor_scale (8192) is its pre-training length: the factor is 1 up to it and grows by
  // attn_scale·ln(k + 1) at k times it. Scaled to this model, floor_scale = L.
  { name: 'llama4, floor_scale = L', args: ['--preset', 'llama4', '--floor-scale', L] },
  { name: 'slope, s = 1/ln L', args: ['--preset', 'slope', '--train-len', L] },
  // s from each model's attention on synthesised tokens, for N = 8·L (calibrate's defaults).
  { name: 'slope, calibrated: one s', args: ['--train-len', L], calibrate: true },
  { name: 'slope, calibrated: s per layer', args: ['--train-len', L, '--per', 'layer'], calibrate: true },
  { name: 'slope, calibrated: s per head', args: ['--train-len', L, '--per', 'head'], calibrate: true },
  // The locality and RoPE retrofits of the LM benchmark (issue 36), on retrieval: what the window cannot see, and
  // whether a rescaled RoPE that holds the loss still answers.
  { name: 'window prior W = L alone', args: ['--preset', 'none', '--window', L] },
  // Local and global layers (as Gemma and Llama 4 mix them): the window on layer 0 only, the last layer sees every key.
  { name: 'window prior W = L on layer 0, layer 1 global', args: ['--preset', 'none', '--window', L, '--layers', '0'] },
  { name: 'window prior W = L on layer 0, layer 1 global + ssmax', args: ['--window', L, '--layers', '0', '--train-len', L] },
  { name: 'window prior W = L on layer 0, RoPE YaRN ×16', args: ['--preset', 'none', '--window', L, '--layers', '0', '--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
  { name: 'window prior W = L on layer 1, layer 0 global', args: ['--preset', 'none', '--window', L, '--layers', '1'] },
  { name: 'window prior W = L on layer 1, RoPE YaRN ×16', args: ['--preset', 'none', '--window', L, '--layers', '1', '--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
  { name: 'RoPE NTK-aware ×16', args: ['--preset', 'none', '--rope', 'ntk', '--rope-scale', '16'], rope: true },
  { name: 'RoPE NTK-aware ×16 + ssmax', args: ['--rope', 'ntk', '--rope-scale', '16', '--train-len', L], rope: true },
  { name: 'RoPE YaRN ×16', args: ['--preset', 'none', '--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
  { name: 'RoPE YaRN ×16 + ssmax', args: ['--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
];

const FIXTURES = path.resolve(__dirname, '../../fixtures/quality');
/** The models of each family (one per training seed) and the layout of the records they were trained on. */
export const FAMILIES: { name: string; layout: Layout; files: string[] }[] = [
  { name: 'RoPE', layout: 'sparse', files: ['rope-s0', 'rope-s1', 'rope-s2'] },
  { name: 'NoPE', layout: 'dense', files: ['nope-s0', 'nope-s1', 'nope-s2'] },
];

export const qualityModel = (file: string): string => path.join(FIXTURES, `${file}.onnx`);

/** Sequences per length per model: 3 seeds × 128 × 8 queries put the standard error under 1 point. */
const COUNT = 128;
/** Tokens per onnxruntime run: bounds the attention matrices a run holds ([batch, 4, n, n] per layer). */
const BATCH_TOKENS = 16384;
const EVAL_SEED = 1;

interface Stats {
  /** Per sequence: the fraction of its queries answered right. */
  right: number[];
  entropy: number;
  maxProb: number;
  rows: number;
}

/** What calibrate found for each calibrated variant's model. */
const calibrated: string[] = [];

/** The variant's model: the original, or the CLI's output for it (in `dir`). */
function variantFile(model: string, variant: Variant, index: number, dir: string): string {
  if (!variant.args) return model;
  const out = writeVariant(model, variant.calibrate ? ['calibrate', model] : [model], variant.args, path.join(dir, `${path.basename(model, '.onnx')}.v${index}.onnx`));
  if (variant.calibrate) calibrated.push(`${variant.name}, ${path.basename(model, '.onnx')}: ${calibratedS(out)}`);
  return out;
}

/** `ssmax-patch <command> <args> -o out`, or an error with its message; returns `out`. */
export function writeVariant(model: string, command: string[], args: string[], out: string): string {
  const r = spawnSync(process.execPath, [BIN, ...command, ...args, '-o', out, '--force', '--quiet'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ssmax-patch ${[...command, ...args].join(' ')} (${path.basename(model)}) failed (${r.status}): ${r.stderr.trim()}`);
  return out;
}

/** The s calibrate found, read from its report beside the model. */
function calibratedS(model: string): string {
  const doc = JSON.parse(fs.readFileSync(model.replace(/\.onnx$/, '.calibration.json'), 'utf8')) as CalibrateDocument;
  const { s, granularity, targetLen } = doc.calibration!;
  // Per layer, each layer's s is repeated over its heads: one value per layer is shown.
  const rows = typeof s === 'number' ? [[s]] : (s as number[][]).map((row) => (granularity === 'per-layer' ? [row[0]] : row));
  return `s = ${rows.map((row) => row.map((x) => x.toFixed(3)).join(', ')).join('; ')} (N = ${targetLen})`;
}

/** A copy of the model with the query rows of every attention Softmax's output as graph outputs, in layer order. */
function withAttentionRows(model: ModelProto): { model: ModelProto; rows: string[] } {
  const sites = findAttentionSoftmax(model).sites;
  // A variant whose attention is no longer found would be averaged over fewer layers without a word.
  if (sites.length !== LAYERS) throw new Error(`${sites.length} attention layers found, not ${LAYERS}`);
  const x = new Exposer(model);
  const main = x.scope('main')!;
  const rows = sites.map((site) => {
    const probs = site.softmax.output[0];
    const last = lastRows(main.graph, probs, main.opset, 4, TASK.queries)!;
    for (const n of last.nodes) x.add(main, n);
    const out = x.expose('main', last.out, `quality/L${site.layer}`);
    if (typeof out !== 'string') throw new Error(out.reason);
    return out;
  });
  x.finish();
  return { model, rows };
}

/** Adds the attention statistics of one [batch, heads, QUERIES, n] tensor of query rows. */
function addRows(stats: Stats, t: OutputTensor): void {
  const n = t.dims[t.dims.length - 1];
  for (let r = 0; r < t.data.length / n; r++) {
    let h = 0, max = 0;
    for (let j = r * n; j < (r + 1) * n; j++) {
      const p = t.data[j];
      if (p > 0) h -= p * Math.log(p);
      if (p > max) max = p;
    }
    stats.entropy += h;
    stats.maxProb += max;
    stats.rows++;
  }
}

function addAnswers(stats: Stats, logits: OutputTensor, answers: Int32Array, from: number): void {
  const [b, n, v] = logits.dims;
  const q = TASK.queries;
  for (let i = 0; i < b; i++) {
    let right = 0;
    for (let j = 0; j < q; j++) {
      const base = (i * n + n - q + j) * v;
      let best = 0;
      for (let k = 1; k < v; k++) if (logits.data[base + k] > logits.data[base + best]) best = k;
      if (best === answers[(from + i) * q + j]) right++;
    }
    stats.right.push(right / q);
  }
}

async function evaluate(file: string, layout: Layout, count: number): Promise<Map<number, Stats>> {
  const { model, rows } = withAttentionRows(readModel(file));
  const runner = await Runner.fromModel(model, path.basename(file));
  const out = new Map<number, Stats>();
  try {
    for (const n of EVAL_LENGTHS) {
      const set = evalSet(EVAL_SEED, layout, n, count);
      const stats: Stats = { right: [], entropy: 0, maxProb: 0, rows: 0 };
      const batch = Math.max(1, Math.floor(BATCH_TOKENS / n));
      for (let from = 0; from < count; from += batch) {
        const b = Math.min(batch, count - from);
        const ids: HostTensor = { type: 'int64', dims: [b, n], data: set.tokens.subarray(from * n, (from + b) * n) };
        const result = await runner.run({ input_ids: ids }, ['logits', ...rows]);
        addAnswers(stats, result.logits, set.answers, from);
        for (const r of rows) addRows(stats, result[r]);
      }
      out.set(n, stats);
    }
  } finally {
    await runner.release();
  }
  return out;
}

interface Cell { accuracy: number; se: number; perSeed: number[]; entropy: number; maxProb: number }

const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;

/** Averages over seeds; the standard error is that of the mean of the seeds' accuracies. */
function combine(perSeed: Stats[]): Cell {
  const acc = perSeed.map((s) => mean(s.right));
  const variance = perSeed.reduce((v, s, i) => {
    const spread = s.right.reduce((a, r) => a + (r - acc[i]) ** 2, 0) / (s.right.length - 1);
    return v + spread / s.right.length;
  }, 0) / perSeed.length ** 2;
  return {
    accuracy: 100 * mean(acc), se: 100 * Math.sqrt(variance), perSeed: acc.map((a) => 100 * a),
    entropy: mean(perSeed.map((s) => s.entropy / s.rows)), maxProb: mean(perSeed.map((s) => s.maxProb / s.rows)),
  };
}

function table(title: string, list: Variant[], cells: Cell[][], show: (c: Cell) => string): string {
  const head = `| ${title} | ${EVAL_LENGTHS.map((n) => `n = ${n}`).join(' | ')} |`;
  const rule = `|---|${EVAL_LENGTHS.map(() => '---:').join('|')}|`;
  const body = list.map((v, i) => `| ${v.name} | ${cells[i].map(show).join(' | ')} |`);
  return [head, rule, ...body].join('\n');
}

function countArg(argv: string[]): number {
  const i = argv.indexOf('--count');
  if (i < 0) return COUNT;
  const n = Number(argv[i + 1]);
  if (!Number.isInteger(n) || n < 2) throw new Error(`--count takes an integer of at least 2 (the standard error needs two sequences), not '${argv[i + 1]}'`);
  return n;
}

/** `--only a,b`: the variants whose names contain one of these (the original always runs). */
function chosen(argv: string[]): Variant[] {
  const i = argv.indexOf('--only');
  if (i < 0) return VARIANTS;
  const terms = (argv[i + 1] ?? '').split(',').filter(Boolean);
  if (terms.length === 0) throw new Error('--only takes names of variants, comma-separated');
  return VARIANTS.filter((v, k) => k === 0 || terms.some((t) => v.name.includes(t)));
}

export async function qualityBench(argv: string[] = []): Promise<void> {
  const count = countArg(argv);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-quality-'));
  const start = performance.now();
  try {
    process.stdout.write(`models: ${FIXTURES} (trained at L = ${TASK.trainLen}); per length and model ${count} sequences of ${TASK.queries} queries; ${os.cpus().length} cores\n`);
    for (const family of FAMILIES) {
      const cells: Cell[][] = [];
      const list = chosen(argv).filter((v) => !v.rope || family.name === 'RoPE');
      for (const [i, variant] of list.entries()) {
        const stats: Map<number, Stats>[] = [];
        for (const f of family.files) stats.push(await evaluate(variantFile(qualityModel(f), variant, i, dir), family.layout, count));
        cells.push(EVAL_LENGTHS.map((n) => combine(stats.map((s) => s.get(n)!))));
      }
      process.stdout.write(`\n### ${family.name} (${family.layout} records), ${family.files.length} seeds\n\n`);
      process.stdout.write(`${table('accuracy % (± s.e.)', list, cells, (c) => `${c.accuracy.toFixed(1)} ± ${c.se.toFixed(1)}`)}\n\n`);
      process.stdout.write(`${table('accuracy % per seed', list, cells, (c) => c.perSeed.map((a) => a.toFixed(1)).join(' / '))}\n\n`);
      process.stdout.write(`${table('attention entropy (nats)', list, cells, (c) => c.entropy.toFixed(2))}\n\n`);
      process.stdout.write(`${table('max attention probability', list, cells, (c) => c.maxProb.toFixed(3))}\n`);
    }
    process.stdout.write(`\ncalibrated on synthesised tokens:\n${calibrated.map((c) => `- ${c}`).join('\n')}\n`);
    process.stdout.write(`\n(${((performance.now() - start) / 1000).toFixed(0)} s)\n`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
