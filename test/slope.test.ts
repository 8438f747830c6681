/**
 * The slope preset, c = 1 + s·max(0, ln n − ln L), through everything that knows presets: strict verification
 * (parity on every row up to L) on every torch fixture and on the fused-operator and subgraph models, per-head
 * and per-layer s, a positional prior, --update-s, revert; and wrong slope patches that verification must fail.
 * The formula itself is checked against PyTorch in presets.test.ts.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { makeTensor } from '../src/graph/tensor';
import { encodeModel, readModel } from '../src/io/model-file';
import { DataType, ModelProto } from '../src/io/onnx';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { verifyPatch, VerifyOptions, VerifyReport } from '../src/verify/verify';
import { TORCH } from './support/ref';
import * as models from './support/verify-models';
import { cliError } from './support/io';

const L = 16;
const STRICT: VerifyOptions = { strict: true, lengths: [4, L, 4 * L] };
const SLOPE: PatchOptions = { preset: 'slope', trainLen: L, s: 0.6 };
const fixtures = fs.readdirSync(TORCH).filter((f) => f.endsWith('.onnx')).sort();

const explain = (r: VerifyReport): string => [...r.checks.map((c) => `${c.status} ${c.name}: ${c.summary}`), ...r.unverified.map((u) => `unverified: ${u}`)].join('\n');

async function strictPasses(original: ModelProto, options: PatchOptions, baseline = original,
  patched = patchModel(original, options).model): Promise<VerifyReport> {
  const r = await verifyPatch(baseline, patched, STRICT);
  assert.equal(r.passed, true, explain(r));
  return r;
}

describe('slope preset: strict verification passes', () => {
  for (const file of fixtures) {
    it(file, async () => {
      const r = await strictPasses(readModel(path.join(TORCH, file)), SLOPE);
      const retrofit = r.checks.find((c) => c.id === 'retrofit')!;
      assert.equal(retrofit.status, 'PASSED');
      assert.match(retrofit.summary, /n ≤ L = 16/);
    });
  }

  for (const [name, make] of Object.entries(models)) {
    it(`${name}: slope, and slope with keys n`, async () => {
      const m = make();
      await strictPasses(m, SLOPE);
      await strictPasses(m, { ...SLOPE, n: 'keys' });
    });
  }

  it('per-head and per-layer s, a GGD prior', async () => {
    const m = readModel(path.join(TORCH, 'gpt2_past.onnx'));
    await strictPasses(m, { ...SLOPE, s: [0.3, 0.5, 0.7, 0.9] });
    await strictPasses(m, { ...SLOPE, s: [[0.3, 0.5, 0.7, 0.9], [1.1, 0.2, 0.4, 0.6]] });
    await strictPasses(m, { ...SLOPE, prior: 'ggd', theta: { alpha: -0.4, beta: 0, mu: 0.3 } });
  });

  it('the default s is 1/ln L; s given with the slope is not checked against L', () => {
    const m = readModel(path.join(TORCH, 'llama_gqa.onnx'));
    const { report, model } = patchModel(m, { preset: 'slope', trainLen: 64 });
    assert.ok(report.sites.every((s) => Math.abs((s.s as number) - 1 / Math.log(64)) < 1e-12));
    const record = readRecord(model)!;
    assert.equal(record.preset, 'slope');
    assert.equal(record.trainLen, 64);
  });
});

describe('slope preset: --update-s and revert', () => {
  const m = readModel(path.join(TORCH, 'llama_gqa.onnx'));
  const patched = patchModel(m, SLOPE).model;

  it('--update-s keeps the preset and its L, and verifies', async () => {
    const updated = patchModel(patched, { s: 1.2, updateS: true });
    assert.equal(readRecord(updated.model)!.trainLen, L);
    assert.ok(updated.report.sites.every((s) => s.s === 1.2));
    await strictPasses(m, {}, m, updated.model);
  });

  it('--update-s needs s, and refuses another L', () => {
    assert.throws(() => patchModel(patched, { updateS: true }), cliError(/--update-s on a slope patch \(L = 16, kept\): give the new --s or --s-file/));
    assert.throws(() => patchModel(patched, { updateS: true, s: 0.5, trainLen: 32 }), cliError(/the slope patch has L = 16 in its graph.*--train-len 16/));
  });

  it('revert gives the original byte for byte', () => {
    assert.ok(Buffer.from(encodeModel(revertModel(patched).model)).equals(Buffer.from(encodeModel(m))));
  });
});

/** The slope's L constant of every site set to `value` (a knee in the wrong place). */
function moveKnee(m: ModelProto, value: number): void {
  const g = m.graph!;
  const knees = g.initializer.filter((t) => /^ssmax\/(shared|L\d+)\/train_len/.test(t.name));
  assert.ok(knees.length > 0, 'no L constant');
  for (const t of knees) Object.assign(t, makeTensor(t.name, DataType.FLOAT, [], [value]));
}

describe('slope preset: wrong patches fail', () => {
  it('the knee at L/2: the factor is not 1 up to L, the probe and retrofit parity fail naming the site', async () => {
    const m = readModel(path.join(TORCH, 'gpt2_past.onnx'));
    const patched = patchModel(m, SLOPE).model;
    moveKnee(patched, L / 2);
    const r = await verifyPatch(m, patched, STRICT);
    assert.equal(r.passed, false);
    for (const name of ['probe', 'retrofit']) {
      const c = r.checks.find((x) => x.id === name)!;
      assert.equal(c.status, 'FAILED', explain(r));
      assert.match(c.summary, /layer \d/);
    }
  });

  it('the knee at 2L: the probe fails (the factor stays 1 past L)', async () => {
    const m = readModel(path.join(TORCH, 'llama_gqa.onnx'));
    const patched = patchModel(m, SLOPE).model;
    moveKnee(patched, 2 * L);
    const r = await verifyPatch(m, patched, STRICT);
    assert.equal(r.checks.find((x) => x.id === 'probe')!.status, 'FAILED', explain(r));
  });
});
