/**
 * `--cache-layout split` (issue 34): com.microsoft Attention keeps K and V stacked in one cache input and output,
 * which no kernel taking an outside query reads, so by default a decoding step runs plain ops. Split, each stacked
 * cache becomes key and value halves and the site one MultiHeadAttention on the scaled query: on the GPT-2 shape
 * onnxruntime's optimizer writes (bench/fused-gpt2.ts), the patch computes what the default patch computes (prompt,
 * decoding over a cache, padding), keeps every attention fused, reverts to the original's bytes, and verifies
 * behind the original's interface; a split whose halves are swapped fails. Models with nothing to split are refused.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import * as ort from 'onnxruntime-node';
import { buildFusedGpt2 } from '../bench/fused-gpt2';
import { InputError } from '../src/errors';
import { encodeModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel, unfusedModel } from '../src/rewrite/revert';
import { planVerification } from '../src/verify/verification-plan';
import { verifyPatch } from '../src/verify/verify';
import { cli, removeScratch, tmpdir } from './support/io';
import { bypassFactors } from './support/tamper';
import { countFused, optimisedCount } from './support/fused';
import { CORPUS, corpusSkip } from './support/ref';

after(removeScratch);

const CFG = { layers: 2, heads: 4, hidden: 64, vocab: 100 };
const L = 8;
const HD = CFG.hidden / CFG.heads;
const dir = tmpdir('ssmax-cache-layout-');
const original = buildFusedGpt2(CFG);
const split = patchModel(original, { preset: 'slope', trainLen: L, s: 0.7, cacheLayout: 'split' });
const stacked = patchModel(original, { preset: 'slope', trainLen: L, s: 0.7 });

function session(model: ModelProto): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(encodeModel(model), { logSeverityLevel: 3 });
}

/** Feeds of one step: B = 2 rows, `past` cached tokens (random), S new ones; the second row's first key padded. */
function step(past: number, S: number): { stackedFeeds: Record<string, ort.Tensor>; splitFeeds: Record<string, ort.Tensor> } {
  const B = 2, T = past + S;
  const ids = (f: (i: number) => number): ort.Tensor => new ort.Tensor('int64', BigInt64Array.from({ length: B * S }, (_, i) => BigInt(f(i))), [B, S]);
  const common = {
    input_ids: ids((i) => (i * 37) % CFG.vocab), position_ids: ids((i) => past + (i % S)),
    attention_mask: new ort.Tensor('int32', Int32Array.from({ length: B * T }, (_, i) => (i === T ? 0 : 1)), [B, T]),
  };
  const stackedFeeds: Record<string, ort.Tensor> = { ...common }, splitFeeds: Record<string, ort.Tensor> = { ...common };
  const size = B * CFG.heads * past * HD;
  for (let l = 0; l < CFG.layers; l++) {
    const data = Float32Array.from({ length: 2 * size }, (_, i) => Math.sin(i * 0.61 + l));
    stackedFeeds[`past_${l}`] = new ort.Tensor('float32', data, [2, B, CFG.heads, past, HD]);
    splitFeeds[`past_${l}.key`] = new ort.Tensor('float32', data.slice(0, size), [B, CFG.heads, past, HD]);
    splitFeeds[`past_${l}.value`] = new ort.Tensor('float32', data.slice(size), [B, CFG.heads, past, HD]);
  }
  return { stackedFeeds, splitFeeds };
}

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

