/**
 * Exporter patterns of plain-op attention, one tiny TypeScript-built graph each, run on onnxruntime against
 * the loop reference: Einsum (keras2onnx, key operand first), FusedMatMul (onnxruntime-optimised), no scaling
 * with a T5 position bias, baddbmm-style masks on 3-D logits, opset-11 Softmax on a 2-D view, fp16 and
 * Cast-wrapped Softmax, NaN guards and Dropout after the Softmax; and the dtype routine for bf16.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DataType, ModelProto, NodeProto, TensorProto } from '../src/io/onnx';
import { makeTensor } from '../src/graph/tensor';
import { Graph } from '../src/graph/graph';
import { Builder } from '../src/rewrite/builder';
import { Journal } from '../src/rewrite/journal';
import { applyFactor } from '../src/rewrite/dtype';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { Feeds } from '../src/verify/inputs';
import { attention, AttentionSpec, bnsd, bsd, f32, floats, maxDiff, runOnce, ssmaxFactor, toBsd } from './support/attention';
import { f32 as f32Init, i64 as i64Init, model, node, value } from './support/build';

const B = 2, N = 3, H = 4;
const perHead = [0.3, 0.45, 0.6];

interface Pattern {
  title: string;
  S: number;
  build(S: number): { m: ModelProto; feeds: Feeds; spec: Omit<AttentionSpec, 'factor'>; layout: 'bnsd' | 'bsd' };
  options: PatchOptions;
  factor: (S: number) => AttentionSpec['factor'];
  n: 'keys' | 'causal';
  tol?: number;
  /** Extra checks on the patched graph. */
  inspect?(patched: ModelProto): void;
}

function qkv(S: number, seed: number) {
  return { q: floats(B * N * S * H, seed, 1.5), k: floats(B * N * S * H, seed + 1, 1.5), v: floats(B * N * S * H, seed + 2) };
}

