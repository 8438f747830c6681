/**
 * Benchmarks, reported as ratios against a baseline measured in the same run (the machine is shared, so
 * absolute times are noisy). Run with `npm run bench`; `npm run bench -- verify` runs only cases whose name
 * contains "verify"; `npm run bench -- latency "seq 512"` runs the latency cases whose label matches.
 *
 * latency: original vs patched decoders on onnxruntime, interleaved (latency.ts).
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
import { latencyTable } from './latency';

interface Case {
  name: string;
  run: () => Promise<void>;
}

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

const CASES: Case[] = [
  { name: 'latency', run: async () => {
    const label = process.argv[3];
    process.stdout.write(`${await latencyTable(label ? new RegExp(label) : undefined)}\n`);
  } },
  { name: 'verify-100m-causal', run: () => verify100m('auto') },
  { name: 'verify-100m-keys', run: () => verify100m('keys') },
];

async function main(): Promise<void> {
  const filter = process.argv[2];
  for (const c of CASES.filter((k) => !filter || k.name.includes(filter))) {
    process.stdout.write(`\n== ${c.name}\n`);
    await c.run();
  }
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exitCode = 1;
});
