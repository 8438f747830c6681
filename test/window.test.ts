/**
 * The sliding-window prior (--window W --sinks S) against PyTorch references (fixtures/torch/window.ref.json, made by
 * make_window.py): alone, with SSMax (n counts the keys the window leaves), with ALiBi on top, over a KV cache and a
 * padded batch. Then what the journal promises (revert exact), what it refuses, and verification: the wiring copy
 * drops the window, the probe counts n through it and reads its bias (in a copy with W cut below the probe runs'
 * lengths when the model's is longer), and tampered windows fail.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { readModel, serializeModel } from '../src/io/model-file';
import { ModelProto, NodeProto } from '../src/io/onnx';
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
  const probeOf = (r: { checks: { id: string; status: string; summary: string }[] }): { status: string; summary: string } => r.checks.find((c) => c.id === 'probe')!;
  const patchWith = (o: PatchOptions): { original: ModelProto; patched: ModelProto } => {
    const original = readModel(file);
    return { original, patched: patchModel(original, o).model };
  };
  const node = (m: ModelProto, name: string): NodeProto => m.graph!.node.find((n) => n.name === name) ?? assert.fail(`no node ${name}`);

  it('wiring parity holds with the window dropped, the probe reads n and the bias through it, and --strict passes', async () => {
    // W = 4 is shorter than the probe runs (12 and 7 tokens): a probe that took n = p + 1 would fail (it did).
    const { original, patched } = patchWith({ window: 4, sinks: 1, trainLen: 16 });
    const r = await verifyPatch(original, patched, { strict: true, checks: ['wiring', 'probe'] });
    assert.equal(r.checks.find((c) => c.id === 'wiring')!.status, 'PASSED');
    const probe = probeOf(r);
    assert.equal(probe.status, 'PASSED', probe.summary);
    assert.equal(r.passed, true, r.unverified.join('\n'));
    // 12 rows of 12 keys at W = 4, S = 1: rows 5 … 11 hide 1 … 7 keys, 28 a head; twice as many with batch 2 and 2 layers.
    const hidden = Number(/which hid (\d+) key/.exec(probe.summary)?.[1]);
    assert.ok(hidden >= 28 * 4 * 2 * 2, probe.summary);
    const windows = (probe as { sites?: { window?: boolean; entries: number }[] }).sites!.filter((x) => x.window);
    assert.equal(windows.length, 2);
    assert.ok(windows.every((x) => x.entries > 0));
  });

  it('a window wider than the probe runs is probed in a copy that cuts it, and the report says so', async () => {
    const { original, patched } = patchWith({ window: 4096, sinks: 4, trainLen: 16 });
    const r = await verifyPatch(original, patched, { strict: true, checks: ['probe'] });
    const probe = probeOf(r);
    assert.equal(probe.status, 'PASSED', probe.summary);
    assert.match(probe.summary, /in a copy with W = 4, S = 2 for the model's W = 4096, S = 4/);
    assert.equal(r.passed, true, r.unverified.join('\n'));
  });

  it('a window whose n is miscounted fails the probe', async () => {
    const { original, patched } = patchWith({ window: 4, sinks: 1, trainLen: 16 });
    // n = min(p + 1, W) + min(W, p + 1) instead of + min(S, max(0, p + 1 − W)): the sinks term read wrongly.
    const add = patched.graph!.node.find((n) => n.output[0].includes('n_windowed'))!;
    add.input[1] = add.input[0];
    const probe = probeOf(await verifyPatch(original, patched, { checks: ['probe'] }));
    assert.equal(probe.status, 'FAILED', probe.summary);
  });

  it('a bias that keeps one key too many, or drops the sinks, fails the window probe naming the key', async () => {
    for (const [what, tamper] of [
      ['off by one', (m: ModelProto) => { node(m, 'ssmax/shared/in_window').opType = 'LessOrEqual'; }],
      ['no sinks', (m: ModelProto) => { const or = node(m, 'ssmax/shared/window_keep'); or.input[1] = or.input[0]; }],
    ] as const) {
      const { original, patched } = patchWith({ window: 4096, sinks: 2, trainLen: 16 });
      tamper(patched);
      const probe = probeOf(await verifyPatch(original, patched, { checks: ['probe'] }));
      assert.equal(probe.status, 'FAILED', `${what}: ${probe.summary}`);
      assert.match(probe.summary, /window: .*key \d+: the window added .*expected its bias = .*recomputed from W = 4, S = 2 \(the probe copy's; the model has W = 4096, S = 2\)/, what);
    }
  });

  it('a window nothing reads any more fails: its Add alone would probe right', async () => {
    const { original, patched } = patchWith({ window: 4, trainLen: 16 });
    const add = node(patched, 'ssmax/L1/window');
    for (const n of patched.graph!.node) n.input = n.input.map((i) => (i === add.output[0] ? add.input[0] : i));
    const probe = probeOf(await verifyPatch(original, patched, { checks: ['probe'] }));
    assert.equal(probe.status, 'FAILED', probe.summary);
    assert.match(probe.summary, /layer 1: .*no longer reads the window's Add .*the window hides nothing/);
  });
});