const bnshInputs = (S: number, t: ReturnType<typeof qkv>): Feeds => ({
  q: f32([B, N, S, H], t.q), k: f32([B, N, S, H], t.k), v: f32([B, N, S, H], t.v),
});
const bnshDecl = ['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, ['B', N, 'S', H]));

const causalVisible = (_b: number, _n: number, i: number, j: number): boolean => j <= i;
const keysFactor = (s: number[] | number) => (S: number) => (_b: number, n: number): number => ssmaxFactor(s, S, n);
const causalFactor = (s: number[] | number) => () => (_b: number, n: number, i: number): number => ssmaxFactor(s, i + 1, n);

/** Additive upper-triangular −inf built the Llama way: Trilu(ConstantOfShape(−inf)). */
function causalAdd(S: number, name: string): { nodes: NodeProto[]; inits: TensorProto[] } {
  return {
    nodes: [node('ConstantOfShape', [`${name}_shape`], [`${name}_full`], { value: f32Init('', [1], [-Infinity]) }),
      node('Trilu', [`${name}_full`, `${name}_k`], [name], { upper: 1 })],
    inits: [i64Init(`${name}_shape`, [S, S]), i64Init(`${name}_k`, [1], true)],
  };
}

const patterns: Pattern[] = [
  {
    title: 'keras2onnx: Einsum(key, query) → Add(−10000 padding mask) → Softmax → Einsum(probs, value), scaled query',
    S: 6, n: 'keys', options: { n: 'keys', s: perHead }, factor: keysFactor(perHead),
    build(S) {
      const q = floats(B * S * N * H, 1, 1.5), k = floats(B * S * N * H, 2, 1.5), v = floats(B * S * N * H, 3);
      const mask = Float32Array.from({ length: B * S }, (_, x) => (x % S >= S - 2 && x >= S ? -10000 : 0));
      const m = model({
        nodes: [
          node('Mul', ['q', 'inv_sqrt'], ['qs']),
          node('Einsum', ['k', 'qs'], ['scores'], { equation: 'aecd,abcd->acbe' }),
          node('Add', ['scores', 'mask'], ['masked']),
          node('Softmax', ['masked'], ['p'], { axis: -1 }),
          node('Einsum', ['p', 'v'], ['out'], { equation: 'acbe,aecd->abcd' }),
        ],
        inputs: [...['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, ['B', 'S', N, H])), value('mask', DataType.FLOAT, ['B', 1, 1, 'S'])],
        outputs: [value('out', DataType.FLOAT, ['B', 'S', N, H])],
        initializers: [f32Init('inv_sqrt', [], [1 / Math.sqrt(H)])],
      });
      return {
        m, layout: 'bsd',
        feeds: { q: f32([B, S, N, H], q), k: f32([B, S, N, H], k), v: f32([B, S, N, H], v), mask: f32([B, 1, 1, S], mask) },
        spec: { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bsd(q, S, N, H), k: bsd(k, S, N, H), v: bsd(v, S, N, H),
          visible: () => true, bias: (b, _n, _i, j) => mask[b * S + j] },
      };
    },
  },
  {
    title: 'onnxruntime-optimised: FusedMatMul(q, k, alpha, transB) → Add(Trilu causal) → Softmax → MatMul',
    S: 7, n: 'causal', options: { s: 0.5 }, factor: causalFactor(0.5),
    build(S) {
      const t = qkv(S, 10);
      const c = causalAdd(S, 'causal');
      const fused: NodeProto = { ...node('FusedMatMul', ['q', 'k'], ['scores'], { alpha: 0.5, transB: 1 }), domain: 'com.microsoft' };
      const m = model({
        nodes: [fused, ...c.nodes, node('Add', ['scores', 'causal'], ['masked']), node('Softmax', ['masked'], ['p'], { axis: 3 }), node('MatMul', ['p', 'v'], ['out'])],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])], initializers: c.inits,
      });
      m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: { B, N, Nkv: N, S, T: S, H, scale: 0.5, q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H), visible: causalVisible } };
    },
  },
  {
    title: 'torch\'s matmul lowering: Softmax → Cast → Identity → Expand → Reshape [B·N, S, S] → MatMul with values [B·N, S, H]',
    S: 7, n: 'causal', options: { s: 0.5 }, factor: causalFactor(0.5),
    build(S) {
      const t = qkv(S, 40);
      const c = causalAdd(S, 'causal');
      const m = model({
        nodes: [node('Transpose', ['k'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q', 'kt'], ['mm']), node('Mul', ['mm', 'scale'], ['scores']),
          ...c.nodes, node('Add', ['scores', 'causal'], ['masked']), node('Softmax', ['masked'], ['p'], { axis: -1 }),
          node('Cast', ['p'], ['p_cast'], { to: DataType.FLOAT }), node('Identity', ['p_cast'], ['p_id']),
          node('Shape', ['p_id'], ['p_shape']), node('Expand', ['p_id', 'p_shape'], ['p_wide']),
          node('Reshape', ['p_wide', 'rows3'], ['p3']), node('Reshape', ['v', 'rows3_v'], ['v3']), node('MatMul', ['p3', 'v3'], ['o3']),
          node('Reshape', ['o3', 'bnsh'], ['out'])],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])],
        initializers: [...c.inits, f32Init('scale', [], [0.5]), i64Init('rows3', [-1, S, S]), i64Init('rows3_v', [-1, S, H]), i64Init('bnsh', [B, N, S, H])],
      });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: { B, N, Nkv: N, S, T: S, H, scale: 0.5, q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H), visible: causalVisible } };
    },
  },
  {
    title: 'T5: no 1/√d, Add(relative position bias + causal mask) → Softmax; the position bias is not scaled',
    S: 6, n: 'causal', options: { s: perHead }, factor: causalFactor(perHead),
    build(S) {
      const t = qkv(S, 20);
      const rel = floats(N * S * S, 25, 2);
      const c = causalAdd(S, 'causal');
      const m = model({
        nodes: [node('Transpose', ['k'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q', 'kt'], ['scores']), ...c.nodes,
          node('Add', ['rel', 'causal'], ['position_bias']), node('Add', ['scores', 'position_bias'], ['biased']),
          node('Softmax', ['biased'], ['p'], { axis: -1 }), node('MatMul', ['p', 'v'], ['out'])],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])], initializers: [...c.inits, f32Init('rel', [1, N, S, S], Array.from(rel))],
      });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: { B, N, Nkv: N, S, T: S, H, scale: 1, q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H),
          visible: causalVisible, bias: (_b, n, i, j) => rel[(n * S + i) * S + j] } };
    },
  },
  {
    title: 'baddbmm on 3-D logits: Add(Mul(MatMul, α), Mul(ALiBi bias, β)) → Softmax → MatMul; α scales, the bias is not scaled',
    S: 5, n: 'keys', options: { n: 'keys', s: perHead }, factor: keysFactor(perHead),
    build(S) {
      const t = qkv(S, 30);
      const alibi = new Float32Array(B * N * S * S);
      for (let x = 0; x < B * N; x++) {
        for (let i = 0; i < S; i++) for (let j = 0; j < S; j++) alibi[(x * S + i) * S + j] = -0.5 * ((x % N) + 1) * Math.abs(i - j);
      }
      const m = model({
        nodes: [node('Reshape', ['q', 'bh'], ['q3']), node('Reshape', ['k', 'bh'], ['k3']), node('Reshape', ['v', 'bh'], ['v3']),
          node('Transpose', ['k3'], ['k3t'], { perm: [0, 2, 1] }), node('MatMul', ['q3', 'k3t'], ['mm']), node('Mul', ['mm', 'alpha'], ['scaled']),
          node('Mul', ['alibi', 'beta'], ['bias']), node('Add', ['scaled', 'bias'], ['scores']), node('Softmax', ['scores'], ['p'], { axis: -1 }),
          node('MatMul', ['p', 'v3'], ['out3']), node('Reshape', ['out3', 'bnsh'], ['out'])],
        inputs: [...bnshDecl, value('alibi', DataType.FLOAT, [B * N, 'S', 'S'])], outputs: [value('out', DataType.FLOAT, [])],
        initializers: [i64Init('bh', [B * N, -1, H]), i64Init('bnsh', [B, N, -1, H]), f32Init('alpha', [], [1 / Math.sqrt(H)]), f32Init('beta', [], [1])],
      });
      return { m, layout: 'bnsd', feeds: { ...bnshInputs(S, t), alibi: f32([B * N, S, S], alibi) },
        spec: { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H),
          visible: () => true, bias: (b, n, i, j) => alibi[((b * N + n) * S + i) * S + j] } };
    },
    inspect(patched) {
      const heads = patched.graph!.node.find((n) => n.name === 'ssmax/L0/s_tiled');
      assert.ok(heads, 'per-head s on [B·H, T, T] logits is tiled over the batch');
    },
  },
  {
    title: 'opset 11: Softmax(axis=1) on a Reshape to [B·N·S, T], reshaped back',
    S: 6, n: 'keys', options: { s: 0.4 }, factor: keysFactor(0.4),
    build(S) {
      const t = qkv(S, 40);
      const m = model({
        nodes: [node('Transpose', ['k'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q', 'kt'], ['mm']), node('Div', ['mm', 'sqrt_d'], ['scores']),
          node('Reshape', ['scores', 'rows'], ['flat']), node('Softmax', ['flat'], ['pflat'], { axis: 1 }),
          node('Reshape', ['pflat', 'back'], ['p']), node('MatMul', ['p', 'v'], ['out'])],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])], opset: 11,
        initializers: [f32Init('sqrt_d', [], [Math.sqrt(H)]), i64Init('rows', [-1, S]), i64Init('back', [B, N, S, S])],
      });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H), visible: () => true } };
    },
  },
  {
    title: 'fp16 throughout: the factor is applied in fp32 and rounded once',
    S: 7, n: 'causal', options: { s: 0.5 }, factor: causalFactor(0.5), tol: 4e-3,
    build(S) {
      const t = qkv(S, 50);
      const c = causalAdd(S, 'causal');
      const half = (x: string): NodeProto => node('Cast', [x], [`${x}16`], { to: DataType.FLOAT16 });
      const m = model({
        nodes: [half('q'), half('k'), half('v'), node('Transpose', ['k16'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q16', 'kt'], ['mm']),
          node('Div', ['mm', 'sqrt_d'], ['scores']), ...c.nodes, node('Cast', ['causal'], ['causal16'], { to: DataType.FLOAT16 }),
          node('Add', ['scores', 'causal16'], ['masked']), node('Softmax', ['masked'], ['p'], { axis: -1 }), node('MatMul', ['p', 'v16'], ['out16']),
          node('Cast', ['out16'], ['out'], { to: DataType.FLOAT })],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])],
        initializers: [...c.inits, makeTensor('sqrt_d', DataType.FLOAT16, [], [Math.sqrt(H)])],
      });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: {
          B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H),
          visible: causalVisible,
        } };
    },
    inspect(patched) {
      const apply = patched.graph!.node.find((n) => n.name === 'ssmax/L0/apply')!;
      const cast = patched.graph!.node.find((n) => n.output[0] === apply.input[0])!;
      assert.equal(cast.opType, 'Cast');
      assert.equal(cast.attribute[0].i, DataType.FLOAT);
    },
  },
  {
    title: 'Cast-wrapped Softmax: fp16 logits → Cast(fp32) → Softmax → Cast(fp16); the factor goes on the fp32 logits',
    S: 6, n: 'keys', options: { s: 1.2 }, factor: keysFactor(1.2), tol: 4e-3,
    build(S) {
      const t = qkv(S, 60);
      const half = (x: string): NodeProto => node('Cast', [x], [`${x}16`], { to: DataType.FLOAT16 });
      const m = model({
        nodes: [half('q'), half('k'), half('v'), node('Transpose', ['k16'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q16', 'kt'], ['mm']),
          node('Div', ['mm', 'sqrt_d'], ['scores']), node('Cast', ['scores'], ['scores32'], { to: DataType.FLOAT }),
          node('Softmax', ['scores32'], ['p32'], { axis: -1 }), node('Cast', ['p32'], ['p'], { to: DataType.FLOAT16 }),
          node('MatMul', ['p', 'v16'], ['out16']), node('Cast', ['out16'], ['out'], { to: DataType.FLOAT })],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])], initializers: [makeTensor('sqrt_d', DataType.FLOAT16, [], [Math.sqrt(H)])],
      });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H), visible: () => true } };
    },
    inspect(patched) {
      const apply = patched.graph!.node.find((n) => n.name === 'ssmax/L0/apply')!;
      assert.equal(apply.input[0], 'scores32', 'the factor multiplies the fp32 logits directly');
    },
  },
  {
    title: 'guards after the Softmax: Where(IsNaN(p), 0, p) → Dropout → MatMul',
    S: 5, n: 'keys', options: { s: 0.5 }, factor: keysFactor(0.5),
    build(S) {
      const t = qkv(S, 70);
      const m = model({
        nodes: [node('Transpose', ['k'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['q', 'kt'], ['mm']), node('Div', ['mm', 'sqrt_d'], ['scores']),
          node('Softmax', ['scores'], ['p'], { axis: -1 }), node('IsNaN', ['p'], ['nan']), node('Where', ['nan', 'zero', 'p'], ['safe']),
          node('Dropout', ['safe'], ['dropped']), node('MatMul', ['dropped', 'v'], ['out'])],
        inputs: bnshDecl, outputs: [value('out', DataType.FLOAT, [])], initializers: [f32Init('sqrt_d', [], [Math.sqrt(H)]), f32Init('zero', [], [0])],
      });
      return { m, layout: 'bnsd', feeds: bnshInputs(S, t),
        spec: { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, N, S, H), v: bnsd(t.v, N, S, H), visible: () => true } };
    },
  },
];

