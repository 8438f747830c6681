/**
 * The semantic probe passes on correct patches (keys and causal n, per-head s, 3-D logits, padded batches,
 * KV-cache prefill and decoding) and catches patches mis-wired by editing a patched fixture: the wrong n,
 * per-head s in the wrong order, and the factor on the wrong axis, each with a message that says what is wrong.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { makeTensor, readTensor } from '../src/graph/tensor';
import { readModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { readRecord, writeRecord } from '../src/rewrite/record';
import { topoSort } from '../src/graph/toposort';
import { CheckResult, verifyPatch } from '../src/verify/verify';
import { TORCH } from './support/ref';
import { buildBert } from '../bench/bert';
import { moveFactorToLogits, reverseHeadsOfS, scaleS, useSOf } from './support/tamper';

const fixture = (name: string): ModelProto => readModel(path.join(TORCH, `${name}.onnx`));
const PER_HEAD = [0.2, 0.3, 0.4, 0.5];

/** Rewrites the values of every initializer whose name matches `pattern`. */
function editInitializers(m: ModelProto, pattern: RegExp, edit: (values: number[]) => number[]): void {
  let edited = 0;
  m.graph!.initializer = m.graph!.initializer.map((t) => {
    if (!pattern.test(t.name)) return t;
    edited++;
    const c = readTensor(t)!;
    return makeTensor(t.name, t.dataType, c.dims, edit(c.values));
  });
  assert.ok(edited > 0, `no initializer matches ${pattern}`);
}

async function probe(original: ModelProto, patched: ModelProto): Promise<CheckResult> {
  const r = await verifyPatch(original, patched, { checks: ['probe'] });
  return r.checks.find((c) => c.id === 'probe')!;
}

function assertFails(c: CheckResult, ...patterns: RegExp[]): void {
  assert.equal(c.status, 'FAILED', c.summary);
  for (const p of patterns) assert.match(c.summary, p);
}

