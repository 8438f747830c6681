/**
 * The sliding-window prior (--window W --sinks S) against PyTorch references (fixtures/torch/window.ref.json, made by
 * make_window.py): alone, with SSMax (n counts the keys the window leaves), with ALiBi on top, over a KV cache and a
 * padded batch. Then what the journal promises (revert exact), what it refuses, and verification: the wiring copy
 * drops the window and the probe counts n through it, and --strict fails while verify does not read the bias itself.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { readModel, serializeModel } from '../src/io/model-file';
import { windowN } from '../src/policy/window';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { verifyPatch } from '../src/verify/verify';
import { cliError } from './support/io';
import { maxCaseDiff, RefCase, runCase, TORCH } from './support/ref';

interface WindowCase extends Omit<RefCase, 'patch'> { model: string; patch: PatchOptions }
const ref = JSON.parse(fs.readFileSync(path.join(TORCH, 'window.ref.json'), 'utf8')) as { cases: WindowCase[] };


describe('the sliding window against PyTorch references', () => {
  for (const c of ref.cases) {
    it(`${c.name}: ${JSON.stringify(c.patch)}`, async () => {
      const { model, report } = patchModel(readModel(path.join(TORCH, c.model)), c.patch);
      assert.ok(report.sites.every((s) => s.window?.size === c.patch.window), 'every site carries the window');
      const diff = maxCaseDiff(await runCase(model, c), c);
      assert.ok(diff <= 1e-4, `max abs error ${diff}`);
    });
  }

  it('n counts the keys the window leaves: its last W, and the sinks older than those', () => {
    const w = { size: 4, sinks: 2 };
    assert.deepEqual([0, 1, 3, 4, 5, 6, 20].map((p) => windowN(w, p)), [1, 2, 4, 5, 6, 6, 6]);
  });
});

describe('the sliding window through the journal', () => {
  const file = path.join(TORCH, 'gpt2_decoder.onnx');

  it('revert removes the window, the prior and the factor exactly', () => {
    const patched = patchModel(readModel(file), { window: 12, sinks: 2, prior: 'alibi', trainLen: 16 }).model;
    assert.deepEqual(readRecord(patched)!.window, { size: 12, sinks: 2 });
    const back = serializeModel(revertModel(patched).model);
    assert.ok(Buffer.from(back).equals(fs.readFileSync(file)));
  });

  it('refuses what it cannot do, naming the option', () => {
    const m = readModel(file);
    assert.throws(() => patchModel(m, { sinks: 2, trainLen: 16 }), cliError(/--sinks keeps keys a window would hide: give --window too/));
    assert.throws(() => patchModel(m, { window: 0, trainLen: 16 }), cliError(/--window must be a whole number ≥ 1, got 0/));
    assert.throws(() => patchModel(m, { window: 8, sinks: -1, trainLen: 16 }), cliError(/--sinks must be a whole number ≥ 0/));
    assert.throws(() => patchModel(m, { window: 8, trainLen: 16, updateS: true }), cliError(/--update-s replaces s in place .*--window/));
    assert.throws(() => patchModel(readModel(path.join(TORCH, 'bert_encoder.onnx')), { window: 8, trainLen: 16, n: 'keys' }),
      cliError(/--window is a causal sliding window, and this site attends to every key/));
  });
});

describe('verifying a window patch', () => {
  const file = path.join(TORCH, 'gpt2_decoder.onnx');

  it('wiring parity holds with the window dropped, the probe reads n through it, and --strict says the bias is not probed', async () => {
    const original = readModel(file);
    // W = 4 is shorter than the probe runs (12 and 7 tokens): a probe that took n = p + 1 would fail (it did).
    const patched = patchModel(original, { window: 4, sinks: 1, trainLen: 16 }).model;
    const r = await verifyPatch(original, patched, { strict: true, checks: ['wiring', 'probe'] });
    const status = (id: string): string => r.checks.find((c) => c.id === id)!.status;
    assert.equal(status('wiring'), 'PASSED');
    assert.equal(status('probe'), 'PASSED');
    assert.equal(r.passed, false, 'strict fails: the window bias is not probed');
    assert.ok(r.unverified.some((u) => /sliding window's bias \(W = 4, S = 1\) is not probed/.test(u)), r.unverified.join('\n'));
  });

  it('a window whose n is miscounted fails the probe', async () => {
    const original = readModel(file);
    const patched = patchModel(original, { window: 4, sinks: 1, trainLen: 16 }).model;
    // n = min(p + 1, W) + min(W, p + 1) instead of + min(S, max(0, p + 1 − W)): the sinks term read wrongly.
    const add = patched.graph!.node.find((n) => n.output[0].includes('n_windowed'))!;
    add.input[1] = add.input[0];
    const r = await verifyPatch(original, patched, { checks: ['probe'] });
    const probe = r.checks.find((c) => c.id === 'probe')!;
    assert.equal(probe.status, 'FAILED', probe.summary);
  });
});
