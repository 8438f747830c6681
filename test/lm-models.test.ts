/**
 * The LM-loss benchmark's fixed parts (not the training, not the benchmark run): the committed byte-level models
 * exist, are small, have every layer patched by the CLI with a causal n and predict held-out text far better than
 * chance; the benchmark's floor line (each byte past L from its last L bytes at most) is what running the model on
 * just those bytes gives.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { LM_FAMILIES, lmManifest, lmModel, evalText, nextByteBits, windowed } from '../bench/lm-loss';
import { ropeFrequencies } from '../src/policy/rope';
import { Runner } from '../src/verify/run';
import { cli } from './support/io';

interface DryRun { sites: { layer: number; n: string }[]; skipped: unknown[] }

const manifest = lmManifest();
const textSkip = fs.existsSync(path.join(manifest.root, manifest.files[0].path)) ? false : `${manifest.root} is not on this machine (${manifest.package})`;

describe('LM benchmark models', () => {
  for (const name of LM_FAMILIES.flatMap((f) => f.files)) {
    it(`${name}: committed, under 3 MB, four layers patched with a causal n`, () => {
      const file = lmModel(name);
      assert.ok(fs.existsSync(file), `${file} is missing: run fixtures/lm/train.py`);
      assert.ok(fs.statSync(file).size < 3 << 20, `${file}: ${fs.statSync(file).size} bytes`);
      const r = cli([file, '--train-len', String(manifest.trainLen), '--dry-run', '--json', '--quiet']);
      assert.equal(r.code, 0, r.stderr);
      const report = JSON.parse(r.stdout) as DryRun;
      assert.deepEqual(report.sites.map((s) => [s.layer, s.n]), [0, 1, 2, 3].map((l) => [l, 'causal']));
      assert.equal(report.skipped.length, 0);
    });

    it(`${name}: under 4 bits per byte on the first ${manifest.trainLen} bytes of held-out files (chance: 8)`, { skip: textSkip }, async () => {
      const text = evalText(manifest, 8).map((t) => t.subarray(0, manifest.trainLen));
      const runner = await Runner.create(lmModel(name), name);
      try {
        const bits = await nextByteBits(runner, text);
        const mean = bits.reduce((a, b) => a + b.reduce((x, y) => x + y, 0), 0) / bits.reduce((a, b) => a + b.length, 0);
        assert.ok(mean < 4, `${mean.toFixed(2)} bits per byte`);
      } finally {
        await runner.release();
      }
    });
  }

  it('the floor line: a byte past L scored from the window that holds its last 97 to 128 bytes, as that window alone gives', { skip: textSkip }, async () => {
    const L = manifest.trainLen;
    const [bytes] = evalText(manifest, 1);
    const runner = await Runner.create(lmModel('rope-s0'), 'rope-s0');
    try {
      const whole = await nextByteBits(runner, [bytes]);
      const [floor] = await windowed(runner, [bytes], L, whole);
      assert.deepEqual(Array.from(floor.subarray(0, L)), Array.from(whole[0].subarray(0, L)), 'up to L the context is the whole file');
      for (const t of [L, 300, 1000, bytes.length - 2]) {
        const w = Math.floor((t - (L - L / 4)) / (L / 4)) * (L / 4);
        const [alone] = await nextByteBits(runner, [bytes.subarray(w, t + 2)]);
        assert.ok(Math.abs(alone[t - w] - floor[t]) < 1e-4, `t = ${t}: window from ${w} gives ${alone[t - w]}, the floor ${floor[t]}`);
        assert.ok(t - w >= L - L / 4 && t - w < L, `t = ${t} sees ${t - w + 1} bytes`);
      }
      assert.ok(Math.abs(floor[1000] - whole[0][1000]) > 1e-6, 'past L the floor is not the whole-file loss');
    } finally {
      await runner.release();
    }
  });
});

describe('RoPE rescaling (src/policy/rope.ts), against the formulas of Hugging Face transformers', () => {
  const d = 32, base = 10000, scale = 16, L = 128;
  const theta = Array.from({ length: d / 2 }, (_, i) => base ** (-(2 * i) / d));
  const close = (a: number[], b: number[]): void => a.forEach((x, i) => assert.ok(Math.abs(x - b[i]) <= 1e-12 + 1e-9 * Math.abs(b[i]), `index ${i}: ${x} against ${b[i]}`));

  it('PI divides every frequency by the scale; NTK-aware raises the base to base·scale^(d/(d−2))', () => {
    close(ropeFrequencies({ method: 'pi', scale }, theta).theta, theta.map((t) => t / scale));
    const ntkBase = base * scale ** (d / (d - 2));
    close(ropeFrequencies({ method: 'ntk', scale }, theta).theta, theta.map((_, i) => ntkBase ** (-(2 * i) / d)));
  });

  it('YaRN keeps the frequencies above β_fast = 32 turns per L, interpolates those below β_slow = 1, ramps between; cos and sin × (0.1 ln s + 1)', () => {
    const y = ropeFrequencies({ method: 'yarn', scale, trainLen: L }, theta);
    // find_correction_dim: d·ln(L / (r·2π)) / (2 ln base): for r = 32 below 0 (low = 0), for r = 1 5.24 (high = 6).
    const ramp = (i: number): number => Math.min(1, Math.max(0, i / 6));
    close(y.theta, theta.map((t, i) => (t / scale) * ramp(i) + t * (1 - ramp(i))));
    assert.equal(y.theta[0], theta[0]);
    assert.ok(Math.abs(y.mscale - (0.1 * Math.log(16) + 1)) < 1e-15);
  });
});
