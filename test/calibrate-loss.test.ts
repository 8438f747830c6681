/**
 * `calibrate --match loss`: the slope's s of lowest next-token loss past L on the user's tokens. On the LM
 * benchmark's byte-level models (fixtures/lm, trained at L = 128) and held-out text, the loss the report gives
 * for the s written is the loss this test computes itself from the written model's logits, and it is within 1 %
 * of the lowest loss of a grid of s (the patch at each s made by patchModel, the loss by the test's own code). A
 * model the slope does not help is said so, and no model is written. The search itself, on known curves.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { evalText, lmManifest, lmModel } from '../bench/lm-loss';
import { LossPoint, LossSearch } from '../src/calibrate/loss';
import { CalibrateDocument } from '../src/cli/report';
import { readModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { Runner } from '../src/verify/run';
import { makeHost } from '../src/verify/tensors';
import { cli, removeScratch, tmpdir } from './support/io';

const manifest = lmManifest();
const L = manifest.trainLen;
const N = 8 * L;
const textSkip = fs.existsSync(path.join(manifest.root, manifest.files[0].path)) ? false : `${manifest.root} is not on this machine (${manifest.package})`;
const dir = tmpdir('ssmax-calibrate-loss-');
after(removeScratch);

/** The first N bytes of two held-out files: [2, N] token ids, as a JSON tensor file. */
function tokenFile(): { file: string; rows: Uint8Array[] } {
  const rows = evalText(manifest, 2).map((t) => t.subarray(0, N));
  const file = path.join(dir, 'ids.json');
  fs.writeFileSync(file, JSON.stringify({ dims: [rows.length, N], data: rows.flatMap((r) => Array.from(r)) }));
  return { file, rows };
}

/** Mean −ln p(token t + 1) over rows L ≤ t < N − 1 of both files, from the model's logits (float64 log-softmax). */
async function lossOf(model: ModelProto | string, rows: Uint8Array[]): Promise<number> {
  const runner = typeof model === 'string' ? await Runner.create(model, 'test') : await Runner.fromModel(model, 'test');
  try {
    const out = await runner.run({ input_ids: makeHost('int64', [rows.length, N], rows.flatMap((r) => Array.from(r))) });
    const { dims, data } = out.logits;
    const V = dims[2];
    let sum = 0, count = 0;
    rows.forEach((r, b) => {
      for (let t = L; t < N - 1; t++) {
        const row = Array.from(data.subarray((b * N + t) * V, (b * N + t + 1) * V));
        const max = Math.max(...row);
        sum += Math.log(row.reduce((a, x) => a + Math.exp(x - max), 0)) + max - row[r[t + 1]];
        count++;
      }
    });
    return sum / count;
  } finally {
    await runner.release();
  }
}

function calibrate(model: string, name: string, ids: string, ...extra: string[]): { code: number; doc: CalibrateDocument; out: string; stderr: string } {
  const out = path.join(dir, `${name}.onnx`);
  const r = cli(['calibrate', model, '--train-len', String(L), '--max-len', String(N), '--match', 'loss', '--input', `input_ids=${ids}`, '-o', out, '--json', '--quiet', ...extra]);
  return { code: r.code, doc: JSON.parse(r.stdout) as CalibrateDocument, out, stderr: r.stderr };
}

const GRID = Array.from({ length: 9 }, (_, k) => 0.05 * k);

