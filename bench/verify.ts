/**
 * `npm run bench -- verify`: verification speed, as a ratio against a baseline measured in the same run.
 *
 * verify-100m: a 12-layer, d = 768 decoder of plain ONNX ops with ~100 M random parameters (generated once
 * into a cache folder outside the repository, see decoder-model.ts), patched with --train-len 512 and
 * verified with the default plan (five checks, lengths 128 … 4096, capped by its 4096-row position table).
 * Baseline: loading the original into one onnxruntime session and running it once at 512 tokens.
 */
import { readModel } from '../src/io/model-file';
import { encodeModel } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { Runner } from '../src/verify/run';
import { makeHost } from '../src/verify/tensors';
import { verifyPatch, VerifyReport } from '../src/verify/verify';
import { formatVerify } from '../src/cli/format';
import { DECODER_100M, decoderModelFile, parameterCount } from './decoder-model';

const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;

async function timed<T>(f: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const start = performance.now();
  const value = await f();
  return { ms: performance.now() - start, value };
}

function describeVerify(report: VerifyReport): string[] {
  const sessions = report.sessions.map((s) => `${s.label}: load ${seconds(s.createMs)}, runs ${seconds(s.runMs)}`);
  const runs = report.runs.map((r) => `${r.id}: ${Object.entries(r.ms).map(([k, v]) => `${k} ${seconds(v)}`).join(', ')}`);
  return [...formatVerify(report), '  sessions:', ...sessions.map((s) => `    ${s}`), '  runs:', ...runs.map((r) => `    ${r}`)];
}

async function verify100m(n: 'auto' | 'keys'): Promise<void> {
  const file = decoderModelFile();
  process.stdout.write(`model: ${file} (${(parameterCount(DECODER_100M) / 1e6).toFixed(1)} M parameters)\n`);
  const original = readModel(file);
  const baseline = await timed(async () => {
    const runner = await Runner.create(encodeModel(original), 'baseline');
    const ids = makeHost('int64', [1, 512], Array.from({ length: 512 }, (_, i) => (i * 7919) % DECODER_100M.vocab));
    await runner.run({ input_ids: ids });
    await runner.release();
  });
  const patch = await timed(async () => patchModel(original, { trainLen: 512, n }));
  const verification = await timed(() => verifyPatch(original, patch.value.model));
  const lines = [
    `baseline (load + one run at 512 tokens): ${seconds(baseline.ms)}`,
    `patch (--train-len 512, --n ${n}): ${seconds(patch.ms)} = ${(patch.ms / baseline.ms).toFixed(2)}× baseline`,
    `verify (default plan): ${seconds(verification.ms)} = ${(verification.ms / baseline.ms).toFixed(1)}× baseline`,
    ...describeVerify(verification.value),
  ];
  process.stdout.write(lines.join('\n') + '\n');
}

export async function verifyBench(): Promise<void> {
  for (const n of ['auto', 'keys'] as const) {
    process.stdout.write(`\n== verify-100m-${n === 'auto' ? 'causal' : 'keys'}\n`);
    await verify100m(n);
  }
}