describe('semantic probe', () => {
  it('passes on keys n with per-head s over a padded batch (bert_encoder)', async () => {
    const original = fixture('bert_encoder');
    const c = await probe(original, patchModel(original, { n: 'keys', s: PER_HEAD }).model);
    assert.equal(c.status, 'PASSED', c.summary);
    assert.match(c.summary, /padded/);
    assert.equal(c.sites!.length, 2);
    // The factor sits on the query, which the probe reads (issue 9: its rows scale the logits' rows exactly, with no
    // rounding of two dot products to allow for): 4 heads × head size 8 per row, for a plain and a padded batch at
    // 12 tokens and a batch at 7, so each site sees two key counts.
    assert.ok(c.sites!.every((s) => s.entries === 2 * 4 * (12 * 2 + 7) * 8), JSON.stringify(c.sites!.map((s) => s.entries)));
    assert.ok(c.sites!.every((s) => s.maxRelError < 1e-6), JSON.stringify(c.sites!.map((s) => s.maxRelError)));
    assert.ok(c.sites!.every((s) => s.maxScaledError < 1e-6), JSON.stringify(c.sites!.map((s) => s.maxScaledError)));
    assert.match(c.summary, /; max error \d\.\de[-+]\d+ of a row's largest value$/);
  });

  it('counts masked keys as the patch does when attention is peaked and the factor is on the query (logits 30 apart)', async () => {
    // Q and K weights 4× a BERT's: content logits of one row spread over more than 30, which the masked logits alone
    // would take for masked keys (the probe then expected n = 10 of 12 on an unpadded run); the masks' terms are
    // read as masked − content instead, as the patch counts them.
    const original = buildBert({ layers: 2, heads: 4, hidden: 64, vocab: 100, qkGain: 4 });
    for (const fusedAttention of ['auto', 'off'] as const) {
      const patched = patchModel(original, { trainLen: 64, fusedAttention });
      assert.equal(patched.report.sites[0].n, 'padding');
      const c = await probe(original, patched.model);
      assert.equal(c.status, 'PASSED', `${fusedAttention}: ${c.summary}`);
      assert.match(c.summary, /padded/);
    }
  });

  it('passes on per-head s tiled over 3-D [B·H, Tq, Tk] logits (encoder_3d)', async () => {
    const original = fixture('encoder_3d');
    const c = await probe(original, patchModel(original, { n: 'keys', s: PER_HEAD }).model);
    assert.equal(c.status, 'PASSED', c.summary);
  });

  it('passes on causal n with a KV cache: prefill after past > 0 and one-token decoding (gpt2_past)', async () => {
    const original = fixture('gpt2_past');
    const c = await probe(original, patchModel(original, { trainLen: 64 }).model);
    assert.equal(c.status, 'PASSED', c.summary);
    assert.match(c.summary, /seq=3 past=7/);
    assert.match(c.summary, /seq=1 past=8/);
  });

  it('catches a keys factor where the record declares causal n', async () => {
    const original = fixture('gpt2_past');
    const keys = patchModel(original, { trainLen: 64, n: 'keys' }).model;
    writeRecord(keys, readRecord(patchModel(original, { trainLen: 64, n: 'causal' }).model)!);
    const c = await probe(original, keys);
    assertFails(c, /^layer \d+ head \d+ row \d+ \(batch=\d+ seq=\d+.*\): ratio [\d.]+ expected [\d.]+ \(s=0\.240, n=\d+\)/,
      /matches n = Tk \(keys mode\) although the record says causal/);
    assert.doesNotMatch(c.summary, /n = Tq/, 'past > 0 runs tell n = Tk from n = Tq');
  });

  it('catches n = Tq (the row axis read instead of the key axis) in KV-cache runs', async () => {
    const original = fixture('gpt2_past');
    const patched = patchModel(original, { trainLen: 64, n: 'keys' }).model;
    // Read the key count off the query's shape (its row axis) instead of the keys'.
    const q = patched.graph!.node.find((n) => /^ssmax\/L0\/apply/.test(n.name))!.input[0];
    patched.graph!.node.push({ opType: 'Shape', domain: '', name: 'test/q_shape', input: [q], output: ['test/q_shape'], attribute: [] });
    patched.graph!.node.find((n) => /^ssmax\/shared\/tk/.test(n.name))!.input[0] = 'test/q_shape';
    topoSort(patched.graph!);
    editInitializers(patched, /^ssmax\/shared\/last$/, () => [-2]);
    const c = await probe(original, patched);
    assertFails(c, /past=\d+/, /matches n = Tq \(the query length, not the key count\)/);
  });

  it('catches per-head s in reverse order, naming the head and the expected ratio', async () => {
    const original = fixture('bert_encoder');
    const patched = patchModel(original, { n: 'keys', s: PER_HEAD }).model;
    // The graph applies each layer's s reversed along heads; the initializers still hold them in order.
    for (const layer of [0, 1]) reverseHeadsOfS(patched, layer);
    const c = await probe(original, patched);
    // Head 0 carries s = 0.5 instead of 0.2: ratio 0.5·ln 12 = 1.242 where 0.2·ln 12 = 0.497 is expected.
    assertFails(c, /head (0 row \d+ .*ratio 1\.242 expected 0\.497 \(s=0\.200, n=12\)|3 row \d+ .*ratio 0\.497 expected 1\.242 \(s=0\.500, n=12\))/,
      /matches per-head s in reverse order/, /2 of 2 sites fail/);
  });

  it('catches the causal factor laid along keys (a [1,Tk] row instead of a [Tq,1] column)', async () => {
    const original = fixture('gpt2_decoder');
    const patched = patchModel(original, { trainLen: 64 }).model;
    moveFactorToLogits(patched);
    editInitializers(patched, /^ssmax\/(shared|L\d+)\/column$/, () => [1, -1]);
    const c = await probe(original, patched);
    assertFails(c, /ratio varies along keys from [\d.]+ \(key \d+\) to [\d.]+ \(key \d+\), expected [\d.]+ for the whole row/,
      /matches the factor indexed by key position j instead of row i/);
  });

  it('catches a factor that is not applied at all', async () => {
    const original = fixture('llama_gqa');
    const patched = patchModel(original, { trainLen: 64 }).model;
    for (const layer of [0, 1]) scaleS(patched, layer, 0);
    const c = await probe(original, patched);
    assertFails(c, /ratio 0 expected/);
    // No factor at all (after = 0): the error on the row's scale is the whole of c·before there, 1 at its largest entry.
    assert.ok(c.sites!.every((s) => Math.abs(s.maxScaledError - 1) < 1e-6), JSON.stringify(c.sites!.map((s) => s.maxScaledError)));
  });

  it('catches another layer\'s s', async () => {
    const original = fixture('llama_gqa');
    const patched = patchModel(original, { s: [[0.2, 0.2, 0.2, 0.2], [0.45, 0.45, 0.45, 0.45]] }).model;
    useSOf(patched, 0, 1);
    const c = await probe(original, patched);
    assertFails(c, /^layer 0 /, /matches s of layer 1/);
    assert.deepEqual(c.sites!.map((s) => s.passed), [false, true]);
  });
});
