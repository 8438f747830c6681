/**
 * 3-D [B·H, Tq, Tk] logits whose head count is only in the symbolic shape (a Reshape to [T, Mul(batch, H), D]) and
 * key padding masks merged into them (fixtures/torch/make_torch_mha.py): torch nn.TransformerEncoder and
 * nn.TransformerDecoder (mask as [B·H, 1, Tk], causal plus padding in one 3-D mask, cross attention over a padded
 * memory) and fairseq's attention (mask in a [B, H, T, S] view between reshapes). Each site must report 4 heads
 * and count the unpadded keys; the padded batches, patched with one s, per-head s and per-layer s, match PyTorch's
 * SSMax, where n is each row's visible keys.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { readModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { decode, loadRef, TORCH } from './support/ref';
import { outputsOf } from './support/refrun';

const TOLERANCE = 1e-4;

/** The n mode of each site, in graph order. */
const EXPECT: Record<string, string[]> = {
  torch_encoder: ['padding', 'padding'],
  // Self attention: the causal mask and the padding mask merged into one 3-D mask; cross attention: memory padding.
  torch_decoder: ['mask', 'padding', 'mask', 'padding'],
  fairseq_encoder: ['padding', 'padding'],
  // The causal mask on the 3-D logits, the padding mask in a 4-D view: counted together in the 4-D view.
  fairseq_decoder: ['causal-padding', 'causal-padding'],
};

for (const [name, modes] of Object.entries(EXPECT)) {
  describe(`torch multi-head attention fixture ${name}`, () => {
    const ref = loadRef(name);
    const original = readModel(path.join(TORCH, ref.model));
    it('every site: 4 heads read from the symbolic shape, n counted from the merged masks', () => {
      const { report } = patchModel(original, { s: [0.3, 0.45, 0.6, 0.75] });
      assert.deepEqual(report.sites.map((s) => s.n), modes, report.sites.map((s) => s.nReason).join('\n'));
      for (const s of report.sites) assert.equal(s.heads, 4, s.headsReason);
    });
    for (const c of ref.cases) {
      it(`${c.name}${c.patch ? ` s=${JSON.stringify(c.patch.s)}` : ''} matches PyTorch within ${TOLERANCE}`, async () => {
        const model = c.patch ? patchModel(original, { s: c.patch.s }).model : original;
        const out = await outputsOf(model, c);
        const want = decode(c.outputs.output).data as Float32Array;
        let diff = 0;
        for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(out.output.data[i] - want[i]));
        assert.ok(diff <= TOLERANCE, `max abs error ${diff} > ${TOLERANCE}`);
      });
    }
  });
}

describe('--n mask with masks of two ranks (fairseq decoder: causal on the 3-D logits, padding in a 4-D view)', () => {
  it('counts both in the 4-D view and matches PyTorch, like the cumulative causal-padding count', async () => {
    const ref = loadRef('fairseq_decoder');
    const original = readModel(path.join(TORCH, ref.model));
    const c = ref.cases.find((k) => k.patch?.s === 0.45)!;
    const { model, report } = patchModel(original, { s: 0.45, n: 'mask' });
    assert.deepEqual(report.sites.map((s) => s.n), ['mask', 'mask']);
    const out = await outputsOf(model, c);
    const want = decode(c.outputs.output).data as Float32Array;
    let diff = 0;
    for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(out.output.data[i] - want[i]));
    assert.ok(diff <= TOLERANCE, `max abs error ${diff}`);
  });
});
