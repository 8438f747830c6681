/**
 * com.microsoft Attention patched exactly by expanding it (rewrite/ms-attention.ts), checked against a numpy
 * reference of the operator's documented semantics with SSMax (fixtures/ms_attention/make_ms_attention.py, no
 * onnxruntime involved): causal GPT-2 form with a stacked cache (prompt, a chunk after a cache, one decoded token,
 * left-padded batches), every mask_index format, a shared past/present buffer, attention_bias with
 * qkv_hidden_sizes, float16. Each model: the original on onnxruntime equals the reference (where the CPU kernel
 * runs it: not the 4-D mask nor the shared buffer); the patched model with its factor at 1 equals the original
 * and the reference; patched with scalar and per-head s it equals the SSMax reference.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { parseModel, readModel, serializeModel } from '../src/io/model-file';
import { revertModel } from '../src/rewrite/revert';
import { patchModel } from '../src/rewrite/patch';
import { FIXTURES, loadRef } from './support/ref';
import { checkFixture, outputsOf, refError } from './support/refrun';
import { cli } from './support/io';
import { verifyPatch } from '../src/verify/verify';
import { SharpnessPoint } from '../src/verify/sharpness';

const DIR = path.join(FIXTURES, 'ms_attention');
const MODELS = fs.readdirSync(DIR).filter((f) => f.endsWith('.onnx')).map((f) => f.replace(/\.onnx$/, '')).sort();
/** What onnxruntime's CPU kernel does not run: the original is checked through the reference only. */
const CPU_CANNOT = new Set(['mask_4d_megatron', 'share_buffer']);

describe('com.microsoft Attention expanded, against the numpy reference of the operator', () => {
  for (const name of MODELS) {
    it(name, async () => {
      const line = await checkFixture(DIR, name, 'com.microsoft.Attention', { cpuCannot: CPU_CANNOT.has(name), tol: /fp16/.test(name) ? 2e-3 : 1e-4 });
      process.stdout.write(`# ${line}\n`);
    });
  }
});

describe('the reference catches a wrong n', () => {
  it('gpt2_causal_past patched with n = Tk (the query columns of the weights) misses the SSMax reference', async () => {
    const original = readModel(path.join(DIR, 'gpt2_causal_past.onnx'));
    const { model, report } = patchModel(original, { s: 0.45, n: 'keys' });
    assert.equal(report.sites[0].expanded, undefined);
    for (const c of loadRef('gpt2_causal_past', DIR).cases.filter((k) => k.patch?.s === 0.45 && !/decode/.test(k.name))) {
      assert.ok(refError(await outputsOf(model, c), c) > 1e-3, `${c.name}: n = Tk passes the per-row reference: the test is too weak`);
    }
  });
});

describe('--verify on the expanded GPT-2 form', () => {
  it('passes: factor-1 parity with the original node (within float rounding), retrofit parity at L with a cache', () => {
    const r = cli([path.join(DIR, 'gpt2_causal_past.onnx'), '--train-len', '16', '--verify', '--dry-run']);
    assert.equal(r.code, 0, r.stderr + r.stdout);
    const parity = /PASSED {2}wiring parity: .* max abs (\S+)[ ,]/.exec(r.stdout);
    assert.ok(parity && Number(parity[1]) < 1e-6, r.stdout);
    assert.match(r.stdout, /PASSED {2}retrofit parity/);
    assert.match(r.stdout, /verify: PASSED/);
  });

  it('--strict: every check reads the expanded site (its probe through the projected query and mask_index, its sharpness from the prompt branch)', () => {
    const r = cli([path.join(DIR, 'gpt2_causal_past.onnx'), '--train-len', '16', '--verify', '--strict', '--dry-run']);
    assert.equal(r.code, 0, r.stderr + r.stdout);
    assert.match(r.stdout, /PASSED {2}semantic probe: after = s·ln\(n\)·before at all 1 site\(s\).* padded/);
    const sharp = /PASSED {2}attention sharpness: .* original (\S+) → (\S+) .* patched (\S+) → (\S+) /.exec(r.stdout);
    assert.ok(sharp, r.stdout);
    assert.ok(Number(sharp[1]) > Number(sharp[2]) && Number(sharp[4]) > Number(sharp[2]), 'the original fades, the patched model keeps more');
    assert.match(r.stdout, /strict: PASSED/);
  });
});

describe('attention sharpness of com.microsoft Attention', () => {
  // With a factor of exactly 1 (s → 0, b = 1) the expansion's kernel and the original operator's probabilities
  // recomputed from its inputs (mask_index in each 1-D format and 3-D, a past, unidirectional, qkv_hidden_sizes) must agree.
  // The fp16 operator is recomputed in float (its constants are float), so it agrees to fp16 precision only.
  for (const name of ['mask_1d_lengths', 'mask_1d_end_start', 'mask_1d_3b2', 'mask_3d', 'gpt2_causal_past', 'bias_qkv_sizes', 'gpt2_causal_past_fp16']) {
    it(`${name}: the original's recomputed probabilities equal the expanded kernel's at factor 1, and differ at factor 1.5`, async () => {
      const original = readModel(path.join(DIR, `${name}.onnx`));
      const curve = async (b: number): Promise<SharpnessPoint[]> => {
        const patched = patchModel(original, { s: 1e-30, b, n: 'causal' }).model;
        const r = await verifyPatch(original, patched, { checks: ['sharpness'], lengths: [4, 16, 64] });
        assert.ok(r.sharpness, r.checks.map((c) => c.summary).join('\n'));
        return r.sharpness.points;
      };
      const unit = await curve(1);
      assert.equal(unit.length, 3);
      const tol = /fp16/.test(name) ? 1e-2 : 1e-6;
      for (const p of unit) assert.ok(p.original > 0 && Math.abs(p.original - p.patched) <= tol * p.original, JSON.stringify(p));
      // The factor scales q·k only (not an attention_bias), so it need not sharpen every row: it must show.
      for (const p of await curve(1.5)) assert.ok(Math.abs(p.patched - p.original) > 0.01 * p.original, JSON.stringify(p));
    });
  }
});

describe('an expanded site, patched again', () => {
  it('is found by its record: a second patch is refused, --update-s replaces s, revert after it gives back the original', async () => {
    const original = readModel(path.join(DIR, 'gpt2_causal_past.onnx'));
    const once = parseModel(serializeModel(patchModel(original, { s: [0.3, 0.4] }).model), 'patched');
    assert.throws(() => patchModel(once, { s: 0.6 }), /already patched/);
    const updated = patchModel(once, { s: [0.6, 0.2], updateS: true });
    assert.deepEqual(updated.report.sites.map((s) => s.s), [[0.6, 0.2]]);
    const fresh = patchModel(original, { s: [0.6, 0.2] }).model;
    const c = loadRef('gpt2_causal_past', DIR).cases[1];
    const [a, b] = [await outputsOf(updated.model, c), await outputsOf(fresh, c)];
    assert.deepEqual(Array.from(a.output.data), Array.from(b.output.data));
    const back = revertModel(parseModel(serializeModel(updated.model), 'updated')).model;
    assert.ok(Buffer.from(serializeModel(back)).equals(Buffer.from(serializeModel(original))));
  });
});
