/**
 * The presets against PyTorch references of their published formulas (fixtures/torch/presets.ref.json, made by
 * make_presets.py): Qwen's log-n attention, Llama 4's attention temperature tuning on selected layers, and the
 * bias variant of SSMax; with a KV cache for Qwen.
 */
import assert from 'node:assert/strict';
import { cliError } from './support/io';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { encodeModel, readModel } from '../src/io/model-file';

import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { Runner } from '../src/verify/run';
import { layersValue } from '../src/cli/values';
import { decode, RefCase, TORCH } from './support/ref';
import { factorValue, resolvePreset } from '../src/policy/factor';
import { ModelProto } from '../src/io/onnx';
import { OutputTensor } from '../src/verify/run';

/**
 * A slope patch's rows with n ≤ L give the original model's logits bit for bit (its factor is exactly 1 there, not
 * 1 ± an ulp); every other row differs (n = L + 1 among them), so the case can tell a factor that stays 1 too long.
 */
async function checkRowsAtMostL(c: PresetCase, original: ModelProto, patched: OutputTensor): Promise<void> {
  const runner = await Runner.create(encodeModel(original), `${c.name} original`);
  const plain = (await runner.run(Object.fromEntries(Object.entries(c.inputs).map(([k, v]) => [k, decode(v)])))).logits;
  await runner.release();
  const [batch, rows, vocab] = plain.dims;
  // Row 0 without a cache sees one key: its probability is 1 whatever its factor (n = Tk in keys mode).
  const first = 'past_key_0' in c.inputs ? 0 : 1;
  for (let r = 0; r < rows; r++) {
    let diff = 0;
    for (let b = 0; b < batch; b++) for (let v = 0; v < vocab; v++) {
      const i = (b * rows + r) * vocab + v;
      diff = Math.max(diff, Math.abs(patched.data[i] - plain.data[i]));
    }
    if (c.rows_at_most_L!.includes(r)) assert.equal(diff, 0, `row ${r} (n ≤ L): differs from the original by ${diff}`);
    else if (r >= first) assert.ok(diff > 1e-3, `row ${r} (n > L): equals the original (max abs ${diff})`);
  }
}

/**
 * The reference's patch, with --layers as the command line spells it; a slope case lists the query rows whose n ≤ L
 * (where its factor is exactly 1).
 */
interface PresetCase extends Omit<RefCase, 'patch'> { model: string; patch: Omit<PatchOptions, 'layers'> & { layers?: string }; rows_at_most_L?: number[] }

const cases = (JSON.parse(fs.readFileSync(path.join(TORCH, 'presets.ref.json'), 'utf8')) as { cases: PresetCase[] }).cases;

describe('presets against PyTorch references', () => {
  for (const c of cases) {
    it(`${c.name}: ${JSON.stringify(c.patch)}`, async () => {
      const original = readModel(path.join(TORCH, c.model));
      const { model, report } = patchModel(original, { ...c.patch, layers: layersValue(c.patch.layers) });
      if (c.patch.layers) assert.deepEqual(report.sites.map((s) => s.layer), [1]);
      const runner = await Runner.create(encodeModel(model), c.name);
      const feeds = Object.fromEntries(Object.entries(c.inputs).map(([k, v]) => [k, decode(v)]));
      const out = await runner.run(feeds);
      await runner.release();
      for (const [name, t] of Object.entries(c.outputs)) {
        const want = decode(t).data as Float32Array;
        let diff = 0;
        for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(out[name].data[i] - want[i]));
        assert.ok(diff <= 1e-4, `${name}: max abs error ${diff}`);
      }
      if (c.rows_at_most_L) await checkRowsAtMostL(c, original, out.logits);
    });
  }

  it('slope: factorValue is exactly 1 for n ≤ L and 1 + s·ln(n / L) beyond', () => {
    const p = resolvePreset({ preset: 'slope', trainLen: 64 });
    for (const n of [1, 2, 63, 64]) assert.equal(factorValue(p, 0.7, n), 1);
    assert.ok(Math.abs(factorValue(p, 0.7, 65) - (1 + 0.7 * Math.log(65 / 64))) < 1e-15);
    assert.ok(Math.abs(factorValue(p, 0.5, 1024) - (1 + 0.5 * 4 * Math.LN2)) < 1e-15);
    assert.throws(() => patchModel(readModel(path.join(TORCH, 'llama_gqa.onnx')), { preset: 'slope', s: 0.5 }), cliError(/--preset slope needs --train-len/));
  });

  it('qwen-logn needs --train-len; llama4 refuses --s; --b only with ssmax', () => {
    const m = readModel(path.join(TORCH, 'llama_gqa.onnx'));
    assert.throws(() => patchModel(m, { preset: 'qwen-logn', s: 0.3 }), cliError(/qwen-logn needs --train-len/));
    assert.throws(() => patchModel(m, { preset: 'llama4', s: 0.3 }), cliError(/llama4 preset takes --attn-scale/));
    assert.throws(() => patchModel(m, { preset: 'llama4', b: 0.1 }), cliError(/--b applies to --preset ssmax only/));
    // @ts-expect-error a preset the types do not know: refused at run time too, for JavaScript callers
    assert.throws(() => patchModel(m, { preset: 'yarn', s: 0.3 }), cliError(/--preset must be/));
    assert.throws(() => patchModel(m, { preset: 'qwen-logn', trainLen: 8, n: 'keys' }), /defined on positions/);
  });

  it('--layers selects layers and reports the others as skipped', () => {
    const m = readModel(path.join(TORCH, 'llama_gqa.onnx'));
    const { report } = patchModel(m, { s: 0.3, layers: [0] });
    assert.deepEqual(report.sites.map((s) => s.layer), [0]);
    assert.match(report.skipped.find((s) => /layers\.1/.test(s.node))!.reason, /not among the layers asked for \(0\)/);
    assert.throws(() => patchModel(m, { s: 0.3, layers: [5] }), /the model has 2 attention layers/);
    assert.throws(() => patchModel(m, { s: 0.3, layers: { every: 4 } }), /selects none/);
    // @ts-expect-error layer names are no layers
    assert.throws(() => patchModel(m, { s: 0.3, layers: ['one', 'two'] }), /must list layer indices/);
  });
});
