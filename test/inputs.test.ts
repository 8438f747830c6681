/**
 * Input synthesis from the graph alone for the signatures real exports have, user-given input files, and the
 * messages that name the input and the option when a size cannot be inferred.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { InputError } from '../src/errors';
import { readModel } from '../src/io/model-file';
import { DataType, ModelProto, NodeProto, TensorProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { rng, synthesize } from '../src/verify/inputs';
import { positionLimit } from '../src/analysis/limits';
import { describeInputs, resolveDim, ruledDims, RunShape } from '../src/analysis/signature';
import { readTensorFile } from '../src/verify/tensor-files';
import { hostValues } from '../src/verify/tensors';
import { verifyForCli, verifyPatch, VerifyReport } from '../src/verify/verify';
import { f32, model as buildModel, node, value } from './support/build';
import { FIXTURES, TORCH } from './support/ref';
import { castAttentionModel, crossAttentionModel, pixelAttentionModel } from './support/signatures';
import { cliError, removeScratch, tmpdir } from './support/io';

after(removeScratch);

const INPUTS = path.join(FIXTURES, 'inputs');
const fixture = (name: string): ModelProto => readModel(path.join(TORCH, `${name}.onnx`));
const values = (t: { type: string; data: ArrayLike<number | bigint> }): number[] => [...hostValues(t.type, t.data)];
const statusOf = (r: VerifyReport): Record<string, string> => Object.fromEntries(r.checks.map((c) => [c.id, c.status]));

describe('input roles and dims', () => {
  it('reads the roles of a KV-cache decoder and sizes its dims from their names', () => {
    const g = new Graph(fixture('gpt2_past').graph!);
    const specs = describeInputs(g);
    assert.deepEqual(specs.map((s) => [s.name, s.role]), [
      ['input_ids', 'ids'], ['attention_mask', 'mask'], ['past_key_0', 'past'], ['past_value_0', 'past'], ['past_key_1', 'past'], ['past_value_1', 'past'],
    ]);
    const feeds = synthesize(g, specs, { batch: 2, seq: 3, past: 5 }, { padded: true });
    assert.deepEqual(feeds.input_ids.dims, [2, 3]);
    assert.deepEqual(feeds.attention_mask.dims, [2, 8], 'total_sequence = past + sequence');
    assert.deepEqual(feeds.past_key_0.dims, [2, 4, 5, 8], 'heads and head size from the graph, past_sequence = 5');
    assert.ok(values(feeds.input_ids).every((v) => Number.isInteger(v) && v >= 0 && v < 64), 'ids inside the 64-row embedding');
    // The last batch item is right-padded over the last quarter of the current tokens (here 1 of 3).
    assert.deepEqual(values(feeds.attention_mask), [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
  });

  it('finds the heads and head size of past key/values in the graph when their shape names them only', () => {
    const m = fixture('gpt2_past');
    for (const input of m.graph!.input.filter((v) => v.name.startsWith('past_'))) {
      const dims = input.type!.tensorType!.shape!.dim;
      dims[1] = { dimParam: 'num_heads' };
      dims[3] = { dimParam: 'head_size' };
    }
    const g = new Graph(m.graph!);
    const feeds = synthesize(g, describeInputs(g), { batch: 1, seq: 2, past: 6 });
    assert.deepEqual(feeds.past_value_1.dims, [1, 4, 6, 8]);
  });

  it('fills positions from the past length, token types with 0 and the cache flag from past > 0', () => {
    const g = new Graph({ name: 'empty', node: [], input: [], output: [], initializer: [], valueInfo: [] });
    const specs = describeInputs(g).concat([
      { name: 'position_ids', elemType: DataType.INT64, role: 'positions', dims: [{ param: 'batch' }, { param: 'sequence' }] },
      { name: 'token_type_ids', elemType: DataType.INT32, role: 'token-types', dims: [{ param: 'batch' }, { param: 'sequence' }] },
      { name: 'use_cache_branch', elemType: DataType.BOOL, role: 'cache-flag', dims: [{ value: 1 }] },
    ]);
    const feeds = synthesize(g, specs, { batch: 2, seq: 3, past: 4 });
    assert.deepEqual(values(feeds.position_ids), [4, 5, 6, 4, 5, 6]);
    assert.equal(feeds.token_type_ids.type, 'int32');
    assert.deepEqual(values(feeds.token_type_ids), [0, 0, 0, 0, 0, 0]);
    assert.deepEqual(values(feeds.use_cache_branch), [1]);
    assert.deepEqual(values(synthesize(g, specs, { batch: 1, seq: 3, past: 0 }).use_cache_branch), [0]);
  });

  it("fills nonpad_kv_seqlen of an expanded ONNX Attention body with K's key count; other lengths stay refused", () => {
    const g = new Graph({ name: 'empty', node: [], input: [], output: [], initializer: [], valueInfo: [] });
    const k = { name: 'K', elemType: DataType.FLOAT, role: 'values' as const, dims: [{ value: 2 }, { value: 2 }, { value: 8 }, { value: 8 }] };
    const nonpad = { name: 'nonpad_kv_seqlen', elemType: DataType.INT64, role: 'lengths' as const, dims: [{ value: 2 }] };
    assert.deepEqual(values(synthesize(g, [k, nonpad], { batch: 2, seq: 4, past: 0 }).nonpad_kv_seqlen), [8, 8]);
    assert.throws(() => synthesize(g, [nonpad], { batch: 2, seq: 4, past: 0 }), /input 'nonpad_kv_seqlen' holds lengths/);
    assert.throws(() => synthesize(g, [k, { ...nonpad, name: 'kv_len' }], { batch: 2, seq: 4, past: 0 }), /input 'kv_len' holds lengths/);
  });

  it('matches dim names, sums and pinned sizes', () => {
    const spec = { name: 'x', elemType: DataType.FLOAT, role: 'values' as const, dims: [
      { param: 'batch_size' }, { param: 'max_seq_len_in_batch' }, { param: 'past_seq_len + 1' }, { param: 'past_sequence_length+sequence_length' },
      { param: 'total_sequence_length' }, { param: 'height' }, { value: 7 },
    ] };
    const shape: RunShape = { batch: 3, seq: 11, past: 4 };
    const sizes = spec.dims.slice(0, 5).concat([spec.dims[6]]).map((_, i) => resolveDim(spec, i === 5 ? 6 : i, shape, new Map()).size);
    assert.deepEqual(sizes, [3, 11, 5, 15, 15, 7]);
    assert.equal(resolveDim(spec, 5, shape, new Map([['height', 224]])).size, 224);
    // Issue 9: a name no rule knows no longer stops verification; it is sized by where it is (here: 4, fixed).
    assert.deepEqual(resolveDim(spec, 5, shape, new Map()), { size: 4, source: 'fixed' });
  });

  it('sizes dims no name rule knows by their position, the same for every input naming them, and says how', () => {
    const g = new Graph({
      name: 'g', node: [], output: [], initializer: [], valueInfo: [],
      input: [
        { name: 'query', type: { tensorType: { elemType: DataType.FLOAT, shape: { dim: [{ dimParam: 'num_beams' }, { dimParam: 'tq' }, { dimValue: 8 }] } } } },
        { name: 'attention_mask', type: { tensorType: { elemType: DataType.INT64, shape: { dim: [{ dimParam: 'num_beams' }, { dimParam: 'tq' }] } } } },
        { name: 'extra', type: { tensorType: { elemType: DataType.FLOAT, shape: { dim: [{ dimParam: 'num_beams' }, { dimParam: 'groups' }, { dimParam: 'tq' }, { dimValue: 2 }] } } } },
      ],
    });
    const specs = describeInputs(g);
    const feeds = synthesize(g, specs, { batch: 3, seq: 5, past: 0 });
    assert.deepEqual(feeds.query.dims, [3, 5, 8], 'num_beams: axis 0, the batch; tq: the token axis, the sequence length');
    assert.deepEqual(feeds.attention_mask.dims, [3, 5]);
    assert.deepEqual(feeds.extra.dims, [3, 4, 5, 2], 'groups: no rule, 4; tq as the query input decided');
    assert.deepEqual(synthesize(g, specs, { batch: 1, seq: 9, past: 0 }).query.dims, [1, 9, 8], 'the sequence-like dim varies with the run');
    assert.deepEqual(ruledDims(specs[2]), ["dim 0 'num_beams': axis 0: the batch", "dim 1 'groups': no rule: 4", "dim 2 'tq': axis 1 of a 3-D float input: the sequence length"]);
  });

  it('finds learned position tables as length limits, and none for RoPE', () => {
    const specsOf = (m: ModelProto): ReturnType<typeof describeInputs> => describeInputs(new Graph(m.graph!));
    const gpt2 = fixture('gpt2_decoder');
    assert.equal(positionLimit(new Graph(gpt2.graph!), specsOf(gpt2))?.length, 256);
    const bert = fixture('bert_encoder');
    assert.equal(positionLimit(new Graph(bert.graph!), specsOf(bert))?.length, 512);
    const llama = fixture('llama_gqa');
    assert.equal(positionLimit(new Graph(llama.graph!), specsOf(llama)), null);
  });
});

describe('tables of positions inside operators (issue 33)', () => {
  const ms = (n: NodeProto): NodeProto => ({ ...n, domain: 'com.microsoft' });
  const table = (name: string, rows: number): TensorProto => f32(name, [rows, 4], new Array(rows * 4).fill(0.5));
  const limitOf = (nodes: NodeProto[], initializers: TensorProto[]): ReturnType<typeof positionLimit> => {
    const m = buildModel({
      nodes, initializers,
      inputs: [value('input_ids', DataType.INT64, ['batch', 'seq']), value('position_ids', DataType.INT64, ['batch', 'seq']), value('x', DataType.FLOAT, ['batch', 'seq', 8])],
      outputs: [value('y', DataType.FLOAT, ['batch', 'seq', 8])],
    });
    const g = new Graph(m.graph!);
    return positionLimit(g, describeInputs(g));
  };

  it('a rotary cos cache caps the length at its rows when fed positions; ids of another origin cap nothing', () => {
    const rotary = (ids: string): NodeProto => ms(node('RotaryEmbedding', ['x', ids, 'cos', 'sin'], ['y'], {}, 'rope'));
    assert.deepEqual(limitOf([rotary('position_ids')], [table('cos', 48), table('sin', 48)]),
      { length: 48, reason: "RotaryEmbedding 'rope': its rotary cos cache 'cos' has 48 rows", lift: '--rope pi|ntk|yarn recomputes the rotary caches with room for the context it rescales for' });
    assert.equal(limitOf([node('Identity', ['input_ids'], ['tok']), rotary('tok')], [table('cos', 48), table('sin', 48)]), null, 'token ids are no positions');
    assert.equal(limitOf([rotary('position_ids')], []), null, 'a cache fed at run time has no fixed size');
  });

  it("GroupQueryAttention's cos cache caps it only with do_rotary; EmbedLayerNormalization's position embedding caps it without position ids", () => {
    const gqa = (rotary: number): NodeProto => ms(node('GroupQueryAttention', ['x', 'x', 'x', '', '', 'seqlens', 'total', 'cos', 'sin'], ['y'], { num_heads: 2, kv_num_heads: 2, do_rotary: rotary }, 'gqa'));
    assert.equal(limitOf([gqa(1)], [table('cos', 96), table('sin', 96)])?.length, 96);
    assert.equal(limitOf([gqa(0)], [table('cos', 96), table('sin', 96)]), null);
    const eln = (ids: string[]): NodeProto => ms(node('EmbedLayerNormalization', ['input_ids', '', 'word', 'pos', '', 'gamma', 'beta', ...ids], ['y'], {}, 'eln'));
    const weights = [table('word', 1000), table('pos', 512), f32('gamma', [4], [1, 1, 1, 1]), f32('beta', [4], [0, 0, 0, 0])];
    assert.deepEqual(limitOf([eln([])], weights), { length: 512, reason: "EmbedLayerNormalization 'eln': its position embedding 'pos' has 512 rows" });
    assert.equal(limitOf([eln(['', 'position_ids'])], weights)?.length, 512);
    assert.equal(limitOf([eln(['', 'input_ids'])], weights), null, 'token ids fed as position ids (onnxruntime\'s own test model): no cap');
  });
});

describe('input files', () => {
  const ids = Array.from({ length: 20 }, (_, i) => (7 * i) % 64);
  it('reads .npy, .pb and .json with the same values, converted to the input type', () => {
    for (const f of ['ids.npy', 'ids.pb', 'ids.json']) {
      const t = readTensorFile(path.join(INPUTS, f), 'input_ids', DataType.INT64);
      assert.equal(t.type, 'int64', f);
      assert.deepEqual(t.dims, [1, 20], f);
      assert.deepEqual(values(t), ids, f);
    }
    const mask = readTensorFile(path.join(INPUTS, 'mask_i32.npy'), 'attention_mask', DataType.INT64);
    assert.deepEqual(values(mask), [...Array(15).fill(1), ...Array(5).fill(0)]);
    const half = readTensorFile(path.join(INPUTS, 'half.npy'), 'x', DataType.FLOAT);
    assert.deepEqual(half.dims, [2, 3]);
    const expected = [0.5, -1.25, 3, 65504, -0.0009765625, 1e-4];
    values(half).forEach((v, i) => assert.ok(Math.abs(v - expected[i]) <= 1e-3 * Math.abs(expected[i]), `${v} vs ${expected[i]}`));
    const floats = readTensorFile(path.join(INPUTS, 'floats.pb'), 'x', DataType.FLOAT16);
    assert.equal(floats.type, 'float16');
    assert.deepEqual(values(floats), [-1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75]);
  });

  it('rejects unreadable, malformed and mistyped files with one line naming the option', () => {
    const dir = tmpdir('ssmax-inputs-');
    const write = (name: string, text: string): string => {
      fs.writeFileSync(path.join(dir, name), text);
      return path.join(dir, name);
    };
    const cases: [string, RegExp][] = [
      [path.join(dir, 'nope.npy'), /^--input x=.*nope\.npy: no such file$/],
      [write('a.txt', '1'), /unknown file type; use \.npy, \.json or \.pb/],
      [write('r.json', '[[1, 2], [3]]'), /nested arrays are ragged/],
      [write('s.json', '{"dims": [2], "data": [1, 2, 3]}'), /3 values do not fill dims \[2\]/],
      [write('n.npy', 'not numpy'), /not a \.npy file/],
      [path.join(INPUTS, 'half.npy'), /input 'x' is int64 but the file holds 0\.5/],
    ];
    for (const [file, pattern] of cases) {
      assert.throws(() => readTensorFile(file, 'x', DataType.INT64), (e: Error) => e instanceof InputError && pattern.test(e.cliMessage) && !e.message.includes('\n'), file);
    }
  });

  it('verifies with user inputs: their shapes fix batch and sequence for every run', async () => {
    const original = fixture('bert_encoder');
    const patched = patchModel(original, { trainLen: 32, n: 'keys' }).model;
    const r = await verifyForCli(original, patched, {
      inputFiles: { input_ids: path.join(INPUTS, 'ids.npy'), attention_mask: path.join(INPUTS, 'mask.json') },
    });
    assert.deepEqual(r.runs.map((x) => x.id), ['batch=1 seq=20']);
    assert.match(r.notes.join('\n'), /sequence length fixed at 20/);
    assert.deepEqual(statusOf(r), { wiring: 'PASSED', probe: 'PASSED', retrofit: 'SKIPPED', liveness: 'SKIPPED', sharpness: 'SKIPPED' });
    assert.equal(r.inputs.find((i) => i.name === 'input_ids')!.file, path.join(INPUTS, 'ids.npy'));
    const twoItems = path.join(tmpdir('ssmax-inputs-'), 'mask2.json');
    fs.writeFileSync(twoItems, '[[1, 1], [1, 0]]');
    await assert.rejects(verifyForCli(original, patched, { inputFiles: { input_ids: path.join(INPUTS, 'ids.npy'), attention_mask: twoItems } }),
      cliError(/--input attention_mask: dim 0 \('batch'\) is 2, but --input input_ids sets it to 1/));
    await assert.rejects(verifyForCli(original, patched, { inputFiles: { pixel_values: path.join(INPUTS, 'ids.npy') } }),
      cliError(/--input pixel_values: the model has no input 'pixel_values' \(inputs: input_ids, attention_mask\)/));
  });

  it('the library takes the same inputs as tensors, checked against the model\'s inputs', async () => {
    const original = fixture('bert_encoder');
    const patched = patchModel(original, { trainLen: 32, n: 'keys' }).model;
    const ids = readTensorFile(path.join(INPUTS, 'ids.npy'), 'input_ids', DataType.INT64);
    const mask = readTensorFile(path.join(INPUTS, 'mask.json'), 'attention_mask', DataType.INT64);
    const r = await verifyPatch(original, patched, { inputs: { input_ids: ids, attention_mask: mask } });
    assert.deepEqual(r.runs.map((x) => x.id), ['batch=1 seq=20']);
    assert.equal(statusOf(r).probe, 'PASSED');
    await assert.rejects(verifyPatch(original, patched, { inputs: { input_ids: { ...ids, type: 'int32', data: Int32Array.from(ids.data as BigInt64Array, Number) } } }),
      /option inputs \(input_ids\): a int32 tensor, but the model declares int64/);
  });
});

describe('synthesised signatures verify end to end', () => {
  for (const [label, type] of [['float16', DataType.FLOAT16], ['bfloat16', DataType.BFLOAT16]] as const) {
    it(`${label} inputs and outputs`, async () => {
      const original = castAttentionModel(type);
      const patched = patchModel(original, { trainLen: 16 }).model;
      const r = await verifyPatch(original, patched, { lengths: [8, 16, 64] });
      assert.equal(r.inputs[0].type, label);
      assert.deepEqual(statusOf(r), { wiring: 'PASSED', probe: 'PASSED', retrofit: 'PASSED', liveness: 'PASSED', sharpness: 'PASSED' },
        r.checks.map((c) => `${c.name}: ${c.summary}`).join('\n'));
    });
  }

  it('encoder_hidden_states for cross-attention', async () => {
    const original = crossAttentionModel();
    assert.deepEqual(describeInputs(new Graph(original.graph!)).map((s) => s.role), ['values', 'encoder-states']);
    const patched = patchModel(original, { trainLen: 16 }).model;
    const r = await verifyPatch(original, patched, { lengths: [8, 16, 64] });
    assert.equal(r.passed, true, r.checks.map((c) => `${c.name}: ${c.summary}`).join('\n'));
    assert.equal(statusOf(r).sharpness, 'PASSED');
  });

  it('pixel_values: symbolic height and width are image sides of 32 unless --dim sets them', async () => {
    const original = pixelAttentionModel();
    const patched = patchModel(original, { s: 0.3 }).model;
    // Issue 9: no exit 2 asking for --dim; the sizes chosen are reported per input.
    const chosen = await verifyPatch(original, patched);
    assert.deepEqual(chosen.inputs[0].sized, ["dim 2 'height': an image side: 32", "dim 3 'width': an image side: 32"]);
    // 32×32 pixels in 4×4 patches: 64 tokens; the probe reads the query (2 items × 2 heads × 64 rows × head size 4).
    assert.equal(chosen.checks.find((c) => c.id === 'probe')!.sites![0].entries, 2 * 2 * 64 * 4);
    const r = await verifyPatch(original, patched, { dims: { height: 16, width: 12 } });
    assert.deepEqual(statusOf(r), { wiring: 'PASSED', probe: 'PASSED', retrofit: 'SKIPPED', liveness: 'SKIPPED', sharpness: 'SKIPPED' });
    // 16×12 pixels in 4×4 patches: 12 tokens, so the probe saw 12 query rows of head size 4 per head (issue 9: the
    // factor on the query is read there, not as 12×12 logits).
    assert.equal(r.checks.find((c) => c.id === 'probe')!.sites![0].entries, 2 * 2 * 12 * 4);
  });
});

describe('the input generator', () => {
  it('fills an array with the values one draw at a time gives, and goes on from where the fill ended', () => {
    const [calls, bulk] = [rng(77), rng(77)];
    calls();
    bulk();
    const a = Float32Array.from({ length: 4099 }, () => calls() * 2 - 1);
    const b = new Float32Array(4099);
    bulk.signed(b);
    assert.deepEqual(b, a);
    assert.ok(b.every((v) => v >= -1 && v < 1) && new Set(b).size > 4000);
    assert.equal(bulk(), calls());
  });
});
