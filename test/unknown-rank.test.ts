/**
 * Opset 11 Softmax with its default axis 1 over logits of unknown rank (TensorRT's test graphs): it normalises the
 * axes from 1 on as one group, so SSMax uses n = that group's size, read at run time. With [Tq, D]·[D, Tk] inputs
 * that is per-row attention with n = Tk; with a batch axis in front the Softmax normalises Tq·Tk logits together,
 * and the factor s·ln(Tq·Tk) scales exactly that group. Checked against a loop reference on onnxruntime.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DataType } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { verifyPatch } from '../src/verify/verify';
import { f32, floats, maxDiff, runOnce } from './support/attention';
import { model, node } from './support/build';

function trtAttention() {
  return model({
    nodes: [node('MatMul', ['q', 'k'], ['qk'], {}, 'mm1'), node('Softmax', ['qk'], ['p'], {}, 'sm'), node('MatMul', ['p', 'v'], ['y'], {}, 'mm2')],
    inputs: ['q', 'k', 'v'].map((name) => ({ name, type: { tensorType: { elemType: DataType.FLOAT } } })),
    outputs: [{ name: 'y', type: { tensorType: { elemType: DataType.FLOAT } } }], opset: 11,
  });
}

/** y = softmax over groups of `group` logits (c·z) times v, for [batch, Tq, D]·[batch, D, Tk] with Tq·Tk per group. */
function reference(q: Float32Array, k: Float32Array, v: Float32Array, batch: number, Tq: number, D: number, Tk: number, Dv: number, c: number,
  joint: boolean): Float64Array {
  const out = new Float64Array(batch * Tq * Dv);
  for (let b = 0; b < batch; b++) {
    const z: number[] = [];
    for (let i = 0; i < Tq; i++) for (let j = 0; j < Tk; j++) {
      let acc = 0;
      for (let d = 0; d < D; d++) acc += q[(b * Tq + i) * D + d] * k[(b * D + d) * Tk + j];
      z.push(c * acc);
    }
    const groups = joint ? [z] : Array.from({ length: Tq }, (_, i) => z.slice(i * Tk, (i + 1) * Tk));
    const p = groups.flatMap((g) => {
      const m = Math.max(...g);
      const e = g.map((x) => Math.exp(x - m));
      const sum = e.reduce((a, x) => a + x, 0);
      return e.map((x) => x / sum);
    });
    for (let i = 0; i < Tq; i++) for (let d = 0; d < Dv; d++) {
      let acc = 0;
      for (let j = 0; j < Tk; j++) acc += p[i * Tk + j] * v[(b * Tk + j) * Dv + d];
      out[(b * Tq + i) * Dv + d] = acc;
    }
  }
  return out;
}

describe('opset 11 Softmax over logits of unknown rank', () => {
  const { model: patched, report } = patchModel(trtAttention(), { s: 0.5 });

  it('is patched (no refusal), n = the normalised group\'s size', () => {
    assert.equal(report.sites.length, 1);
    assert.match(report.sites[0].nReason, /normalises the axes from 1 on as one group/);
  });

  it('[Tq, D]·[D, Tk]: each row over its Tk keys, n = Tk', async () => {
    const [Tq, D, Tk, Dv] = [5, 4, 7, 3];
    const q = floats(Tq * D, 1, 1.5), k = floats(D * Tk, 2, 1.5), v = floats(Tk * Dv, 3);
    const got = await runOnce(patched, { q: f32([Tq, D], q), k: f32([D, Tk], k), v: f32([Tk, Dv], v) }, 'y');
    assert.ok(maxDiff(got, reference(q, k, v, 1, Tq, D, Tk, Dv, 0.5 * Math.log(Tk), false)) < 1e-5);
    assert.ok(maxDiff(got, reference(q, k, v, 1, Tq, D, Tk, Dv, 1, false)) > 1e-3, 'the factor changed nothing');
  });

  it('[B, Tq, D]·[B, D, Tk]: the Softmax normalises Tq·Tk logits together; n = Tq·Tk', async () => {
    const [B, Tq, D, Tk, Dv] = [2, 3, 4, 5, 3];
    const q = floats(B * Tq * D, 4, 1.5), k = floats(B * D * Tk, 5, 1.5), v = floats(B * Tk * Dv, 6);
    const got = await runOnce(patched, { q: f32([B, Tq, D], q), k: f32([B, D, Tk], k), v: f32([B, Tk, Dv], v) }, 'y');
    assert.ok(maxDiff(got, reference(q, k, v, B, Tq, D, Tk, Dv, 0.5 * Math.log(Tq * Tk), true)) < 1e-5);
  });
});

describe('verifying a model whose inputs declare no shape', () => {
  it('synthesises each as a square [seq, seq] matrix, sweeps the sequence, says so, and a strict verification passes', async () => {
    const original = trtAttention();
    const { model: patched } = patchModel(original, { trainLen: 16 });
    const report = await verifyPatch(original, patched, { strict: true, lengths: [8, 16, 32, 64] });
    assert.deepEqual(report.checks.map((c) => [c.id, c.status]).filter(([, s]) => s !== 'PASSED'), [['sharpness', 'SKIPPED']]);
    assert.match(report.checks.find((c) => c.id === 'liveness')!.summary, /differ from the original's at 32, 64/);
    assert.deepEqual(report.inputs.map((i) => [i.name, i.dims, i.sized]), ['q', 'k', 'v'].map((n) => [n, [null, null], ['has no declared shape: synthesised as a square [seq, seq] matrix']]));
    assert.ok(report.runs.some((r) => r.id === 'batch=1 seq=64'));
    assert.equal(report.passed, true);
  });
});
