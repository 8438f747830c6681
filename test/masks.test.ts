/**
 * Which terms on the logits are masks, and which keys they hide (issue 23): a normalisation computed from the logits
 * (wav2vec2's row max) is never a mask; a term with one value per row hides no key; position biases (ALiBi from the
 * inputs) are not counted; masks hide the keys whose entry is at least 30 below their row's largest, whatever the
 * constant (Swin's −100 in a 5-D window view, −10000 on a whole row hides nothing). Each graph is patched and run on
 * onnxruntime against SSMax in plain loops (test/support/attention.ts) with the n each row really has.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DataType, ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../src/io/onnx';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { Feeds } from '../src/verify/inputs';
import { verifyPatch } from '../src/verify/verify';
import { attention, bnsd, f32 as host, floats, maxDiff, runOnce } from './support/attention';
import { f32, i64, model, node, value } from './support/build';

const H = 2, D = 4, T = 6, B = 2;
const SCALE = 1 / Math.sqrt(D);

/** Blocks of q, k, v [G, H, T, D] (G = B, or B·W windows) and the tensors the test's terms read. */
interface Case {
  blocks: number;
  /** Nodes from the scaled logits 'z' to the Softmax input 'x'. */
  terms: NodeProto[];
  inputs?: ValueInfoProto[];
  initializers?: TensorProto[];
  /** Einsum for the QK product: the factor goes on the logits. */
  einsum?: boolean;
}

