/**
 * The PyTorch exports of fixtures/torch/make_patterns.py (T5 relative bias, BLOOM ALiBi via baddbmm, SDPA-style
 * √scale on q and k with a KV cache and an MoE router, Einsum attention, attention as a model-local function):
 * patched, run on onnxruntime, and compared with PyTorch's own SSMax outputs at several lengths.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { encodeModel, readModel } from '../src/io/model-file';

import { patchModel } from '../src/rewrite/patch';
import { Runner } from '../src/verify/run';
import { decode, feedsOf, loadRef, TORCH } from './support/ref';

const TOLERANCE = 1e-4;

/** What each export must look like to the tool: its sites' kind and the Softmax nodes it must leave alone. */
const EXPECT: Record<string, { kind: string; skipped: string[]; n: string }> = {
  t5_decoder: { kind: 'Softmax', skipped: [], n: 'causal' },
  bloom_alibi: { kind: 'Softmax', skipped: [], n: 'causal' },
  sdpa_cache: { kind: 'Softmax', skipped: ['/blocks.1/mlp/Softmax'], n: 'causal' },
  // Its attention mask is a key-padding mask from the inputs: auto counts the unpadded keys.
  einsum_encoder: { kind: 'Softmax', skipped: [], n: 'padding' },
  attn_functions: { kind: 'call __main__:FnAttention', skipped: [], n: 'keys' },
};

for (const [name, expect] of Object.entries(EXPECT)) {
  describe(`torch pattern fixture ${name}`, () => {
    const ref = loadRef(name);
    const original = readModel(path.join(TORCH, ref.model));
    it('patches exactly the attention, one site per layer, and skips the rest with a reason', () => {
      const { report } = patchModel(original, { trainLen: 64 });
      assert.deepEqual(report.sites.map((s) => s.layer), [...Array(ref.num_layers).keys()]);
      for (const s of report.sites) {
        assert.equal(s.kind, expect.kind);
        assert.equal(s.heads, ref.num_heads, s.headsReason);
        assert.equal(s.n, expect.n, s.nReason);
      }
      assert.deepEqual(report.skipped.map((s) => s.node), expect.skipped);
      for (const s of report.skipped) assert.match(s.reason, /constant weight/);
    });
    for (const c of ref.cases) {
      it(`${c.name} matches PyTorch within ${TOLERANCE}`, async () => {
        const model = c.patch ? patchModel(original, { n: c.patch.n, s: c.patch.s }).model : original;
        const runner = await Runner.create(encodeModel(model), c.name);
        const out = await runner.run(feedsOf(c));
        await runner.release();
        for (const [output, expected] of Object.entries(c.outputs)) {
          const want = decode(expected).data as Float32Array;
          let diff = 0;
          for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(out[output].data[i] - want[i]));
          assert.equal(out[output].data.length, want.length);
          assert.ok(diff <= TOLERANCE, `${output}: max abs error ${diff} > ${TOLERANCE}`);
        }
      });
    }
  });
}