describe('--cache-layout split on com.microsoft Attention with a stacked cache', () => {
  it('replaces each stacked cache by its key and value halves in the same places, and says so', () => {
    const g = split.model.graph!;
    assert.deepEqual(g.input.map((v) => v.name), ['input_ids', 'position_ids', 'attention_mask', 'past_0.key', 'past_0.value', 'past_1.key', 'past_1.value']);
    assert.deepEqual(g.output.map((v) => v.name), ['logits', 'present_0.key', 'present_0.value', 'present_1.key', 'present_1.value']);
    // [B, N, T, H]: the stacked declaration without its leading 2.
    assert.deepEqual(g.input[3].type!.tensorType!.shape!.dim.map((d) => d.dimParam || Number(d.dimValue)), ['batch', CFG.heads, 'past_sequence', HD]);
    assert.deepEqual(g.node.filter((n) => n.domain === 'com.microsoft').map((n) => n.opType).sort(), ['FastGelu', 'FastGelu', 'MultiHeadAttention', 'MultiHeadAttention']);
    assert.equal(readRecord(split.model)!.cacheLayout!.length, CFG.layers);
    assert.ok(split.report.notes.some((n) => /the model's interface changed \(cache layout split\).*'past_0' → 'past_0\.key', 'past_0\.value'/.test(n)));
    assert.ok(split.report.sites.every((s) => /its cache split into past\/present key and value/.test(String(s.expanded))));
  });

  for (const [past, S, what] of [[0, 5, 'a prompt'], [7, 1, 'one token over a cache'], [20, 1, 'one token over a longer cache'], [7, 3, 'three tokens over a cache']] as const) {
    it(`computes what the stacked patch computes: ${what}, the factor at s = 0.7 and a padded key`, async () => {
      const [a, b] = await Promise.all([session(stacked.model), session(split.model)]);
      const { stackedFeeds, splitFeeds } = step(past, S);
      const [x, y] = [await a.run(stackedFeeds), await b.run(splitFeeds)];
      assert.ok(maxDiff(x.logits.data as Float32Array, y.logits.data as Float32Array) <= 2e-6, 'logits');
      for (let l = 0; l < CFG.layers; l++) {
        const both = x[`present_${l}`].data as Float32Array;
        // Layer 0's cache is the projection's, copied; later layers' differ by the rounding of the layers before.
        assert.ok(maxDiff(both.subarray(0, both.length / 2), y[`present_${l}.key`].data as Float32Array) <= (l ? 2e-6 : 0), `present_${l} key`);
        assert.ok(maxDiff(both.subarray(both.length / 2), y[`present_${l}.value`].data as Float32Array) <= (l ? 2e-6 : 0), `present_${l} value`);
      }
      await Promise.all([a.release(), b.release()]);
    });
  }

  it('onnxruntime runs every attention fused, where the stacked patch decodes in plain ops', async () => {
    const count = async (m: ModelProto, name: string): Promise<number | string> => {
      const file = path.join(dir, `${name}.onnx`);
      fs.writeFileSync(file, encodeModel(m));
      return optimisedCount(file, path.join(dir, `${name}.opt.onnx`));
    };
    assert.equal(countFused(original.graph!), CFG.layers);
    assert.equal(await count(original, 'original'), CFG.layers);
    assert.equal(await count(split.model, 'split'), CFG.layers);
    // The stacked patch's MultiHeadAttention is the prompt branch of an If; decoding takes the plain-op branch.
    const ifs = stacked.model.graph!.node.filter((n) => n.opType === 'If');
    assert.equal(ifs.length, CFG.layers);
    assert.equal(countFused(stacked.model.graph!), CFG.layers);
    assert.equal(countFused({ ...stacked.model.graph!, node: ifs.map((n) => ({ ...n, attribute: n.attribute.filter((a) => a.name === 'then_branch') })) }), 0);
  });

  it('revert gives back the original byte for byte; the plain-op form verification reads has the stacked interface', () => {
    assert.equal(Buffer.compare(Buffer.from(encodeModel(revertModel(split.model).model)), Buffer.from(encodeModel(original))), 0);
    const plain = unfusedModel(split.model)!;
    assert.deepEqual(plain.graph!.input.map((v) => v.name), original.graph!.input.map((v) => v.name));
    assert.deepEqual(plain.graph!.output.map((v) => v.name), original.graph!.output.map((v) => v.name));
    assert.equal(readRecord(plain)!.cacheLayout, undefined);
  });

  it('verification passes the split patch behind the original\'s interface, and fails one whose halves are swapped', async () => {
    const report = await verifyPatch(original, split.model, { trainLen: L, strict: true });
    assert.ok(report.passed, JSON.stringify(report.checks.map((c) => `${c.status} ${c.id}: ${c.summary}`)));
    assert.ok(report.notes.some((n) => /caches are split \(--cache-layout split\)/.test(n)));
    const swapped = structuredClone(split.model);
    for (const n of swapped.graph!.node.filter((x) => x.opType === 'MultiHeadAttention')) [n.output[1], n.output[2]] = [n.output[2], n.output[1]];
    const bad = await verifyPatch(original, swapped, { trainLen: L });
    assert.equal(bad.passed, false);
    assert.match(bad.checks.find((c) => c.id === 'wiring')!.status, /FAILED/);
  });

  it('the verification plan lists the run where the patch as written meets its plain-op form: the first past L', () => {
    const [main] = planVerification(original, split.model, { trainLen: L }).subjects;
    const written = main.runs.filter((r) => r.reads.some((x) => x.session === 'patched as written (fused)'));
    assert.equal(written.length, 1);
    assert.deepEqual(written[0].reads.find((x) => x.session === 'patched as written (fused)')!.checks, ['wiring']);
    assert.equal(written[0].id, main.runs.find((r) => r.kind !== 'short' && r.keys > L)!.id);
  });

  it('verification fails a split patch whose MultiHeadAttention bypasses the factor (its plain-op form, read by the other checks, has it)', async () => {
    const report = await verifyPatch(original, split.model, { trainLen: L });
    assert.match(report.checks.find((c) => c.id === 'wiring')!.summary, /the patch as written \(fused\) equals its plain-op form past L/);
    const bypassed = structuredClone(split.model);
    bypassFactors(bypassed);
    const bad = await verifyPatch(original, bypassed, { trainLen: L });
    const wiring = bad.checks.find((c) => c.id === 'wiring')!;
    assert.equal(wiring.status, 'FAILED');
    assert.match(wiring.summary, /the patch as written \(fused operators\) does not compute what its plain-op form computes past L/);
    assert.equal(bad.passed, false);
  });
});

describe('--cache-layout split where nothing can be split', () => {
  it('a model without com.microsoft Attention: one line, nothing written; an unknown layout: refused', () => {
    assert.throws(() => patchModel(original, { trainLen: L, cacheLayout: 'sideways' as 'split' }), (e: unknown) => e instanceof InputError && /expected stacked or split/.test(e.message));
    const out = path.join(dir, 'bert-split.onnx');
    const r = cli([path.join(__dirname, '../../fixtures/torch/bert_encoder.onnx'), '--train-len', '64', '--cache-layout', 'split', '-o', out]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /^ssmax-patch: --cache-layout split splits the stacked KV cache of com\.microsoft Attention, and this model has none to split/);
    assert.equal(r.stderr.trim().split('\n').length, 1);
    assert.ok(!fs.existsSync(out));
  });

  it('an Attention the patch keeps whole (n = keys needs no expansion) keeps its stacked cache, and the refusal says why', () => {
    assert.throws(() => patchModel(original, { trainLen: L, n: 'keys', cacheLayout: 'split' }),
      (e: unknown) => e instanceof InputError && /none to split: l0_attn keeps its stacked cache: the operator is kept whole \(n = Tk/.test(e.message));
  });

  it('GreedySearch\'s decoder: its caches are the operator\'s subgraph\'s, whose interface it fixes', { skip: corpusSkip('ort_tiny_gpt2_greedysearch_with_init_decoder.onnx') }, () => {
    const r = cli([path.join(CORPUS, 'ort_tiny_gpt2_greedysearch_with_init_decoder.onnx'), '--train-len', '64', '--cache-layout', 'split', '-o', path.join(dir, 'greedy.onnx')]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /keeps its stacked cache: it is inside a subgraph, whose interface its caller fixes/);
  });
});
