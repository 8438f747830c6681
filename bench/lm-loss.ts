/**
 * `npm run bench -- lm [--files N]`: does a training-free retrofit hold a language model's loss past its training
 * length? (issue 36)
 *
 * The models are the byte-level LMs of fixtures/lm (train.py: 4 layers, d = 128, 4 heads, trained at L = 128 on the
 * Python standard library's source, RoPE and NoPE, seeds 0 and 1). The text is the first 2,048 bytes of the held-out
 * files that fixtures/lm/eval.json lists (read from this machine's /usr/lib/python3.11, checked by SHA-256). Every
 * variant is made by the CLI from the committed original and run on onnxruntime over whole files; the loss of each
 * next byte, in bits, is averaged per file within buckets of the number of bytes seen (≤ L, 2L, 4L, 8L, 16L), then
 * over files (± the standard error over files) and over seeds.
 *
 * The floor line is the same original model fed only the recent bytes: each byte past L is predicted from the last
 * 97 to 128 bytes (windows of L bytes at a stride of L/4, their last quarter scored), which is what a sliding window
 * of L would give, within a quarter window of context. "recovered" is the share of the original's rise above that
 * floor a variant takes back: (original − variant) / (original − floor), 1 at the floor, 0 where it does nothing,
 * negative where it is worse than the original.
 *
 * A variant is a name and the CLI's arguments: adding a preset is one line in VARIANTS.
 */
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Outputs, Runner } from '../src/verify/run';
import { spawnSync } from 'node:child_process';
import { CalibrateDocument } from '../src/cli/report';
import { BIN } from './io';
import { writeVariant } from './quality';

const FIXTURES = path.resolve(__dirname, '../../fixtures/lm');

interface Manifest { root: string; package: string; bytes: number; trainLen: number; files: { path: string; sha256: string }[] }

export const lmManifest = (): Manifest => JSON.parse(fs.readFileSync(path.join(FIXTURES, 'eval.json'), 'utf8')) as Manifest;
export const lmModel = (name: string): string => path.join(FIXTURES, `${name}.onnx`);

interface Variant {
  name: string;
  /**
   * Arguments of `ssmax-patch <model>`; null: the original model; 'window': the original over windows of L bytes;
   * 'calibrate': the slope with s from `calibrate --match loss` on held-out files the evaluation does not read.
   */
  args: string[] | null | 'window' | 'calibrate';
  /** The variant rescales RoPE (`--rope`): RoPE models only. */
  rope?: true;
  /** More arguments of `calibrate --match loss` (args 'calibrate'). */
  calibrate?: string[];
}

/** θ of a GGD prior between ALiBi and none: B = −m_h·√|j − i| with ALiBi's slopes m_h (4 heads). */
const GGD_SQRT = path.join(FIXTURES, 'ggd-sqrt.json');

