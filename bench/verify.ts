/**
 * `npm run bench -- verify [--large]`: verification time and peak memory, with a baseline measured in the same run.
 *
 * verify-100m: a 12-layer, d = 768 decoder of plain ONNX ops with ~100 M random parameters (generated once
 * into a cache folder outside the repository, see decoder-model.ts), patched with --train-len 512 (causal n,
 * and --n keys) and verified by `ssmax-patch verify` with the default plan (five checks, lengths 128 … 2048: one
 * [12, T, T] attention matrix within the default budget), and once with --max-len 4096, as a child process: wall
 * time and peak RSS from /usr/bin/time.
 * Baseline: loading the original into one onnxruntime session and running it once at 512 tokens.
 *
 * verify-100m-cache (issue 33): the 12L x 768 decoder of the latency bench (bench/decoder.ts: ~91 M parameters, a KV
 * cache, no position table), patched at L = 512 and at L = 32768 and verified with --strict: over a cache each length
 * is a few query tokens after the rest cached, so L = 32768 should cost about what L = 512 does (targets: within
 * 2x its time, within 2.5 GB). Then calibrate at L = 8192 (target: within verify's time and memory).
 *
 * --large adds a 2.3 GB model with external data (40 layers, d = 1024; its causal mask covers 1024 tokens, so the
 * sweep stops there), verified the same way: sessions are made from files, never from a 2 GB buffer.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Runner } from '../src/verify/run';
import { makeHost } from '../src/verify/tensors';
import { VerifyReport } from '../src/verify/verify';
import { formatVerify } from '../src/cli/format';
import { benchCacheDir, DECODER_100M, decoderModelFile, parameterCount } from './decoder-model';
import { decoderFile } from './decoder';
import { WIDE } from './latency';
import { BIN, timed } from './io';
import { writeBenchModel } from './models';

const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;

function describeVerify(report: VerifyReport): string[] {
  const sessions = report.sessions.map((s) => `${s.label}: load ${seconds(s.createMs)}, runs ${seconds(s.runMs)}`);
  const runs = report.runs.map((r) => `${r.id}: ${Object.entries(r.ms).map(([k, v]) => `${k} ${seconds(v)}`).join(', ')}`);
  return [...formatVerify(report), '  sessions:', ...sessions.map((s) => `    ${s}`), '  runs:', ...runs.map((r) => `    ${r}`)];
}

/** Patches `file` once per option set (cached beside it), then times `ssmax-patch verify` on the pair. */
function verifyPair(file: string, tag: string, patchArgs: string[], verifyArgs: string[] = []): void {
  const patched = file.replace(/\.onnx$/, `.ssmax-${tag}.onnx`);
  if (!fs.existsSync(patched)) {
    const p = timed(process.execPath, [BIN, file, ...patchArgs, '-o', patched, '--quiet'], false);
    if (p.code !== 0) throw new Error(`patch failed: ${p.stderr}`);
  }
  const v = timed(process.execPath, [BIN, 'verify', file, patched, '--json', ...verifyArgs], false);
  if (v.code !== 0 && v.code !== 1) throw new Error(`verify failed (${v.code}): ${v.stderr}`);
  const report = JSON.parse(v.stdout) as VerifyReport;
  process.stdout.write([`verify ${verifyArgs.join(' ') || '(default plan)'}: ${v.seconds.toFixed(1)} s wall, peak RSS ${v.rssMB.toFixed(0)} MB, exit ${v.code}`,
    ...describeVerify(report)].join('\n') + '\n');
}

async function baseline(file: string): Promise<number> {
  const start = performance.now();
  const runner = await Runner.create(file, 'baseline');
  const ids = makeHost('int64', [1, 512], Array.from({ length: 512 }, (_, i) => (i * 7919) % DECODER_100M.vocab));
  await runner.run({ input_ids: ids });
  await runner.release();
  return performance.now() - start;
}