function build(c: Case): ModelProto {
  const dims = [c.blocks, H, T, D];
  const qk = c.einsum
    ? [node('Einsum', ['q', 'k'], ['qk'], { equation: 'bhqd,bhkd->bhqk' })]
    : [node('Transpose', ['k'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q', 'kt'], ['qk'])];
  return model({
    nodes: [...qk, node('Mul', ['qk', 'scale'], ['z']), ...c.terms, node('Softmax', ['x'], ['p'], { axis: -1 }), node('MatMul', ['p', 'v'], ['out'])],
    inputs: [...['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, dims)), ...(c.inputs ?? [])],
    outputs: [value('out', DataType.FLOAT, dims)],
    initializers: [f32('scale', [], [SCALE]), ...(c.initializers ?? [])],
  });
}

const qkv = (blocks: number): Record<'q' | 'k' | 'v', Float32Array> => ({
  q: floats(blocks * H * T * D, 11, 2), k: floats(blocks * H * T * D, 12, 2), v: floats(blocks * H * T * D, 13),
});

/** Patches, runs, and compares with SSMax where row (g, i) sees the keys `visible` gives and has that many as n. */
async function check(c: Case, options: PatchOptions, extra: Feeds, visible: (g: number, i: number, j: number) => boolean,
  bias: (g: number, i: number, j: number) => number = () => 0, tolerance = 1e-5): Promise<ModelProto> {
  const x = qkv(c.blocks);
  const { model: patched } = patchModel(build(c), options);
  const feeds: Feeds = { ...extra, ...Object.fromEntries(Object.entries(x).map(([k, v]) => [k, host([c.blocks, H, T, D], v)])) };
  const got = await runOnce(patched, feeds, 'out');
  const s = options.s as number;
  const want = attention({
    B: c.blocks, N: H, Nkv: H, S: T, T, H: D, scale: SCALE, q: bnsd(x.q, H, T, D), k: bnsd(x.k, H, T, D), v: bnsd(x.v, H, T, D),
    visible: (g, _h, i, j) => visible(g, i, j), bias: (g, _h, i, j) => bias(g, i, j),
    factor: (g, _h, i) => s * Math.log(Math.max(1, Array.from({ length: T }, (_, j) => visible(g, i, j)).filter(Boolean).length)),
  });
  assert.ok(maxDiff(got, want) < tolerance, `max abs error ${maxDiff(got, want)}`);
  return patched;
}

const rowMax = (from: string): NodeProto[] => [
  node('ReduceMax', [from], ['row_max'], { axes: [-1], keepdims: 1 }), node('Sub', [from, 'row_max'], ['x']),
];

describe('a term computed from the logits is not a mask (wav2vec2\'s row max)', () => {
  it('Sub(z, ReduceMax(z)): n = Tk, and the report says the row max is a normalisation', async () => {
    const c = { blocks: B, terms: rowMax('z') };
    const { report } = patchModel(build(c), { s: 0.7 });
    assert.equal(report.sites[0].n, 'keys');
    assert.match(report.sites[0].nReason, /no mask on the logits; not masks: 'row_max' \(computed from the logits themselves/);
    await check(c, { s: 0.7 }, {}, () => true);
  });

  it('--n padding and --n mask find no mask there', () => {
    const m = build({ blocks: B, terms: rowMax('z') });
    assert.throws(() => patchModel(m, { s: 0.7, n: 'padding' }), /needs a key-padding mask .* has none \(it has no mask; a term computed from the logits\)/);
    assert.throws(() => patchModel(m, { s: 0.7, n: 'mask' }), /needs a mask on the logits/);
  });

  it('with the factor on the logits (Einsum), the row max is taken of the scaled logits', async () => {
    const c = { blocks: B, terms: rowMax('z'), einsum: true };
    const patched = await check(c, { s: 0.7 }, {}, () => true);
    const reduce = patched.graph!.node.find((n) => n.opType === 'ReduceMax' && n.output[0] === 'row_max')!;
    const sub = patched.graph!.node.find((n) => n.output[0] === 'x')!;
    assert.notEqual(reduce.input[0], 'z', 'the row max reads the logits before the factor');
    assert.equal(reduce.input[0], sub.input[0]);
  });

  it('Add(z, mask) → Sub(·, ReduceMax(·)) (wav2vec2 with lengths): no cycle, n = the unpadded keys', async () => {
    const c = {
      blocks: B, terms: [node('Add', ['z', 'mask'], ['masked']), ...rowMax('masked')], inputs: [value('mask', DataType.FLOAT, [B, 1, 1, T])],
    };
    const mask = Float32Array.from({ length: B * T }, (_, i) => (i >= T + 4 ? -10000 : 0));
    const { report } = patchModel(build(c), { s: 0.7 });
    assert.equal(report.sites[0].n, 'padding');
    await check(c, { s: 0.7 }, { mask: host([B, 1, 1, T], mask) }, (g, _i, j) => g === 0 || j < 4, (g, _i, j) => mask[g * T + j]);
  });
});

describe('masks by effect', () => {
  it('a mask input of −10000 on every key of a row hides none of them (they are all shifted alike)', async () => {
    const c = { blocks: B, terms: [node('Add', ['z', 'mask'], ['x'])], inputs: [value('mask', DataType.FLOAT, [B, 1, 1, T])] };
    const mask = Float32Array.from({ length: B * T }, (_, i) => (i >= T ? -10000 : 0));
    // float32 rounds z − 10000 to about 1e-3: the tolerance allows that, not a factor of 0 on the row (uniform attention).
    await check(c, { s: 0.7 }, { mask: host([B, 1, 1, T], mask) }, () => true, (g) => (g === 1 ? -10000 : 0), 2e-3);
  });

  it('a mask input of −50 hides its keys (at least 30 below the row\'s largest), −20 does not', async () => {
    const c = { blocks: B, terms: [node('Add', ['z', 'mask'], ['x'])], inputs: [value('mask', DataType.FLOAT, [B, 1, 1, T])] };
    const mask = Float32Array.from({ length: B * T }, (_, i) => [0, -50, 0, -20, -50, 0][i % T]);
    const { report } = patchModel(build(c), { s: 0.7 });
    assert.match(report.sites[0].nReason, /hidden: 'mask' entries at least 30 below their row's largest/);
    await check(c, { s: 0.7 }, { mask: host([B, 1, 1, T], mask) }, (_g, _i, j) => mask[j] > -30, (g, _i, j) => mask[g * T + j]);
  });

  it('a term with one value per row ([B, 1, T, 1]) hides no key: n = Tk, said in the report', async () => {
    const c = { blocks: B, terms: [node('Add', ['z', 'rows'], ['x'])], inputs: [value('rows', DataType.FLOAT, [B, 1, T, 1])] };
    const rows = Float32Array.from({ length: B * T }, (_, i) => (i % 2 ? -3 : 0));
    const { report } = patchModel(build(c), { s: 0.7 });
    assert.equal(report.sites[0].n, 'keys', report.sites[0].nReason);
    assert.match(report.sites[0].nReason, /not masks: 'rows' \(one value per row/);
    await check(c, { s: 0.7 }, { rows: host([B, 1, T, 1], rows) }, () => true, (g, i) => rows[g * T + i]);
  });

  it('ALiBi built from the attention mask (slopes × cumulative positions) is a position bias, not a mask', async () => {
    const slopes = [0.5, 4];
    const c = {
      blocks: B,
      terms: [
        node('Cast', ['attention_mask'], ['mask_f'], { to: DataType.FLOAT }), node('CumSum', ['mask_f', 'axis_last'], ['positions']),
        node('Reshape', ['positions', 'pos_shape'], ['pos4']), node('Mul', ['slopes', 'pos4'], ['alibi']), node('Add', ['z', 'alibi'], ['x']),
      ],
      inputs: [value('attention_mask', DataType.INT64, [B, T])],
      initializers: [i64('axis_last', [-1], true), i64('pos_shape', [B, 1, 1, T]), f32('slopes', [1, H, 1, 1], slopes.map((s) => -s))],
    };
    const { report } = patchModel(build(c), { s: 0.7 });
    // Counted as a mask, the steep head's far keys (−4 × 8 ≤ −30) would be taken for hidden ones.
    assert.equal(report.sites[0].n, 'keys', report.sites[0].nReason);
    assert.match(report.sites[0].nReason, /only additive position biases/);
  });
});

describe('Swin\'s shift mask: −100 chosen by a condition, added in a 5-D [B, windows, H, N, N] view', () => {
  const W = 2;
  // Window 0: no shift (every key); window 1: rows see the keys of their own region (first 2 or last 4).
  const region = (w: number, j: number): number => (w === 0 ? 0 : j < 2 ? 0 : 1);
  const hidden = Array.from({ length: W * T * T }, (_, x) => {
    const [w, i, j] = [Math.floor(x / (T * T)), Math.floor(x / T) % T, x % T];
    return region(w, i) !== region(w, j) ? 1 : 0;
  });
  const c: Case = {
    blocks: B * W,
    terms: [
      node('Reshape', ['z', 'view5'], ['z5']),
      node('Cast', ['hidden_i'], ['hidden'], { to: DataType.BOOL }), node('Where', ['hidden', 'minus_100', 'zero'], ['shift']),
      node('Unsqueeze', ['shift', 'axes_0_2'], ['shift5']), node('Add', ['z5', 'shift5'], ['x5']), node('Reshape', ['x5', 'view4'], ['x']),
    ],
    initializers: [
      i64('view5', [B, W, H, T, T]), i64('view4', [B * W, H, T, T]), { ...i64('hidden_i', hidden), dims: [W, T, T] },
      f32('minus_100', [], [-100]), f32('zero', [], [0]), i64('axes_0_2', [0, 2]),
    ],
  };
  const visible = (g: number, i: number, j: number): boolean => hidden[((g % W) * T + i) * T + j] === 0;

  it('n is counted per window and row (2, 4 or 6 of 6 keys), the report names the mask', async () => {
    const { report } = patchModel(build(c), { s: 0.7 });
    assert.equal(report.sites[0].n, 'mask');
    assert.match(report.sites[0].nReason, /hidden: 'shift5' entries at least 30 below their row's largest \(in a 5-D view\)/);
    await check(c, { s: 0.7 }, {}, visible, (g, i, j) => (visible(g, i, j) ? 0 : -100));
  });

  it('verify\'s probe expects the same per-window n (the −100 entries hidden)', async () => {
    const original = build(c);
    const r = await verifyPatch(original, patchModel(original, { s: 0.7 }).model);
    const probe = r.checks.find((x) => x.id === 'probe')!;
    assert.equal(probe.status, 'PASSED', probe.summary);
  });

  it('per-head s', async () => {
    const x = qkv(B * W);
    const s = [0.4, 1.1];
    const { model: patched } = patchModel(build(c), { s });
    const feeds = Object.fromEntries(Object.entries(x).map(([k, v]) => [k, host([B * W, H, T, D], v)]));
    const want = attention({
      B: B * W, N: H, Nkv: H, S: T, T, H: D, scale: SCALE, q: bnsd(x.q, H, T, D), k: bnsd(x.k, H, T, D), v: bnsd(x.v, H, T, D),
      visible: (g, _h, i, j) => visible(g, i, j),
      factor: (g, h, i) => s[h] * Math.log(Array.from({ length: T }, (_, j) => visible(g, i, j)).filter(Boolean).length),
    });
    const got = await runOnce(patched, feeds, 'out');
    assert.ok(maxDiff(got, want) < 1e-5, `max abs error ${maxDiff(got, want)}`);
  });
});
