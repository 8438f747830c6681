/**
 * `npm run bench -- calibrate`: the cost of `ssmax-patch calibrate` on the 100 M-parameter decoder of the verify
 * bench (decoder-model.ts), against `ssmax-patch verify` of that model's default patch in the same run, each as a
 * child process under /usr/bin/time (wall time, peak RSS): the default plans of both (L = 512; 8·L = 4096 passes
 * the default budget of one attention matrix for 12 heads, so calibration's N is verification's longest length,
 * 2048), and calibration matching entropy.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CalibrateDocument } from '../src/cli/report';
import { DECODER_100M, decoderModelFile, parameterCount } from './decoder-model';
import { BIN, timed } from './io';

const L = '512';

function line(what: string, r: { seconds: number; rssMB: number; code: number }, more = ''): void {
  process.stdout.write(`${what}: ${r.seconds.toFixed(1)} s wall, peak RSS ${r.rssMB.toFixed(0)} MB, exit ${r.code}${more}\n`);
}

export function calibrateBench(): void {
  const file = decoderModelFile();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-calibrate-bench-'));
  try {
    process.stdout.write(`model: ${file} (${(parameterCount(DECODER_100M) / 1e6).toFixed(1)} M parameters), ${os.cpus().length} cores, ${new Date().toISOString().slice(0, 10)}\n`);
    const patched = path.join(dir, 'patched.onnx');
    const p = timed(process.execPath, [BIN, file, '--train-len', L, '-o', patched, '--quiet']);
    line(`patch --train-len ${L}`, p);
    line('verify (default plan)', timed(process.execPath, [BIN, 'verify', file, patched, '--json'], false));
    // The decoder's weights are random: its largest probability grows as e^gap with a gap linear in s (4 runs in
    // all), and its entropy cannot be brought down to its value at L (out of reach after 3).
    for (const per of [[], ['--match', 'entropy']]) {
      const out = path.join(dir, `slope${per.length ? '-entropy' : ''}.onnx`);
      const c = timed(process.execPath, [BIN, 'calibrate', file, '--train-len', L, ...per, '-o', out, '--json', '--quiet'], false);
      const doc = JSON.parse(c.stdout) as CalibrateDocument;
      const r = doc.calibration;
      const groups = r ? r.groups.map((g) => `${g.group} ${g.s.toPrecision(3)} ${g.state}`).join('; ') : doc.error;
      line(`calibrate --train-len ${L}${per.length ? ` ${per.join(' ')}` : ''}`, c, r ? ` (N = ${r.targetLen}, ${r.runs} runs: ${groups})` : ` (${groups})`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
