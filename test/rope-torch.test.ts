/**
 * `--rope` against PyTorch (fixtures/torch/make_rope.py): a Llama-style decoder exported in the two forms exporters
 * write RoPE in (cos/sin tables gathered by position ids; the angles computed in forward), and its torch outputs
 * with RoPE rescaled by Hugging Face's formulas written out in Python. The patched models must compute the same
 * logits on onnxruntime, verify --strict must pass, and revert must restore the file byte for byte.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { readModel, serializeModel } from '../src/io/model-file';
import { RopeMethod } from '../src/policy/rope';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { revertModel } from '../src/rewrite/revert';
import { verifyPatch } from '../src/verify/verify';
import { maxCaseDiff, RefTensor, runCase, TORCH } from './support/ref';

interface RopeRef {
  model: string; scale: number; trainLen: number; inputs: Record<string, RefTensor>;
  cases: { method: RopeMethod | null; outputs: Record<string, RefTensor> }[];
}

/** |logits| reach about 16; the patched models are 0.9–2.1e-5 from PyTorch (fp32 angles, sums in another order). */
const TOLERANCE = 1e-4;

for (const [name, form] of [['rope_cached', 'the cos/sin tables gathered by position ids'], ['rope_inline', 'the angles computed in the graph']]) {
  describe(`--rope on a PyTorch export with ${form} (fixtures/torch/${name}.onnx)`, () => {
    const ref = JSON.parse(fs.readFileSync(path.join(TORCH, `${name}.ref.json`), 'utf8')) as RopeRef;
    const file = path.join(TORCH, ref.model);
    const io = (c: RopeRef['cases'][number]): Parameters<typeof runCase>[1] => ({ name: String(c.method), inputs: ref.inputs, outputs: c.outputs });
    const [plain, ...rescaled] = ref.cases;

    it('the original matches PyTorch, and each rescaling changes its logits by far more than the tolerance', async () => {
      assert.ok(maxCaseDiff(await runCase(readModel(file), io(plain)), io(plain)) <= TOLERANCE);
      for (const c of rescaled) assert.ok(maxCaseDiff(await runCase(readModel(file), io(c)), io(c)) > 100 * TOLERANCE, `${c.method} changes nothing`);
    });

    for (const c of rescaled) {
      it(`${c.method} ×${ref.scale}: the patched model computes PyTorch's logits; verify --strict passes; revert is byte-exact`, async () => {
        const original = readModel(file);
        const options: PatchOptions = { preset: 'none', rope: c.method!, ropeScale: ref.scale, ...(c.method === 'yarn' ? { trainLen: ref.trainLen } : {}) };
        const { model, report } = patchModel(original, options);
        assert.equal(report.rope!.sites.length, 1);
        assert.equal(Boolean(report.rope!.sites[0].table), name === 'rope_cached', 'the form read');
        const diff = maxCaseDiff(await runCase(model, io(c)), io(c));
        assert.ok(diff <= TOLERANCE, `max abs difference from PyTorch ${diff}`);
        const r = await verifyPatch(original, model, { strict: true });
        assert.equal(r.passed, true, r.checks.map((x) => `${x.status} ${x.id}: ${x.summary}`).join('\n'));
        assert.ok(Buffer.from(serializeModel(revertModel(model).model)).equals(fs.readFileSync(file)));
      });
    }
  });
}

describe('the tables\' cap (fixtures/torch/rope_cached.onnx: 128 rows)', () => {
  const file = path.join(TORCH, 'rope_cached.onnx');
  const tokens = (T: number): Parameters<typeof runCase>[1] => ({
    name: `${T} tokens`, outputs: {},
    inputs: Object.fromEntries(([['input_ids', (i: number) => (i * 7) % 64], ['position_ids', (i: number) => i]] as const).map(([k, f]) => [k, {
      dtype: 'int64' as const, dims: [1, T], data: Buffer.from(BigInt64Array.from({ length: T }, (_, i) => BigInt(f(i))).buffer).toString('base64'),
    }])),
  });

  it('is named as RoPE\'s, with --rope as what lifts it; the recomputed tables run 300 tokens where the original cannot', async () => {
    const original = readModel(file);
    assert.match(patchModel(original, { trainLen: 128 }).report.lengths!.message,
      /exceed 128 \(RoPE's table '.*' \(cos or sin by position\) has 128 rows\).*the cap is the model's own: --rope pi\|ntk\|yarn recomputes the rotary caches/);
    const { model, report } = patchModel(original, { preset: 'none', rope: 'ntk', ropeScale: 4 });
    assert.equal(report.rope!.sites[0].table!.newRows, 512);
    const out = await runCase(model, tokens(300));
    assert.ok(out.logits.data.length === 300 * 64 && Array.from(out.logits.data).every(Number.isFinite));
    await assert.rejects(runCase(original, tokens(300)), /out of data bounds|indices/);
  });
});
