/**
 * `npm run bench [-- SECTION [options]]`: the benchmarks, each reported as ratios against a baseline measured
 * in the same run (absolute times on a shared machine are noisy). Sections:
 *   io        patch time and peak RSS vs `cp` and Python onnx load+save, 100 MB to 1 GB models (io.ts)
 *   latency   inference latency of original vs patched decoders on onnxruntime (latency.ts); an optional
 *             regular expression selects cases by label
 *   verify    verification of a 100 M-parameter decoder vs one load-and-run of it (verify.ts)
 *   calibrate calibration of the same decoder vs its verification (calibrate.ts)
 *   scaling   patch time and peak memory of generated decoders from 8 to 256 layers (scaling.ts)
 *   runtimes  verification verdicts and times on onnxruntime-node vs onnxruntime-web, fixtures and corpus (runtimes.ts)
 *   quality   accuracy and attention sharpness of trained retrieval models, original vs patched, at 1×–16× the
 *             training length (quality.ts; `--count N` examples per length)
 *   lm        next-byte loss of trained byte-level LMs past their training length, original, its sliding window
 *             and the retrofits (lm-loss.ts; `--files N` held-out files)
 * Without a section, all of them run but runtimes, quality and lm.
 */
import { calibrateBench } from './calibrate';
import { ioBench } from './io';
import { latencyTable } from './latency';
import { lmLossBench } from './lm-loss';
import { qualityBench } from './quality';
import { runtimesBench } from './runtimes';
import { scalingBench } from './scaling';
import { verifyBench } from './verify';

async function main(): Promise<void> {
  const [section, ...rest] = process.argv.slice(2);
  const all = section === undefined;
  if (all || section === 'io') {
    process.stdout.write('## Model I/O\n\n');
    ioBench(rest);
  }
  if (all || section === 'latency') {
    process.stdout.write('\n## Inference latency, original vs patched (onnxruntime-node, default options)\n\n');
    process.stdout.write(`${await latencyTable(rest[0] ? new RegExp(rest[0]) : undefined)}\n`);
  }
  if (all || section === 'verify') {
    process.stdout.write('\n## Verification speed\n');
    await verifyBench(rest);
  }
  if (all || section === 'calibrate') {
    process.stdout.write('\n## Calibration cost\n\n');
    calibrateBench();
  }
  if (all || section === 'scaling') {
    process.stdout.write('\n## Patch time and memory by model size\n\n');
    scalingBench(rest);
  }
  // Not part of a run of all sections: it verifies some 140 models twice.
  if (section === 'runtimes') {
    process.stdout.write('## Verification on onnxruntime-node and onnxruntime-web\n\n');
    await runtimesBench(rest);
  }
  // Not part of a run of all sections either: some 15 minutes of n = 1024 runs.
  if (section === 'quality') {
    process.stdout.write('## Retrieval beyond the training length, original vs patched\n\n');
    await qualityBench(rest);
  }
  // Not part of a run of all sections: 4 models × 8 variants over 48 files of 2,048 bytes.
  if (section === 'lm') {
    process.stdout.write('## Language-model loss beyond the training length, original vs retrofits\n\n');
    await lmLossBench(rest);
  }
  if (!all && !['io', 'latency', 'verify', 'calibrate', 'scaling', 'runtimes', 'quality', 'lm'].includes(section)) {
    throw new Error(`unknown section '${section}' (io, latency, verify, calibrate, scaling, runtimes, quality, lm)`);
  }
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).message}\n`);
  process.exitCode = 1;
});
