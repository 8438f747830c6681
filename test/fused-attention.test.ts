/**
 * Plain-op attention that onnxruntime fuses at session start is written as com.microsoft MultiHeadAttention with
 * the scaled query (rewrite/fuse-attention.ts): on a BERT encoder built the way onnxruntime's AttentionFusion
 * matches it (bench/bert.ts), the patch keeps every layer fused, computes what the same patch in plain ops
 * computes at 2,048 tokens and with padding, reverts to the original's bytes, and verification runs the model as
 * written: a fused operator with a wrong scale fails wiring parity.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import * as ort from 'onnxruntime-node';
import { buildBert } from '../bench/bert';
import { InputError } from '../src/errors';
import { decodeModel, encodeModel, serializeModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { revertModel, unfusedModel } from '../src/rewrite/revert';
import { verifyPatch } from '../src/verify/verify';
import { removeScratch, tmpdir } from './support/io';
import { bypassFactors } from './support/tamper';

after(removeScratch);

const CFG = { layers: 2, heads: 4, hidden: 64, vocab: 100, qkGain: 2 };
const original = buildBert(CFG);
const fused = patchModel(original, { trainLen: 64 });
const plain = patchModel(original, { trainLen: 64, fusedAttention: 'off' });

const count = (m: ModelProto, op: string): number => m.graph!.node.filter((n) => n.opType === op).length;

async function optimisedOps(m: ModelProto, file: string): Promise<Record<string, number>> {
  const s = await ort.InferenceSession.create(encodeModel(m), { optimizedModelFilePath: file, logSeverityLevel: 3 });
  await s.release();
  const out: Record<string, number> = {};
  for (const n of decodeModel(fs.readFileSync(file)).graph!.node) out[n.opType] = (out[n.opType] ?? 0) + 1;
  return out;
}

async function run(m: ModelProto, ids: number[], mask: number[], batch: number): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(encodeModel(m), { logSeverityLevel: 3 });
  const seq = ids.length / batch;
  const feeds = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [batch, seq]),
    attention_mask: new ort.Tensor('int64', BigInt64Array.from(mask.map(BigInt)), [batch, seq]),
  };
  const out = await s.run(feeds);
  await s.release();
  return out[s.outputNames[0]].data as Float32Array;
}

const maxAbs = (a: Float32Array, b: Float32Array): number => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

describe('plain-op attention onnxruntime fuses stays fused after the patch', () => {
  const dir = tmpdir('ssmax-fused-attention-');

  it('writes each layer as MultiHeadAttention on the scaled query, and says so', () => {
    assert.deepEqual(fused.report.sites.map((s) => Boolean(s.fused)), [true, true]);
    assert.equal(count(fused.model, 'MultiHeadAttention'), 2);
    assert.equal(count(fused.model, 'Softmax'), 0);
    assert.ok(fused.model.opsetImport.some((o) => o.domain === 'com.microsoft'));
    assert.equal(count(plain.model, 'MultiHeadAttention'), 0);
    assert.ok(plain.report.sites.every((s) => !s.fused));
  });

  it('onnxruntime fuses the original and the patch alike', async () => {
    const before = await optimisedOps(original, path.join(dir, 'original.opt.onnx'));
    const after = await optimisedOps(fused.model, path.join(dir, 'fused.opt.onnx'));
    const offAfter = await optimisedOps(plain.model, path.join(dir, 'plain.opt.onnx'));
    assert.equal(before.Attention, 2, JSON.stringify(before));
    assert.equal(after.MultiHeadAttention, 2, JSON.stringify(after));
    assert.equal(offAfter.Attention ?? 0, 0, 'the plain patch loses the fusion, which is why the fused form exists');
  });

  for (const [label, batch, seq, padded] of [['one sequence of 2,048 tokens', 1, 2048, 0], ['two sequences of 128, one padded by 37', 2, 128, 37]] as const) {
    it(`computes what the plain-op patch computes: ${label}`, async () => {
      const ids = Array.from({ length: batch * seq }, (_, i) => (i * 7919) % CFG.vocab);
      const mask = Array.from({ length: batch * seq }, (_, i) => (i >= (batch - 1) * seq + seq - padded ? 0 : 1));
      const [a, b, o] = await Promise.all([run(fused.model, ids, mask, batch), run(plain.model, ids, mask, batch), run(original, ids, mask, batch)]);
      assert.ok(maxAbs(a, b) <= 1e-5, `fused vs plain: max abs ${maxAbs(a, b)}`);
      // Beyond L = 64 the factor is not 1: the patch changes the output, fused or not.
      assert.ok(maxAbs(a, o) > 1e-2, `patched vs original: max abs ${maxAbs(a, o)}`);
    });
  }

  it('revert gives back the original byte for byte', () => {
    assert.deepEqual(Buffer.from(serializeModel(revertModel(fused.model).model)), Buffer.from(serializeModel(original)));
  });

  it('the plain-op form verification reads has the Softmax back and no fused operator', () => {
    const unfused = unfusedModel(fused.model)!;
    assert.equal(count(unfused, 'Softmax'), 2);
    assert.equal(count(unfused, 'MultiHeadAttention'), 0);
    assert.equal(unfusedModel(plain.model), null);
  });

  it('verification passes the fused patch, and fails one whose fused operator computes something else', async () => {
    const report = await verifyPatch(original, fused.model, { maxLen: 256 });
    assert.equal(report.passed, true, JSON.stringify(report.checks.map((c) => [c.id, c.status, c.summary])));
    assert.ok(report.notes.some((n) => /2 site\(s\) are written as com\.microsoft MultiHeadAttention/.test(n)));
    const broken = structuredClone(fused.model);
    for (const n of broken.graph!.node.filter((x) => x.opType === 'MultiHeadAttention')) {
      const scale = n.attribute.find((a) => a.name === 'scale')!;
      scale.f = (scale.f ?? 0) * 3;
    }
    const bad = await verifyPatch(original, broken, { maxLen: 256 });
    assert.equal(bad.checks.find((c) => c.id === 'wiring')!.status, 'FAILED');
  });

  // The other checks read the plain-op form, which has the factor: only the written model shows the bypass.
  it('verification fails a fused patch whose MultiHeadAttention reads the unscaled query', async () => {
    const bypassed = structuredClone(fused.model);
    bypassFactors(bypassed);
    const bad = await verifyPatch(original, bypassed, { maxLen: 256 });
    const wiring = bad.checks.find((c) => c.id === 'wiring')!;
    assert.equal(wiring.status, 'FAILED', wiring.summary);
    assert.match(wiring.summary, /does not compute what its plain-op form computes past L/);
  });

  it('refuses an unknown mode', () => {
    assert.throws(() => patchModel(original, { trainLen: 64, fusedAttention: 'on' as 'auto' }), (e) => e instanceof InputError && /fusedAttention \(on\): expected auto or off/.test(e.message));
  });
});