describe('calibrate by loss on the LM benchmark models', { skip: textSkip }, () => {
  const text = textSkip ? undefined : tokenFile();

  for (const name of ['nope-s1', 'rope-s0']) {
    it(`${name}: the loss reported is the written model's, within 1 % of the best of s = 0, 0.05, …, 0.4`, async () => {
      const { file, rows } = text!;
      const r = calibrate(lmModel(name), name, file);
      const g = r.doc.calibration!.groups[0];
      const original = readModel(lmModel(name));
      const grid = await Promise.all(GRID.map(async (s) => (s === 0 ? lossOf(lmModel(name), rows)
        : lossOf(patchModel(original, { preset: 'slope', trainLen: L, s }).model, rows))));
      const best = Math.min(...grid);
      assert.ok(Math.abs(g.beforeAtN - grid[0]) <= 1e-4 * grid[0], `the original's loss: reported ${g.beforeAtN}, computed ${grid[0]}`);
      assert.ok(g.afterAtN <= 1.01 * best, `s = ${g.s}: loss ${g.afterAtN}, the grid's best ${best} (${grid.map((x) => x.toFixed(4)).join(', ')})`);
      if (g.s > 0) {
        assert.equal(r.code, 0, r.stderr);
        const written = await lossOf(r.out, rows);
        assert.ok(Math.abs(written - g.afterAtN) <= 1e-4 * written, `the written model's loss ${written}, reported ${g.afterAtN}`);
        assert.equal(g.state, 'found');
      } else {
        // The original is best: nothing written, and the reason given.
        assert.equal(g.state, 'no gain');
        assert.equal(r.code, 1);
        assert.ok(!fs.existsSync(r.out));
        assert.match(r.stderr, /the loss past L is lowest at s = 0 \(the original\)/);
      }
      // 3 and 4 runs here (s = 0, 1/ln L, its half, a vertex); the search before took 6–8 on such curves.
      assert.ok(r.doc.calibration!.runs <= 6, `${r.doc.calibration!.runs} runs`);
    });
  }

  it('rope-s0 with --rope yarn: the RoPE scale of lowest loss is found first, the written model has it, and its loss is the one reported', async () => {
    const { file, rows } = text!;
    const r = calibrate(lmModel('rope-s0'), 'rope-yarn', file, '--rope', 'yarn');
    assert.equal(r.code, 0, r.stderr);
    const c = r.doc.calibration!, g = c.groups[0];
    const rope = (c as { rope?: { scale: number; tried: { scale: number; loss: number }[] } }).rope!;
    // N = 8·L: scales 2 … 32 tried at s = 0; the one written is the lowest of them.
    assert.deepEqual(rope.tried.map((t) => t.scale), [2, 4, 8, 16, 32]);
    assert.equal(rope.scale, rope.tried.reduce((a, b) => (b.loss < a.loss ? b : a)).scale);
    assert.ok(g.afterAtN <= Math.min(...rope.tried.map((t) => t.loss)) + 1e-12);
    assert.ok(g.afterAtN < 0.9 * g.beforeAtN, `${g.beforeAtN} → ${g.afterAtN}: YaRN holds the loss far better than the original`);
    const written = readModel(r.out);
    assert.equal(readRecord(written)!.rope!.scale, rope.scale);
    const loss = await lossOf(written, rows);
    assert.ok(Math.abs(loss - g.afterAtN) <= 1e-4 * loss, `the written model's loss ${loss}, reported ${g.afterAtN}`);
  });

  it('nope-s1: the slope lowers its loss past L by more than 1 % (the grid agrees it can)', () => {
    const r = calibrate(lmModel('nope-s1'), 'nope-s1-again', text!.file);
    const g = r.doc.calibration!.groups[0];
    assert.ok(g.afterAtN < 0.99 * g.beforeAtN, `${g.beforeAtN} → ${g.afterAtN}`);
  });
});

describe('calibrate by loss: what it refuses', () => {
  it('without token ids, or per layer: one line, exit 2', () => {
    const out = path.join(dir, 'x.onnx');
    const none = cli(['calibrate', lmModel('rope-s0'), '--train-len', String(L), '--match', 'loss', '-o', out]);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /^ssmax-patch: --match loss minimises the model's own next-token loss on your tokens: give token ids \[batch, T ≥ N\] with --input/);
    assert.equal(none.stderr.trim().split('\n').length, 1);
    const ids = path.join(dir, 'small.json');
    fs.writeFileSync(ids, JSON.stringify({ dims: [1, N], data: new Array(N).fill(7) }));
    const per = cli(['calibrate', lmModel('rope-s0'), '--train-len', String(L), '--match', 'loss', '--per', 'layer', '--input', `input_ids=${ids}`, '-o', out]);
    assert.equal(per.code, 2);
    assert.match(per.stderr, /--match loss calibrates one s for the model \(the loss is one number\); drop --per/);
    assert.ok(!fs.existsSync(out));
  });
});

describe('the loss search', () => {
  const run = (f: (s: number) => number, max = 4, first = 0.2): { search: LossSearch; runs: number } => {
    const search = new LossSearch(first, max, 0.05 * first);
    const at = (s: number): LossPoint => ({ s, loss: f(s), spans: [] });
    search.observe(at(0));
    let runs = 0;
    for (let s = search.next(); s !== undefined && runs < 20; s = search.next(), runs++) search.observe(at(s));
    return { search, runs };
  };

  it('finds an inner minimum within 0.1 % of its loss in a few runs, on either side of 1/ln L', () => {
    for (const m of [0.07, 0.13, 0.5, 1.7]) {
      const f = (s: number): number => 2 + (s - m) ** 2;
      const { search, runs } = run(f);
      assert.equal(search.state(), 'found', `minimum at ${m}`);
      assert.ok(search.best().loss - 2 <= 2e-3 * 2, `minimum at ${m}: best s ${search.best().s}, loss ${search.best().loss}`);
      assert.ok(runs <= 10, `minimum at ${m}: ${runs} runs`);
    }
  });

  it('says no gain where the loss rises from s = 0, and out of reach where it still falls at the largest s', () => {
    assert.equal(run((s) => 3 + s).search.state(), 'no gain');
    assert.equal(run((s) => 3 + s).search.best().s, 0);
    const falling = run((s) => 3 - s, 1);
    assert.equal(falling.search.state(), 'out of reach');
    assert.equal(falling.search.best().s, 1);
  });
});
