/**
 * Head counts through the reshapes exporters emit (issue 23): a fused QKV projection reshaped to [B, T, 3, H, d] with
 * dynamic B and T taken from the input's shape and constants for 3, H, d, then `q, k, v = qkv.unbind(2)` (Split on
 * axis 2 and Squeeze). The head count is read through Split and Squeeze, and per-head s is checked on onnxruntime
 * against SSMax in plain loops (test/support/attention.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DataType, ModelProto } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { Runner } from '../src/verify/run';
import { attention, bnsd, f32 as host, floats, maxDiff } from './support/attention';
import { f32, i64, model, node, value } from './support/build';

const H = 2, D = 4, E = H * D, B = 2, T = 5;
const SCALE = 1 / Math.sqrt(D);

function fusedQkv(): ModelProto {
  const perm = (p: number[]): { perm: number[] } => ({ perm: p });
  return model({
    nodes: [
      node('MatMul', ['x', 'w'], ['qkv']),
      node('Shape', ['x'], ['x_shape']), node('Slice', ['x_shape', 'zero', 'two'], ['bt']),
      node('Concat', ['bt', 'qkv_tail'], ['qkv_shape'], { axis: 0 }), node('Reshape', ['qkv', 'qkv_shape'], ['qkv5']),
      node('Split', ['qkv5'], ['q1', 'k1', 'v1'], { axis: 2 }),
      ...['q', 'k', 'v'].map((t) => node('Squeeze', [`${t}1`, 'axis2'], [`${t}0`])),
      node('Transpose', ['q0'], ['q'], perm([0, 2, 1, 3])), node('Transpose', ['k0'], ['kt'], perm([0, 2, 3, 1])),
      node('Transpose', ['k0'], ['k'], perm([0, 2, 1, 3])), node('Transpose', ['v0'], ['v'], perm([0, 2, 1, 3])),
      node('MatMul', ['q', 'kt'], ['qk']), node('Mul', ['qk', 'scale'], ['z']), node('Softmax', ['z'], ['p'], { axis: -1 }),
      node('MatMul', ['p', 'v'], ['out']),
    ],
    inputs: [value('x', DataType.FLOAT, ['batch', 'seq', E])],
    // q, k, v as outputs too: the reference is computed from them.
    // Without declared shapes: the head count must come from the graph, not from value infos.
    outputs: ['out', 'q', 'k', 'v'].map((n) => ({ name: n, type: { tensorType: { elemType: DataType.FLOAT } } })),
    initializers: [
      f32('w', [E, 3 * E], Array.from(floats(E * 3 * E, 21))), f32('scale', [], [SCALE]),
      i64('zero', [0]), i64('two', [2]), i64('qkv_tail', [3, H, D]), i64('axis2', [2]),
    ],
  });
}

describe('fused QKV reshaped to [B, T, 3, H, d] with dynamic B and T', () => {
  it('the head count is read through Split and Squeeze', () => {
    const { report } = patchModel(fusedQkv(), { s: 0.5 });
    assert.equal(report.sites[0].heads, H, report.sites[0].headsReason);
  });

  it('per-head s matches SSMax per head', async () => {
    const s = [0.4, 1.3];
    const { model: patched } = patchModel(fusedQkv(), { s });
    const runner = await Runner.create(encodeModel(patched), 'test');
    let got;
    try {
      got = await runner.run({ x: host([B, T, E], floats(B * T * E, 22)) });
    } finally {
      await runner.release();
    }
    const [q, k, v] = ['q', 'k', 'v'].map((n) => bnsd(got[n].data as Float32Array, H, T, D));
    const want = attention({
      B, N: H, Nkv: H, S: T, T, H: D, scale: SCALE, q, k, v, visible: () => true, factor: (_b, h) => s[h] * Math.log(T),
    });
    assert.ok(maxDiff(got.out.data, want) < 1e-5, `max abs error ${maxDiff(got.out.data, want)}`);
  });
});