function variants(L: string): Variant[] {
  return [
    { name: 'original', args: null },
    { name: 'window of L (floor)', args: 'window' },
    { name: 'ssmax, s = 1/ln L', args: ['--train-len', L] },
    { name: 'slope, s = 1/ln L', args: ['--preset', 'slope', '--train-len', L] },
    { name: 'qwen-logn', args: ['--preset', 'qwen-logn', '--train-len', L] },
    { name: 'llama4, floor_scale = L', args: ['--preset', 'llama4', '--floor-scale', L] },
    { name: 'slope, s calibrated by loss', args: 'calibrate' },
    { name: 'ALiBi prior alone', args: ['--preset', 'none', '--prior', 'alibi'] },
    { name: 'ALiBi prior + ssmax', args: ['--prior', 'alibi', '--train-len', L] },
    { name: 'GGD prior, neutral θ (`--prior ggd`) alone', args: ['--preset', 'none', '--prior', 'ggd'] },
    { name: 'GGD prior, neutral θ + ssmax', args: ['--prior', 'ggd', '--train-len', L] },
    { name: 'GGD prior, √distance (θβ = 0.5, ALiBi slopes) alone', args: ['--preset', 'none', '--prior', 'ggd', '--prior-file', GGD_SQRT] },
    { name: 'GGD prior, √distance + ssmax', args: ['--prior', 'ggd', '--prior-file', GGD_SQRT, '--train-len', L] },
    { name: 'window prior W = L alone', args: ['--preset', 'none', '--window', L] },
    { name: 'window prior W = L, 4 sinks', args: ['--preset', 'none', '--window', L, '--sinks', '4'] },
    { name: 'window prior W = L + ssmax', args: ['--window', L, '--train-len', L] },
    // Local and global layers (as Gemma and Llama 4 mix them): the window on layers 0-2, the last layer sees every key.
    { name: 'window prior W = L on layers 0-2, layer 3 global', args: ['--preset', 'none', '--window', L, '--layers', '0,1,2'] },
    { name: 'window prior W = L on layers 0-2, layer 3 global + ssmax', args: ['--window', L, '--layers', '0,1,2', '--train-len', L] },
    { name: 'window prior W = L on layers 0-2, RoPE YaRN ×16', args: ['--preset', 'none', '--window', L, '--layers', '0,1,2', '--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
    { name: 'window prior W = L on layers 1-3, layer 0 global', args: ['--preset', 'none', '--window', L, '--layers', '1,2,3'] },
    { name: 'window prior W = L on layers 1-3, RoPE YaRN ×16', args: ['--preset', 'none', '--window', L, '--layers', '1,2,3', '--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
    // RoPE rescaled for 16·L (2,048 bytes).
    { name: 'RoPE PI ×16', args: ['--preset', 'none', '--rope', 'pi', '--rope-scale', '16'], rope: true },
    { name: 'RoPE NTK-aware ×16', args: ['--preset', 'none', '--rope', 'ntk', '--rope-scale', '16'], rope: true },
    { name: 'RoPE NTK-aware ×16 + ssmax', args: ['--rope', 'ntk', '--rope-scale', '16', '--train-len', L], rope: true },
    { name: 'RoPE YaRN ×16', args: ['--preset', 'none', '--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
    { name: 'RoPE YaRN ×16 + ssmax', args: ['--rope', 'yarn', '--rope-scale', '16', '--train-len', L], rope: true },
    { name: 'RoPE YaRN, its scale and the slope calibrated by loss', args: 'calibrate', calibrate: ['--rope', 'yarn'], rope: true },
  ];
}

/** `--only a,b`: the variants whose names contain one of these (the original and the floor always run: the shares need them). */
function chosen(list: Variant[], argv: string[]): Variant[] {
  const i = argv.indexOf('--only');
  if (i < 0) return list;
  const terms = (argv[i + 1] ?? '').split(',').filter(Boolean);
  if (terms.length === 0) throw new Error('--only takes names of variants, comma-separated');
  return list.filter((v, k) => k < 2 || terms.some((t) => v.name.includes(t)));
}

export const LM_FAMILIES = [
  { name: 'RoPE', files: ['rope-s0', 'rope-s1'] },
  { name: 'NoPE', files: ['nope-s0', 'nope-s1'] },
];

/** Files per onnxruntime run of whole files: [4, 4, 2047, 2047] attention scores per layer, about 270 MB. */
const FILES_PER_RUN = 4;

/** The evaluation text: the listed prefix of each file, or an error saying what differs on this machine. */
export function evalText(m: Manifest, count: number, from = 0): Uint8Array[] {
  return m.files.slice(from, from + count).map((f) => {
    const file = path.join(m.root, f.path);
    if (!fs.existsSync(file)) throw new Error(`${file} is missing: the benchmark reads the Python standard library's source as ${m.package} ships it`);
    const bytes = fs.readFileSync(file).subarray(0, m.bytes);
    const sha = createHash('sha256').update(bytes).digest('hex');
    if (bytes.length < m.bytes || sha !== f.sha256) throw new Error(`${file}: not the text the models were evaluated on (${m.package}; SHA-256 of its first ${m.bytes} bytes differs)`);
    return bytes;
  });
}

/** Bits of the next byte at every position of every row of logits [rows, t, 256] against `next` (row-major [rows, t]). */
function bitsOf(out: Outputs, next: (row: number, t: number) => number): Float64Array {
  const { dims, data } = out.logits;
  const [rows, t, v] = dims;
  const bits = new Float64Array(rows * t);
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < t; i++) {
      const base = (r * t + i) * v;
      let max = -Infinity;
      for (let k = 0; k < v; k++) max = Math.max(max, data[base + k]);
      let sum = 0;
      for (let k = 0; k < v; k++) sum += Math.exp(data[base + k] - max);
      bits[r * t + i] = (Math.log(sum) + max - data[base + next(r, i)]) / Math.LN2;
    }
  }
  return bits;
}

const ids = (rows: Uint8Array[]): { type: 'int64'; dims: number[]; data: BigInt64Array } =>
  ({ type: 'int64', dims: [rows.length, rows[0].length], data: BigInt64Array.from(rows.flatMap((r) => Array.from(r, BigInt))) });

/** Per file, the bits of bytes 1 … n − 1, each predicted from every byte before it. */
export async function nextByteBits(runner: Runner, text: Uint8Array[]): Promise<Float64Array[]> {
  const out: Float64Array[] = [];
  for (let i = 0; i < text.length; i += FILES_PER_RUN) {
    const rows = text.slice(i, i + FILES_PER_RUN);
    const bits = bitsOf(await runner.run({ input_ids: ids(rows.map((r) => r.subarray(0, r.length - 1))) }), (r, t) => rows[r][t + 1]);
    const t = rows[0].length - 1;
    for (let r = 0; r < rows.length; r++) out.push(bits.subarray(r * t, (r + 1) * t));
  }
  return out;
}

/** Per file, the bits of bytes 1 … n − 1, those past L predicted from the last 97 … 128 bytes (see the header). */
export async function windowed(runner: Runner, text: Uint8Array[], L: number, whole: Float64Array[]): Promise<Float64Array[]> {
  const stride = L / 4;
  const out: Float64Array[] = [];
  for (const [f, bytes] of text.entries()) {
    const bits = Float64Array.from(whole[f]);
    // Position t ≥ L is scored in the window starting at the multiple of the stride that puts it in the last quarter.
    const starts: number[] = [];
    for (let w = stride; w + L <= bytes.length; w += stride) starts.push(w);
    for (let i = 0; i < starts.length; i += 64) {
      const group = starts.slice(i, i + 64);
      const rows = group.map((w) => bytes.subarray(w, w + L));
      // The last window's last position has no next byte: it is not scored (w + j < bits.length below).
      const got = bitsOf(await runner.run({ input_ids: ids(rows) }), (r, j) => bytes[group[r] + j + 1] ?? 0);
      group.forEach((w, r) => {
        for (let j = L - stride; j < L && w + j < bits.length; j++) bits[w + j] = got[r * L + j];
      });
    }
    out.push(bits);
  }
  return out;
}

/** Position buckets by bytes seen (position t has seen t + 1): 1 … L, then (L, 2L], (2L, 4L], … the last ending at n. */
function buckets(L: number, n: number): [number, number][] {
  const out: [number, number][] = [[1, L]];
  for (let hi = 2 * L; hi / 2 < n; hi *= 2) out.push([hi / 2 + 1, Math.min(hi, n)]);
  return out;
}

interface Cell { mean: number; se: number }

const average = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;

/** Mean over files of each file's mean bits in the bucket, and its standard error over files. */
function bucketStats(files: Float64Array[], [lo, hi]: [number, number]): Cell {
  const perFile = files.map((b) => average(Array.from(b.subarray(lo - 1, Math.min(hi, b.length)))));
  const mean = average(perFile);
  const sd = Math.sqrt(perFile.reduce((a, x) => a + (x - mean) ** 2, 0) / (perFile.length - 1));
  return { mean, se: sd / Math.sqrt(perFile.length) };
}

/** Seeds combined: the mean of their means, the standard error of that mean. */
const combine = (cells: Cell[]): Cell => ({ mean: average(cells.map((c) => c.mean)), se: Math.sqrt(cells.reduce((a, c) => a + c.se ** 2, 0)) / cells.length });

function filesArg(argv: string[], max: number): number {
  const i = argv.indexOf('--files');
  if (i < 0) return max;
  const n = Number(argv[i + 1]);
  if (!Number.isInteger(n) || n < 2 || n > max) throw new Error(`--files takes an integer from 2 to ${max}, not '${argv[i + 1]}'`);
  return n;
}

/**
 * Files the calibration reads (8 files of 2,048 bytes, after every file the evaluation can read): the slope's s is
 * chosen on text the loss table is not measured on.
 */
const CALIBRATION_FILES = { from: 32, count: 8 };

/** The slope with s of lowest loss past L on the calibration files; the original where s = 0 was best (calibrate writes no model then). */
function calibrated(file: string, L: number, dir: string, out: string, extra: string[] = []): string {
  const m = lmManifest();
  if (m.files.length < CALIBRATION_FILES.from + CALIBRATION_FILES.count) throw new Error('eval.json lists too few files to calibrate on files the evaluation does not read');
  const rows = evalText(m, CALIBRATION_FILES.count, CALIBRATION_FILES.from);
  const ids = path.join(dir, 'calibration-ids.json');
  if (!fs.existsSync(ids)) fs.writeFileSync(ids, JSON.stringify({ dims: [rows.length, m.bytes], data: rows.flatMap((r) => Array.from(r)) }));
  const r = spawnSync(process.execPath, [BIN, 'calibrate', file, '--train-len', String(L), '--max-len', String(m.bytes), '--match', 'loss', '--input', `input_ids=${ids}`,
    ...extra, '-o', out, '--force', '--quiet', '--json'], { encoding: 'utf8' });
  const doc = JSON.parse(r.stdout) as CalibrateDocument;
  const g = doc.calibration?.groups[0];
  if (!g || (r.status !== 0 && g.state !== 'no gain')) throw new Error(`calibrate --match loss (${path.basename(file)}) failed (${r.status}): ${r.stderr.trim()}`);
  const rope = doc.calibration!.rope ? `, RoPE ${doc.calibration!.rope.method} ×${doc.calibration!.rope.scale}` : '';
  process.stdout.write(`calibrated ${path.basename(file)}${extra.length ? ` (${extra.join(' ')})` : ''}: s = ${g.s.toFixed(3)}${rope} (${g.state}; ${doc.calibration!.runs} runs, ${(doc.calibration!.totalMs / 1000).toFixed(1)} s)\n`);
  return g.state === 'no gain' ? file : out;
}

async function measure(file: string, variant: Variant, text: Uint8Array[], L: number, dir: string, index: number): Promise<Float64Array[]> {
  const out = path.join(dir, `${path.basename(file, '.onnx')}.v${index}.onnx`);
  const model = variant.args === null || variant.args === 'window' ? file : variant.args === 'calibrate' ? calibrated(file, L, dir, out, variant.calibrate) : writeVariant(file, [file], variant.args, out);
  const runner = await Runner.create(model, path.basename(model));
  try {
    const whole = await nextByteBits(runner, text);
    return variant.args === 'window' ? await windowed(runner, text, L, whole) : whole;
  } finally {
    await runner.release();
  }
}

export async function lmLossBench(argv: string[] = []): Promise<void> {
  const m = lmManifest();
  const text = evalText(m, filesArg(argv, m.files.length));
  const L = m.trainLen;
  const list = chosen(variants(String(L)), argv);
  const spans = buckets(L, m.bytes - 1);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-lm-'));
  const start = performance.now();
  try {
    process.stdout.write(`models: ${FIXTURES} (trained at L = ${L}); text: the first ${m.bytes} bytes of ${text.length} held-out files of ${m.root} (${m.package}); ${os.cpus().length} cores\n`);
    for (const family of LM_FAMILIES) {
      const cells: Cell[][] = [];
      const rows = list.filter((v) => !v.rope || family.name === 'RoPE');
      for (const [i, variant] of rows.entries()) {
        const perSeed: Cell[][] = [];
        for (const f of family.files) {
          const bits = await measure(lmModel(f), variant, text, L, dir, i);
          perSeed.push(spans.map((s) => bucketStats(bits, s)));
        }
        cells.push(spans.map((_, k) => combine(perSeed.map((p) => p[k]))));
      }
      process.stdout.write(`\n### ${family.name}, ${family.files.length} seeds: bits per byte by bytes seen (± s.e. over files)\n\n`);
      process.stdout.write(`${table(rows, spans, cells, (c) => `${c.mean.toFixed(3)} ± ${c.se.toFixed(3)}`)}\n\n`);
      const [original, floor] = [cells[0], cells[1]];
      const recovered = cells.map((row) => row.map((c, k) => ({ mean: (original[k].mean - c.mean) / (original[k].mean - floor[k].mean), se: 0 })));
      process.stdout.write(`${table(rows, spans.slice(1), recovered.map((r) => r.slice(1)), (c) => c.mean.toFixed(2), 'share of the rise above the floor recovered')}\n`);
    }
    process.stdout.write(`\n(${((performance.now() - start) / 1000).toFixed(0)} s)\n`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

function table(list: Variant[], spans: [number, number][], cells: Cell[][], show: (c: Cell) => string, title = 'bits per byte'): string {
  const head = `| ${title} | ${spans.map(([lo, hi]) => (lo === 1 ? `≤ ${hi}` : `${lo - 1}–${hi}`)).join(' | ')} |`;
  const rule = `|---|${spans.map(() => '---:').join('|')}|`;
  return [head, rule, ...list.map((v, i) => `| ${v.name} | ${cells[i].map(show).join(' | ')} |`)].join('\n');
}
