/**
 * How patch time and memory grow with the model: generated causal decoders (d = 64, 4 heads) of 8 to 256 layers,
 * each patched by the CLI in a fresh process (`--train-len 64`), median of 3 runs. The baseline is the same
 * process reading and writing the model unpatched (`revert` would refuse; a plain copy through the library's
 * reader and writer), so the ratio shows what detection and rewriting add. Time per node should stay flat.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { decoderFile } from './decoder';
import { BIN } from './io';

const COPY = `const m=require(${JSON.stringify(path.resolve(__dirname, '../src/io/model-file.js'))});`
  + 'm.writeModel(process.argv[2], m.readModel(process.argv[1]), {force:true});';

interface Sample { ms: number; rssMb: number }

/** One fresh process: wall time and its peak resident memory (from /proc via /usr/bin/time when present). */
function timed(args: string[]): Sample {
  const start = performance.now();
  const r = spawnSync('/usr/bin/time', ['-f', '%M', process.execPath, ...args], { encoding: 'utf8' });
  const ms = performance.now() - start;
  if (r.status !== 0) throw new Error(`${args.join(' ')} failed: ${r.stderr}`);
  const kb = Number(r.stderr.trim().split('\n').pop());
  return { ms, rssMb: kb / 1024 };
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

export function scalingBench(argv: string[]): void {
  const layers = argv.length ? argv.map(Number) : [8, 16, 32, 64, 128, 256];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-scaling-'));
  process.stdout.write('| layers | nodes | copy ms | patch ms | patch / copy | patch µs per node | peak RSS MB (copy / patch) |\n');
  process.stdout.write('| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n');
  try {
    for (const l of layers) {
      const file = decoderFile({ layers: l, heads: 4, hidden: 64, vocab: 256 });
      const out = path.join(dir, 'out.onnx');
      const nodes = 12 + 33 * l;
      const copy: Sample[] = [], patch: Sample[] = [];
      for (let i = 0; i < 3; i++) {
        copy.push(timed(['-e', COPY, file, out]));
        patch.push(timed([BIN, file, '--train-len', '64', '-o', out, '--force', '--quiet']));
      }
      const c = median(copy.map((s) => s.ms)), p = median(patch.map((s) => s.ms));
      const rss = (xs: Sample[]): string => median(xs.map((s) => s.rssMb)).toFixed(0);
      process.stdout.write(`| ${l} | ${nodes} | ${c.toFixed(0)} | ${p.toFixed(0)} | ${(p / c).toFixed(2)} | ${((p - c) * 1000 / nodes).toFixed(0)} | ${rss(copy)} / ${rss(patch)} |\n`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
