/**
 * RoPE rescaled by the patch (`--rope pi|ntk|yarn`, policy/rope.ts): on the LM benchmark's RoPE model the patched
 * model computes what an edit of its frequency constant computes (test/support/rope-edit.ts, another path: the
 * constant replaced, no nodes added; the formulas are checked against Hugging Face's in
 * lm-models.test.ts); revert restores the file byte for byte; verification passes --strict, with the frequencies
 * and YaRN's factor probed; wrong rescalings fail; what cannot be rescaled is refused naming why.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { lmModel } from '../bench/lm-loss';
import { rescaleRope } from './support/rope-edit';
import { makeTensor } from '../src/graph/tensor';
import { readModel, serializeModel } from '../src/io/model-file';
import { ModelProto, toNumber } from '../src/io/onnx';
import { cloneModel, patchModel, PatchOptions } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { Runner } from '../src/verify/run';
import { makeHost } from '../src/verify/tensors';
import { verifyPatch, VerifyReport } from '../src/verify/verify';
import { cliError, removeScratch, tmpdir } from './support/io';
import { CORPUS, corpusSkip } from './support/ref';

const L = 128;
const file = lmModel('rope-s0');
const dir = tmpdir('ssmax-rope-');
after(removeScratch);

const ids = makeHost('int64', [1, 600], Array.from({ length: 600 }, (_, i) => (i * 37 + (i >> 3)) % 256));

async function logits(model: ModelProto | string): Promise<Float32Array | Float64Array> {
  const r = typeof model === 'string' ? await Runner.create(model, 'rope') : await Runner.fromModel(model, 'rope');
  try {
    return (await r.run({ input_ids: ids })).logits.data;
  } finally {
    await r.release();
  }
}

const explain = (r: VerifyReport): string => r.checks.map((c) => `${c.status} ${c.id}: ${c.summary}`).join('\n');
const patched = (o: PatchOptions): ModelProto => patchModel(readModel(file), o).model;

describe('RoPE rescaled by the patch', () => {
  for (const method of ['pi', 'ntk', 'yarn'] as const) {
    it(`${method}: outputs equal an edit of the frequency constant in place; revert is byte-exact`, async () => {
      const m = patched({ preset: 'none', rope: method, ropeScale: 16, ...(method === 'yarn' ? { trainLen: L } : {}) });
      const theirs = await logits(rescaleRope(file, method, 16, L, path.join(dir, `${method}.onnx`)));
      const ours = await logits(m);
      let worst = 0;
      ours.forEach((x, i) => { worst = Math.max(worst, Math.abs(x - theirs[i])); });
      assert.ok(worst <= 2e-4, `max abs difference ${worst}`);
      const original = await logits(file);
      assert.ok(ours.some((x, i) => Math.abs(x - original[i]) > 1e-2), 'the rescaling changes the outputs');
      assert.deepEqual(readRecord(m)!.rope!.method, method);
      assert.ok(Buffer.from(serializeModel(revertModel(m).model)).equals(fs.readFileSync(file)));
    });
  }

  it('refuses what it cannot do, naming why', () => {
    const m = readModel(file);
    assert.throws(() => patchModel(readModel(lmModel('nope-s0')), { preset: 'none', rope: 'ntk' }), cliError(/--rope ntk: no Cos or Sin of positions × a constant of frequencies/));
    assert.throws(() => patchModel(m, { trainLen: L, ropeScale: 8 }), cliError(/--rope-scale sets how far --rope rescales RoPE: give --rope too/));
    assert.throws(() => patchModel(m, { trainLen: L, rope: 'ntk', ropeScale: 1 }), cliError(/--rope-scale must be a number > 1/));
    assert.throws(() => patchModel(m, { preset: 'none', rope: 'yarn' }), cliError(/--rope yarn ramps the frequencies by how often they turn within L: give --train-len/));
    assert.throws(() => patchModel(m, { preset: 'none', rope: 'pi', trainLen: L }), cliError(/--preset none has no s: --s and --train-len would be ignored/));
    assert.throws(() => patchModel(m, { rope: 'linear' as never, trainLen: L }), cliError(/--rope must be pi, ntk, yarn, got 'linear'/));
  });
});

describe('RoPE of a PyTorch dynamo export (corpus xe_llama_export_static: FusedMatMul of positions and Unsqueeze(inv_freq), the angles concatenated from two products)', () => {
  const corpusFile = path.join(CORPUS, 'xe_llama_export_static.onnx');
  it('YaRN: one constant rescaled, verify --strict passes with the frequencies probed, revert is byte-exact', { skip: corpusSkip('xe_llama_export_static.onnx') }, async () => {
    const original = readModel(corpusFile);
    const { model, report } = patchModel(original, { trainLen: 64, rope: 'yarn', ropeScale: 4 });
    assert.deepEqual(report.rope!.sites.map((r) => r.constant), ['b_model_layers_0_self_attn_rotary_emb_inv_freq']);
    const r = await verifyPatch(original, model, { strict: true });
    assert.equal(r.passed, true, explain(r));
    assert.match(r.checks.find((c) => c.id === 'probe')!.summary, /RoPE frequencies = YaRN ×4 \(L = 64\)'s and cos, sin/);
    assert.ok(Buffer.from(serializeModel(revertModel(model).model)).equals(fs.readFileSync(corpusFile)));
  });
});

describe('verifying a rescaled RoPE', () => {
  const yarn = (): ModelProto => patched({ preset: 'none', rope: 'yarn', trainLen: L });

  it('alone and with SSMax: --strict passes, the frequencies and YaRN\'s factor probed, retrofit not applicable', async () => {
    for (const o of [{ preset: 'none', rope: 'yarn', trainLen: L }, { trainLen: L, rope: 'ntk', ropeScale: 8 }] as PatchOptions[]) {
      const r = await verifyPatch(readModel(file), patched(o), { strict: true, lengths: [64, 128, 512] });
      assert.equal(r.passed, true, explain(r));
      const probe = r.checks.find((c) => c.id === 'probe')!;
      assert.match(probe.summary, o.rope === 'yarn' ? /RoPE frequencies = YaRN ×16 \(L = 128\)'s and cos, sin × \(0\.1 ln s \+ 1\) at 1 constant\(s\), \d+ values/
        : /after = s·ln\(n\)·before at all 4 site\(s\).*RoPE frequencies = NTK-aware ×8's at 1 constant/);
      assert.match(r.checks.find((c) => c.id === 'retrofit')!.summary, /RoPE rescaled .* changes the angles at every position/);
      assert.equal(r.checks.find((c) => c.id === 'wiring')!.status, 'PASSED');
    }
  });

  const setInit = (m: ModelProto, name: string, f: (v: number) => number): void => {
    const g = m.graph!;
    const k = g.initializer.findIndex((t) => t.name === name);
    const t = g.initializer[k];
    const dims = t.dims.map(toNumber);
    const values = Array.from(new Float32Array(Uint8Array.from(t.rawData!).buffer)).map(f);
    g.initializer[k] = makeTensor(name, t.dataType, dims, values);
  };

  it('wrong rescalings fail the probe, naming the constant: multipliers off by 1 %, YaRN\'s factor dropped, the Mul bypassed', async () => {
    const record = readRecord(yarn())!.rope!.sites[0];
    const wrong: [string, (m: ModelProto) => void, RegExp][] = [
      ['multipliers × 1.01', (m) => setInit(m, record.factor, (v) => v * 1.01), /RoPE '.*' frequency \d+: .*YaRN ×16 \(L = 128\) gives/],
      ['YaRN\'s factor 1', (m) => setInit(m, record.mscale!, () => 1), /RoPE '.*' cos\/sin entry \d+/],
      ['the angles read the original constant', (m) => {
        const mul = m.graph!.node.find((n) => n.name === record.apply)!;
        const out = mul.output[0];
        for (const n of m.graph!.node) n.input = n.input.map((i) => (i === out && n !== mul ? record.constant : i));
      }, /still reads the original frequencies .*the rescaling is bypassed/],
    ];
    for (const [what, edit, message] of wrong) {
      const m = cloneModel(yarn());
      edit(m);
      const r = await verifyPatch(readModel(file), m, { strict: true, lengths: [64, 128, 512] });
      const probe = r.checks.find((c) => c.id === 'probe')!;
      assert.equal(probe.status, 'FAILED', `${what}: ${explain(r)}`);
      assert.match(probe.summary, message, what);
      assert.equal(r.passed, false);
    }
  });
});