describe('plain-op attention patterns', () => {
  for (const p of patterns) {
    it(p.title, async () => {
      for (const S of [p.S, p.S + 5].filter((s) => !/opset 11|T5|fp16|Trilu|Cast-wrapped/.test(p.title) || s === p.S)) {
        const { m, feeds, spec, layout } = p.build(S);
        const shape = (x: Float64Array): Float64Array => (layout === 'bsd' ? toBsd(x, B, N, S, H) : x);
        const tol = p.tol ?? 2e-5;
        const plain = await runOnce(m, feeds, 'out');
        assert.ok(maxDiff(plain, shape(attention({ ...spec, factor: () => 1 }))) < tol, `S=${S}: the test graph itself differs from the reference`);
        const { model: patched, report } = patchModel(m, p.options);
        assert.equal(report.sites.length, 1, JSON.stringify(report.skipped));
        assert.equal(report.sites[0].n, p.n, report.sites[0].nReason);
        assert.equal(report.sites[0].heads, N, report.sites[0].headsReason);
        p.inspect?.(patched);
        const want = shape(attention({ ...spec, factor: p.factor(S) }));
        const got = await runOnce(patched, feeds, 'out');
        assert.ok(maxDiff(got, want) < tol, `S=${S}: patched differs from SSMax by ${maxDiff(got, want)}`);
        assert.ok(maxDiff(want, plain) > 5 * tol, `SSMax should change the output (${maxDiff(want, plain)})`);
      }
    });
  }
});

