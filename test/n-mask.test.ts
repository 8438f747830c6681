/**
 * n counted from the mask: in a padded batch every item must give what it gives alone without padding, because
 * its rows see the same keys. Key-count n (n = padded length) does not have that property: the test shows it fails.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { encodeModel, readModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { NOption } from '../src/policy/n-mode';
import { patchModel } from '../src/rewrite/patch';
import { Feeds } from '../src/verify/inputs';
import { Outputs, Runner } from '../src/verify/run';
import { randoms } from './support/build';
import { TORCH } from './support/ref';

const int64 = (values: number[], dims: number[]): Feeds[string] => ({ type: 'int64', dims, data: BigInt64Array.from(values.map(BigInt)) });
const f32 = (values: number[], dims: number[]): Feeds[string] => ({ type: 'float32', dims, data: Float32Array.from(values) });

async function run(model: ModelProto, feeds: Feeds): Promise<Outputs> {
  const r = await Runner.create(encodeModel(model), 'n-mask');
  const out = await r.run(feeds);
  await r.release();
  return out;
}

/** Max abs difference between rows [0, rows) of item `item` of a padded [B, T, W] output and an unpadded [1, t, W] one. */
function itemDiff(padded: Outputs[string], alone: Outputs[string], item: number, rows: number): number {
  const [, T, W] = padded.dims;
  let d = 0;
  for (let r = 0; r < rows; r++) for (let w = 0; w < W; w++) {
    d = Math.max(d, Math.abs(padded.data[(item * T + r) * W + w] - alone.data[r * W + w]));
  }
  return d;
}

const ids = (count: number, seed: number): number[] => randoms(count, seed, 1).map((x) => Math.floor((x + 1) * 31.9));

describe('n from the mask on padded batches', () => {
  const T = 12, PAD = 5;
  const idsA = ids(T, 7), idsB = ids(T - PAD, 9);
  const padMask = [...Array(T).fill(1), ...Array(T - PAD).fill(1), ...Array(PAD).fill(0)];

  for (const [name, n, expectEqual] of [
    ['bert_encoder', 'auto', true], ['bert_encoder', 'mask', true], ['bert_encoder', 'keys', false],
    ['encoder_3d', 'auto', true], ['encoder_3d', 'mask', true],
  ] as [string, NOption, boolean][]) {
    it(`${name} --n ${n}: the padded item ${expectEqual ? 'equals' : 'differs from'} the item alone`, async () => {
      const { model, report } = patchModel(readModel(path.join(TORCH, `${name}.onnx`)), { s: 0.45, n });
      if (n === 'auto') assert.equal(report.sites[0].n, 'padding');
      const batch = await run(model, {
        input_ids: int64([...idsA, ...idsB, ...Array(PAD).fill(3)], [2, T]), attention_mask: int64(padMask, [2, T]),
      });
      const alone = await run(model, { input_ids: int64(idsB, [1, T - PAD]), attention_mask: int64(Array(T - PAD).fill(1), [1, T - PAD]) });
      const d = itemDiff(batch.last_hidden_state, alone.last_hidden_state, 1, T - PAD);
      if (expectEqual) assert.ok(d < 1e-5, `max abs diff ${d}`);
      else assert.ok(d > 1e-3, `keys mode should count the padded keys (diff ${d})`);
    });
  }

  for (const n of ['auto', 'mask'] as NOption[]) {
    it(`gpt2_past --n ${n}: a right-padded item with a KV cache equals the item alone`, async () => {
      const { model, report } = patchModel(readModel(path.join(TORCH, 'gpt2_past.onnx')), { s: 0.45, n });
      if (n === 'auto') assert.equal(report.sites[0].n, 'causal-padding');
      const P = 4;
      const past = (b: number, seed: number): number[] => randoms(b * 4 * P * 8, seed, 1);
      const pastFeeds = (b: number, pick: (k: number) => number[]): Feeds => Object.fromEntries(
        ['past_key_0', 'past_value_0', 'past_key_1', 'past_value_1'].map((k, i) => [k, f32(pick(i), [b, 4, P, 8])]));
      const both = [0, 1, 2, 3].map((i) => past(2, 50 + i));
      const second = both.map((v) => v.slice(v.length / 2));
      // Item 1: its last PAD tokens are padding. Rows before them must match the item run alone.
      const batch = await run(model, {
        input_ids: int64([...idsA, ...idsB, ...Array(PAD).fill(3)], [2, T]),
        attention_mask: int64([...Array(P + T).fill(1), ...Array(P + T - PAD).fill(1), ...Array(PAD).fill(0)], [2, P + T]),
        ...pastFeeds(2, (i) => both[i]),
      });
      const alone = await run(model, {
        input_ids: int64(idsB, [1, T - PAD]), attention_mask: int64(Array(P + T - PAD).fill(1), [1, P + T - PAD]),
        ...pastFeeds(1, (i) => second[i]),
      });
      const d = itemDiff(batch.logits, alone.logits, 1, T - PAD);
      assert.ok(d < 1e-4, `max abs diff ${d}`);
    });
  }

  it('gpt2_past with masked cache entries: the cumulative count (auto) equals the general count (mask), positions do not', async () => {
    const P = 6, t = 5;
    const m = readModel(path.join(TORCH, 'gpt2_past.onnx'));
    const feeds: Feeds = {
      input_ids: int64(ids(2 * t, 11), [2, t]),
      // Item 1 may not see its first three cached keys.
      attention_mask: int64([...Array(P + t).fill(1), 0, 0, 0, ...Array(P + t - 3).fill(1)], [2, P + t]),
      ...Object.fromEntries(['past_key_0', 'past_value_0', 'past_key_1', 'past_value_1']
        .map((k, i) => [k, f32(randoms(2 * 4 * P * 8, 70 + i, 1), [2, 4, P, 8])])),
    };
    const outs = await Promise.all((['auto', 'mask', 'causal'] as NOption[]).map((n) => run(patchModel(m, { s: 0.45, n }).model, feeds)));
    const [auto, mask, causal] = outs.map((o) => o.logits.data);
    let same = 0, apart = 0;
    for (let i = 0; i < auto.length; i++) {
      same = Math.max(same, Math.abs(auto[i] - mask[i]));
      apart = Math.max(apart, Math.abs(auto[i] - causal[i]));
    }
    assert.ok(same < 1e-5, `cumulative vs general count: ${same}`);
    assert.ok(apart > 1e-3, `masked cache entries must lower n below the position (diff ${apart})`);
  });
});
