/**
 * The semantic probe counts the keys a Where mask hides as the patch does, by the mask's condition, where the fill
 * is a mild constant (jolt_minigpt: Where(causal bool, −10, scores)): the masked logits alone cannot tell a hidden
 * key at −10 from a low logit, and the probe read every key as visible ("expected n = Tk although the record
 * says keys" while the record says mask).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { makeTensor } from '../src/graph/tensor';
import { DataType, ModelProto, TensorProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { verifyPatch } from '../src/verify/verify';
import { f32 as f32Init, model, node, value } from './support/build';

const N = 2, S = 16, H = 4;

/** Causal attention on q, k, v [B, N, S, H] masked by Where(future, fill, scores) with a constant bool `future`. */
function masked(fill: number): ModelProto {
  const future = Array.from({ length: S * S }, (_, x) => (x % S > Math.floor(x / S) ? 1 : 0));
  return model({
    nodes: [
      node('Transpose', ['k'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q', 'kt'], ['mm']), node('Div', ['mm', 'sqrt_d'], ['scores']),
      node('Where', ['future', 'fill', 'scores'], ['masked']), node('Softmax', ['masked'], ['p'], { axis: -1 }), node('MatMul', ['p', 'v'], ['out']),
    ],
    inputs: ['q', 'k', 'v'].map((x) => value(x, DataType.FLOAT, ['B', N, S, H])), outputs: [value('out', DataType.FLOAT, ['B', N, S, H])],
    initializers: [f32Init('sqrt_d', [], [2]), f32Init('fill', [], [fill]), boolTensor('future', [1, 1, S, S], future)],
  });
}

function boolTensor(name: string, dims: number[], values: number[]): TensorProto {
  return { ...makeTensor(name, DataType.FLOAT, dims, []), dataType: DataType.BOOL, rawData: Uint8Array.from(values) };
}

describe('the probe and a mild Where fill', () => {
  for (const fill of [-10, -1e9]) {
    it(`Where(causal, ${fill}, scores): the probe expects the causal counts the record's mask mode gives`, async () => {
      const m = masked(fill);
      const { model: patched, report } = patchModel(m, { trainLen: 8 });
      assert.equal(report.sites[0].n, 'mask');
      const r = await verifyPatch(m, patched, { checks: ['probe'] });
      const probe = r.checks.find((c) => c.id === 'probe')!;
      assert.equal(probe.status, 'PASSED', probe.summary);
    });
  }
});