describe('the factor in the tensor\'s own precision', () => {
  it('a bf16 attention graph: the factor is applied as Cast(fp32) → Mul → Cast(bf16) on the bf16 query', () => {
    const m = model({
      nodes: [...['q', 'k', 'v'].map((x) => node('Cast', [x], [`${x}b`], { to: DataType.BFLOAT16 })),
        node('Transpose', ['kb'], ['kt'], { perm: [0, 1, 3, 2] }), node('MatMul', ['qb', 'kt'], ['mm']), node('Div', ['mm', 'sqrt_d'], ['scores']),
        node('Softmax', ['scores'], ['p'], { axis: -1 }), node('MatMul', ['p', 'vb'], ['out'])],
      inputs: bnshDecl, outputs: [value('out', DataType.BFLOAT16, [])], initializers: [makeTensor('sqrt_d', DataType.BFLOAT16, [], [Math.sqrt(H)])],
    });
    const { model: patched } = patchModel(m, { s: 0.5 });
    const g = patched.graph!;
    const apply = g.node.find((n) => n.name === 'ssmax/L0/apply')!;
    const into = g.node.find((n) => n.output[0] === apply.input[0])!;
    const out = g.node.find((n) => n.input[0] === apply.output[0])!;
    assert.deepEqual([into.opType, into.input[0], into.attribute[0].i], ['Cast', 'qb', DataType.FLOAT]);
    assert.deepEqual([out.opType, out.attribute[0].i], ['Cast', DataType.BFLOAT16]);
    assert.equal(g.node.find((n) => n.opType === 'MatMul' && n.input[1] === 'kt')!.input[0], out.output[0]);
  });

  it('bf16: multiplied in fp32 and rounded to bf16 once (onnxruntime\'s CPU provider has no bf16 Mul)', async () => {
    const x = floats(64, 5, 8);
    const m = model({
      nodes: [node('Cast', ['x'], ['x16'], { to: DataType.BFLOAT16 })],
      inputs: [value('x', DataType.FLOAT, [64])], outputs: [value('y', DataType.FLOAT, [64])],
      initializers: [f32Init('c', [], [1.37])],
    });
    const b = new Builder(new Journal().editor('main', new Graph(m.graph!), 'L0'), 'ssmax/L0/', 8, () => 17);
    const applied = applyFactor(b, 'x16', 'c', DataType.BFLOAT16, 17);
    m.graph!.node.push(node('Cast', [applied.output], ['y'], { to: DataType.FLOAT }));
    const got = await runOnce(m, { x: f32([64], x) }, 'y');
    const bf16 = (v: number): number => {
      const u = new Uint32Array(new Float32Array([v]).buffer)[0];
      const r = (u + 0x7fff + ((u >>> 16) & 1)) & 0xffff0000; // round to nearest even
      return new Float32Array(new Uint32Array([r]).buffer)[0];
    };
    for (let i = 0; i < 64; i++) assert.equal(got[i], bf16(Math.fround(bf16(x[i]) * Math.fround(1.37))), `element ${i}`);
  });
});
