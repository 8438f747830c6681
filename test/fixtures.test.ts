/**
 * The patched PyTorch exports, run on onnxruntime, against outputs PyTorch itself computed with its attention
 * softmax replaced by SSMax (fixtures/torch/*.ref.json): keys and causal n, scalar, per-head and per-layer s,
 * with and without a KV cache, at several lengths.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { encodeModel, readModel } from '../src/io/model-file';

import { patchModel } from '../src/rewrite/patch';
import { Runner } from '../src/verify/run';
import { decode, feedsOf, loadRef, TORCH } from './support/ref';

const MODELS = ['bert_encoder', 'encoder_3d', 'gpt2_decoder', 'gpt2_past', 'llama_gqa', 'classifier'];
const TOLERANCE = 1e-4;

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

for (const name of MODELS) {
  describe(`torch fixture ${name}`, () => {
    const ref = loadRef(name);
    const original = readModel(path.join(TORCH, ref.model));
    for (const c of ref.cases) {
      it(`${c.name} matches PyTorch within ${TOLERANCE}`, async () => {
        const model = c.patch
          ? patchModel(original, { n: c.patch.n, s: c.patch.s }).model
          : original;
        const runner = await Runner.create(encodeModel(model), c.name);
        const out = await runner.run(feedsOf(c));
        await runner.release();
        for (const [output, expected] of Object.entries(c.outputs)) {
          const want = decode(expected).data as Float32Array;
          const diff = maxAbsDiff(out[output].data, want);
          assert.ok(diff <= TOLERANCE, `${output}: max abs error ${diff} > ${TOLERANCE}`);
        }
      });
    }
    it('patches exactly the attention Softmax nodes, one per layer', () => {
      const { report } = patchModel(original, { trainLen: 64 });
      assert.equal(report.sites.length, ref.num_layers);
      assert.deepEqual(report.sites.map((s) => s.layer), [...Array(ref.num_layers).keys()]);
      for (const s of report.sites) assert.equal(s.heads, ref.num_heads);
      const expected: Record<string, string> = {
        bert_encoder: 'padding', encoder_3d: 'padding', gpt2_decoder: 'causal', gpt2_past: 'causal-padding', llama_gqa: 'causal', classifier: 'keys',
      };
      for (const s of report.sites) assert.equal(s.n, expected[name], s.nReason);
      assert.equal(report.nSources, 1, 'every layer should share one computation of n');
      for (const s of report.sites) assert.equal(s.target, 'query', 'fp32 attention should be scaled on the query');
    });
  });
}

describe('classifier Softmax', () => {
  it('is skipped with its reason and keeps its original input', async () => {
    const original = readModel(path.join(TORCH, 'classifier.onnx'));
    const { model, report } = patchModel(original, { s: 0.4 });
    assert.deepEqual(report.skipped.map((s) => s.node), ['/Softmax']);
    assert.match(report.skipped[0].reason, /constant weight|not produced by MatMul of two activations/);
    const head = model.graph!.node.find((n) => n.name === '/Softmax')!;
    const before = original.graph!.node.find((n) => n.name === '/Softmax')!;
    assert.deepEqual(head.input, before.input, 'classifier Softmax input rewired');
    assert.ok(!model.graph!.node.some((n) => n.output.includes(head.input[0]) && n.name.startsWith('ssmax/')));
  });
});