async function verify100m(): Promise<void> {
  const file = decoderModelFile();
  process.stdout.write(`model: ${file} (${(parameterCount(DECODER_100M) / 1e6).toFixed(1)} M parameters), ${os.cpus().length} cores, ${new Date().toISOString().slice(0, 10)}\n`);
  process.stdout.write(`baseline (load + one run at 512 tokens): ${seconds(await baseline(file))}\n`);
  for (const [tag, n] of [['causal', 'auto'], ['keys', 'keys']] as const) {
    process.stdout.write(`\n== verify-100m-${tag} (--train-len 512 --n ${n})\n`);
    verifyPair(file, tag, ['--train-len', '512', '--n', n]);
  }
  // The default plan before it kept one attention matrix within a budget: the 4096-token runs.
  process.stdout.write('\n== verify-100m-causal --max-len 4096\n');
  verifyPair(file, 'causal', ['--train-len', '512', '--n', 'auto'], ['--max-len', '4096']);
}

/** The KV-cache decoder verified at a short and a real training length, and calibrated at 8192: time and peak RSS of each. */
function verify100mCache(): void {
  const file = decoderFile(WIDE);
  process.stdout.write(`\n== verify-100m-cache: ${file} (${WIDE.layers}L x ${WIDE.hidden}, a KV cache, no position table)\n`);
  const measured: Record<string, { seconds: number; rssMB: number; code: number }> = {};
  for (const L of [512, 32768]) {
    const patched = file.replace(/\.onnx$/, `.ssmax-cache-L${L}.onnx`);
    if (!fs.existsSync(patched)) timed(process.execPath, [BIN, file, '--train-len', String(L), '-o', patched, '--quiet']);
    const v = timed(process.execPath, [BIN, 'verify', file, patched, '--strict', '--json'], false);
    measured[`verify L=${L}`] = v;
    const report = JSON.parse(v.stdout) as VerifyReport;
    process.stdout.write([`verify --strict at L = ${L}: ${v.seconds.toFixed(1)} s wall, peak RSS ${v.rssMB.toFixed(0)} MB, exit ${v.code}`, ...describeVerify(report)].join('\n') + '\n');
  }
  const out = path.join(os.tmpdir(), `ssmax-bench-calibrate-${process.pid}.onnx`);
  const c = timed(process.execPath, [BIN, 'calibrate', file, '--train-len', '8192', '-o', out, '--quiet'], false);
  for (const f of fs.readdirSync(os.tmpdir()).filter((f) => f.startsWith(path.basename(out, '.onnx')))) fs.rmSync(path.join(os.tmpdir(), f), { force: true });
  measured['calibrate L=8192'] = c;
  process.stdout.write(`calibrate at L = 8192: ${c.seconds.toFixed(1)} s wall, peak RSS ${c.rssMB.toFixed(0)} MB, exit ${c.code}${c.code ? `: ${c.stderr.trim().split('\n').pop()}` : ''}\n`);
  const [short, long] = [measured['verify L=512'], measured['verify L=32768']];
  process.stdout.write(`verify L = 32768 / L = 512: time ${(long.seconds / short.seconds).toFixed(2)}x (target <= 2), memory ${(long.rssMB / 1024).toFixed(2)} GB (target <= 2.5); `
    + `calibrate L = 8192 / verify L = 32768: time ${(c.seconds / long.seconds).toFixed(2)}x, memory ${(c.rssMB / long.rssMB).toFixed(2)}x (targets <= 1)\n`);
}

/** Over 2 GB of weights in an external data file beside the model. */
function largeExternal(): void {
  const spec = { layers: 40, d: 1024, heads: 16, ff: 4096, vocab: 32000, tmax: 1024 };
  const file = path.join(benchCacheDir(), `gpt-L${spec.layers}-d${spec.d}-v${spec.vocab}-t${spec.tmax}-ext`, 'model.onnx');
  if (!fs.existsSync(file)) {
    fs.mkdirSync(path.dirname(file), { recursive: true });
    process.stderr.write(`building the large model in ${path.dirname(file)} ...\n`);
    writeBenchModel(file, { label: 'large external', spec, external: true });
  }
  const bytes = fs.readdirSync(path.dirname(file)).filter((f) => f.startsWith('model.onnx')).reduce((n, f) => n + fs.statSync(path.join(path.dirname(file), f)).size, 0);
  process.stdout.write(`\n== verify-large-external: ${file} (${(bytes / 2 ** 30).toFixed(2)} GB with its data file)\n`);
  verifyPair(file, 'causal', ['--train-len', '512']);
}

export async function verifyBench(argv: string[] = []): Promise<void> {
  if (!argv.includes('--cache-only')) await verify100m();
  verify100mCache();
  if (argv.includes('--large')) largeExternal();
}
