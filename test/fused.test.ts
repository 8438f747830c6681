/**
 * Fused attention operators on onnxruntime's CPU provider: each tiny model is run unpatched against the plain
 * loop reference (to pin down the operator's semantics: masks, causal alignment, caches) and patched against
 * the SSMax loop reference, at several lengths including KV-cache decoding.
 */
import assert from 'node:assert/strict';
import { cliError } from './support/io';
import { describe, it } from 'node:test';
import { DataType, ModelProto, NodeProto } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { Runner } from '../src/verify/run';
import type { Theta } from '../src/policy/prior';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { Feeds } from '../src/verify/inputs';
import { attention, AttentionSpec, bnsd, bsd, f32, floats, i32, i64, maxDiff, runOnce, ssmaxFactor, toBsd } from './support/attention';
import { f32 as f32Init, i64 as i64Init, model, node, value } from './support/build';
import { topoSort } from '../src/graph/toposort';

const TOL = 2e-5;

function ms(opType: string, inputs: string[], outputs: string[], attrs: Record<string, number | number[]>): NodeProto {
  return { ...node(opType, inputs, outputs, attrs, opType), domain: 'com.microsoft' };
}

function withMs(m: ModelProto): ModelProto {
  m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
  return m;
}

/** θ per head for the prior tests (4 heads; the first two for 2-head models). */
const THETA = { alpha: [-0.7, -0.2, 0.3, -1.2], beta: [0.6, 1, 1.4, 0.8], mu: [0, 0.4, -0.3, 0.1] };
const thetaFor = (heads: number): Theta => ({ alpha: THETA.alpha.slice(0, heads), beta: THETA.beta.slice(0, heads), mu: THETA.mu.slice(0, heads) });

/** BAM's prior B for head n, absolute query position i and key j (BAM.md), independent of the tool's code. */
function ggd(n: number, i: number, j: number): number {
  const mu = Math.exp(THETA.mu[n]) - Math.exp(-THETA.mu[n]);
  return -Math.exp(THETA.alpha[n]) * Math.pow(Math.abs(j - i - mu) + 1e-5, THETA.beta[n]);
}

const perHead = (h: number): number[] => Array.from({ length: h }, (_, i) => 0.25 + 0.15 * i);

/** Runs the unpatched and the patched model and checks both against the reference. */
async function check(m: ModelProto, feeds: Feeds, output: string, spec: Omit<AttentionSpec, 'factor'>,
  factor: AttentionSpec['factor'], options: PatchOptions, layout: 'bsd' | 'bnsd' = 'bsd', patchedBias?: AttentionSpec['bias']): Promise<void> {
  const shape = (x: Float64Array): Float64Array => (layout === 'bsd' ? toBsd(x, spec.B, spec.N, spec.S, spec.H) : x);
  const plain = await runOnce(m, feeds, output);
  const wantPlain = shape(attention({ ...spec, factor: () => 1 }));
  assert.ok(maxDiff(plain, wantPlain) < TOL, `unpatched operator differs from the reference: ${maxDiff(plain, wantPlain)}`);
  const { model: patched } = patchModel(m, options);
  const got = await runOnce(patched, feeds, output);
  const want = shape(attention({ ...spec, factor, ...(patchedBias ? { bias: patchedBias } : {}) }));
  assert.ok(maxDiff(got, want) < TOL, `patched output differs from SSMax: ${maxDiff(got, want)}`);
  assert.ok(maxDiff(want, wantPlain) > 1e-3, 'test is too weak: SSMax does not change this case');
}

describe('com.microsoft MultiHeadAttention', () => {
  const B = 2, N = 2, H = 4, D = N * H;

  function mha(opts: { S: number; T: number; bias?: boolean; past?: number; unidirectional?: boolean; attnBias?: boolean }): ModelProto {
    const inputs = ['q', 'k', 'v', opts.bias ? 'bias' : '', '', opts.attnBias ? 'attn_bias' : '', opts.past !== undefined ? 'past_k' : '', opts.past !== undefined ? 'past_v' : ''];
    const outputs = opts.past !== undefined ? ['out', 'present_k', 'present_v'] : ['out'];
    const vi = [value('q', DataType.FLOAT, ['B', 'S', D]), value('k', DataType.FLOAT, ['B', 'L', D]), value('v', DataType.FLOAT, ['B', 'L', D])];
    if (opts.attnBias) vi.push(value('attn_bias', DataType.FLOAT, [1, N, 'S', 'T']));
    if (opts.past !== undefined) vi.push(value('past_k', DataType.FLOAT, ['B', N, 'P', H]), value('past_v', DataType.FLOAT, ['B', N, 'P', H]));
    const attrs: Record<string, number> = { num_heads: N };
    if (opts.unidirectional) attrs.unidirectional = 1;
    return withMs(model({
      nodes: [ms('MultiHeadAttention', inputs.slice(0, Math.max(...inputs.map((x, i) => (x ? i + 1 : 0)))), outputs, attrs)],
      inputs: vi, outputs: outputs.map((o) => value(o, DataType.FLOAT, [])),
      initializers: opts.bias ? [f32Init('bias', [3 * D], Array.from(floats(3 * D, 77, 0.5)))] : [],
    }));
  }

  type Fed = { feeds: Feeds; q: Float32Array; k: Float32Array; v: Float32Array; pk: Float32Array; pv: Float32Array };
  function feedsFor(S: number, L: number, past = 0, seed = 1): Fed {
    const q = floats(B * S * D, seed, 1.5), k = floats(B * L * D, seed + 1, 1.5), v = floats(B * L * D, seed + 2);
    const pk = floats(B * N * past * H, seed + 3, 1.5), pv = floats(B * N * past * H, seed + 4);
    const feeds: Feeds = { q: f32([B, S, D], q), k: f32([B, L, D], k), v: f32([B, L, D], v) };
    if (past >= 0) Object.assign(feeds, { past_k: f32([B, N, past, H], pk), past_v: f32([B, N, past, H], pv) });
    return { feeds, q, k, v, pk, pv };
  }

  it('separate Q/K/V with a bias: keys n, scalar and per-head s, two lengths', async () => {
    const bias = floats(3 * D, 77, 0.5);
    for (const [S, perHeadS] of [[5, false], [9, true]] as const) {
      const { feeds, q, k, v } = feedsFor(S, S);
      const s = perHeadS ? perHead(N) : 0.45;
      const withBias = (x: (b: number, n: number, i: number, d: number) => number, off: number) =>
        (b: number, n: number, i: number, d: number): number => x(b, n, i, d) + bias[off + n * H + d];
      const spec = { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), visible: () => true,
        q: withBias(bsd(q, S, N, H), 0), k: withBias(bsd(k, S, N, H), D), v: withBias(bsd(v, S, N, H), 2 * D) };
      const f = (_b: number, n: number): number => ssmaxFactor(s, S, n);
      const options = perHeadS ? { s } : { s: s as number };
      const { feeds: f2 } = { feeds: Object.fromEntries(Object.entries(feeds).filter(([n]) => !n.startsWith('past'))) };
      await check(mha({ S, T: S, bias: true }), f2, 'out', spec, f, options);
    }
  });

  it('unidirectional with a KV cache: causal n_i = P + i + 1 for a prompt chunk and for one decoded token', async () => {
    for (const [S, P] of [[4, 0], [3, 5], [1, 9]]) {
      const { feeds, q, k, v, pk, pv } = feedsFor(S, S, P, 10 + S);
      const T = P + S;
      const cat = (past: Float32Array, cur: Float32Array) => (b: number, n: number, j: number, d: number): number =>
        (j < P ? past[((b * N + n) * P + j) * H + d] : cur[((b * S + (j - P)) * N + n) * H + d]);
      const spec = { B, N, Nkv: N, S, T, H, scale: 1 / Math.sqrt(H), q: bsd(q, S, N, H), k: cat(pk, k), v: cat(pv, v),
        visible: (_b: number, _n: number, i: number, j: number) => j <= P + i };
      const s = perHead(N);
      await check(mha({ S, T, past: P, unidirectional: true }), feeds, 'out', spec, (_b, n, i) => ssmaxFactor(s, P + i + 1, n),
        { s });
    }
  });

  it('an additive attention_bias (ALiBi-like) is not scaled by the factor', async () => {
    const S = 6;
    const { feeds, q, k, v } = feedsFor(S, S, -1, 30);
    const slopes = [0.5, 0.25];
    const alibi = new Float32Array(N * S * S);
    for (let n = 0; n < N; n++) for (let i = 0; i < S; i++) for (let j = 0; j < S; j++) alibi[(n * S + i) * S + j] = -slopes[n] * Math.abs(i - j);
    feeds.attn_bias = f32([1, N, S, S], alibi);
    const spec = { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bsd(q, S, N, H), k: bsd(k, S, N, H), v: bsd(v, S, N, H),
      visible: () => true, bias: (_b: number, n: number, i: number, j: number) => alibi[(n * S + i) * S + j] };
    await check(mha({ S, T: S, attnBias: true }), feeds, 'out', spec, () => ssmaxFactor(0.5, S, 0), { s: 0.5 });
  });

  it('a ggd prior through attention_bias: c_i·B with a cache (prompt, chunk, decode), alone with --preset none, added to an existing bias', async () => {
    const s = perHead(N);
    const prior = { prior: 'ggd' as const, theta: thetaFor(N) };
    for (const [S, P] of [[4, 0], [3, 5], [1, 9]]) {
      const { feeds, q, k, v, pk, pv } = feedsFor(S, S, P, 40 + S);
      const cat = (past: Float32Array, cur: Float32Array) => (b: number, n: number, j: number, d: number): number =>
        (j < P ? past[((b * N + n) * P + j) * H + d] : cur[((b * S + (j - P)) * N + n) * H + d]);
      const spec = { B, N, Nkv: N, S, T: P + S, H, scale: 1 / Math.sqrt(H), q: bsd(q, S, N, H), k: cat(pk, k), v: cat(pv, v),
        visible: (_b: number, _n: number, i: number, j: number) => j <= P + i };
      const c = (_b: number, n: number, i: number): number => ssmaxFactor(s, P + i + 1, n);
      await check(mha({ S, T: P + S, past: P, unidirectional: true }), feeds, 'out', spec, c,
        { s, ...prior }, 'bsd', (b, n, i, j) => c(b, n, i) * ggd(n, P + i, j));
      await check(mha({ S, T: P + S, past: P, unidirectional: true }), feeds, 'out', spec, () => 1,
        { preset: 'none', ...prior }, 'bsd', (_b, n, i, j) => ggd(n, P + i, j));
    }
    const S = 6;
    const { feeds, q, k, v } = feedsFor(S, S, -1, 31);
    const alibi = new Float32Array(N * S * S).map((_, x) => -0.3 * Math.abs((x % S) - Math.floor(x / S) % S));
    feeds.attn_bias = f32([1, N, S, S], alibi);
    const existing = (n: number, i: number, j: number): number => alibi[(n * S + i) * S + j];
    await check(mha({ S, T: S, attnBias: true }), feeds, 'out', { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H),
      q: bsd(q, S, N, H), k: bsd(k, S, N, H), v: bsd(v, S, N, H), visible: () => true, bias: (_b, n, i, j) => existing(n, i, j) },
    () => ssmaxFactor(0.5, S, 0), { s: 0.5, ...prior }, 'bsd', (_b, n, i, j) => ssmaxFactor(0.5, S, 0) * ggd(n, i, j) + existing(n, i, j));
  });

  it('packed QKV [B,S,N,3,H]: only the query slot is scaled (the CPU provider has no packed kernel: unpacked after patching)', async () => {
    const S = 7;
    const qkv = floats(B * S * N * 3 * H, 41, 1.5);
    const at = (slot: number) => (b: number, n: number, i: number, d: number): number => qkv[((((b * S + i) * N + n) * 3) + slot) * H + d];
    const m = withMs(model({
      nodes: [ms('MultiHeadAttention', ['qkv'], ['out'], { num_heads: N })],
      inputs: [value('qkv', DataType.FLOAT, ['B', 'S', N, 3, H])], outputs: [value('out', DataType.FLOAT, [])],
    }));
    const s = perHead(N);
    const { model: patched, report } = patchModel(m, { s });
    assert.equal(report.sites[0].kind, 'com.microsoft.MultiHeadAttention');
    const feeds = { qkv: f32([B, S, N, 3, H], qkv) };
    const spec = { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: at(0), k: at(1), v: at(2), visible: () => true };
    const got = await runOnce(unpackQkv(patched), feeds, 'out');
    assert.ok(maxDiff(await runOnce(unpackQkv(m), feeds, 'out'), toBsd(attention({ ...spec, factor: () => 1 }), B, N, S, H)) < TOL);
    assert.ok(maxDiff(got, toBsd(attention({ ...spec, factor: (_b, n) => ssmaxFactor(s, S, n) }), B, N, S, H)) < TOL);
  });

  /** The packed MultiHeadAttention rewritten as Split → Reshape → MultiHeadAttention(q, k, v), which the CPU runs. */
  function unpackQkv(m: ModelProto): ModelProto {
    const g = m.graph!;
    const mhaNode = g.node.find((n) => n.opType === 'MultiHeadAttention')!;
    const packed = mhaNode.input[0];
    g.initializer.push({ ...i64Init('split3', [1, 1, 1]) }, i64Init('bsd', [0, 0, -1]));
    g.node.push(node('Split', [packed, 'split3'], ['q5', 'k5', 'v5'], { axis: 3 }));
    for (const x of ['q', 'k', 'v']) g.node.push(node('Reshape', [`${x}5`, 'bsd'], [`${x}_unpacked`]));
    mhaNode.input = ['q_unpacked', 'k_unpacked', 'v_unpacked'];
    topoSort(g);
    return m;
  }

  it('cross attention on cached keys [B,N,L,H]: n = L', async () => {
    const S = 3, L = 11;
    const q = floats(B * S * D, 51, 1.5), k = floats(B * N * L * H, 52, 1.5), v = floats(B * N * L * H, 53);
    const m = withMs(model({
      nodes: [ms('MultiHeadAttention', ['q', 'k', 'v'], ['out'], { num_heads: N })],
      inputs: [value('q', DataType.FLOAT, ['B', 'S', D]), value('k', DataType.FLOAT, ['B', N, 'L', H]), value('v', DataType.FLOAT, ['B', N, 'L', H])],
      outputs: [value('out', DataType.FLOAT, [])],
    }));
    const spec = { B, N, Nkv: N, S, T: L, H, scale: 1 / Math.sqrt(H), q: bsd(q, S, N, H), k: bnsd(k, N, L, H), v: bnsd(v, N, L, H), visible: () => true };
    await check(m, { q: f32([B, S, D], q), k: f32([B, N, L, H], k), v: f32([B, N, L, H], v) }, 'out', spec, () => ssmaxFactor(0.4, L, 0), { s: 0.4 });
  });
});

describe('com.microsoft GroupQueryAttention', () => {
  // onnxruntime's CPU kernel needs a head size that is a multiple of 8.
  const B = 2, N = 4, Nkv = 2, H = 8;

  interface Dims { N: number; Nkv: number; H: number }
  const dims0: Dims = { N, Nkv, H };

  function gqa(opts: { packed?: boolean; rotary?: boolean; window?: number }, dims: Dims = dims0): ModelProto {
    const { N, Nkv, H } = dims;
    const inputs = opts.packed ? ['qkv', '', ''] : ['q', 'k', 'v'];
    inputs.push('past_k', 'past_v', 'seqlens_k', 'total');
    if (opts.rotary) inputs.push('cos', 'sin');
    const attrs: Record<string, number> = { num_heads: N, kv_num_heads: Nkv };
    if (opts.rotary) attrs.do_rotary = 1;
    if (opts.window) attrs.local_window_size = opts.window;
    const vi = opts.packed
      ? [value('qkv', DataType.FLOAT, ['B', 'S', (N + 2 * Nkv) * H])]
      : [value('q', DataType.FLOAT, ['B', 'S', N * H]), value('k', DataType.FLOAT, ['B', 'S', Nkv * H]), value('v', DataType.FLOAT, ['B', 'S', Nkv * H])];
    vi.push(value('past_k', DataType.FLOAT, ['B', Nkv, 'P', H]), value('past_v', DataType.FLOAT, ['B', Nkv, 'P', H]),
      value('seqlens_k', DataType.INT32, ['B']), value('total', DataType.INT32, []));
    if (opts.rotary) vi.push(value('cos', DataType.FLOAT, ['M', H / 2]), value('sin', DataType.FLOAT, ['M', H / 2]));
    return withMs(model({
      nodes: [ms('GroupQueryAttention', inputs, ['out', 'present_k', 'present_v'], attrs)],
      inputs: vi, outputs: ['out', 'present_k', 'present_v'].map((o) => value(o, DataType.FLOAT, [])),
    }));
  }

  /** Query, new keys/values and a cache holding `past[b]` valid positions (buffer length P). */
  function gqaCase(S: number, P: number, past: number[], seed: number, packed = false, dims: Dims = dims0) {
    const { N, Nkv, H } = dims;
    const q = floats(B * S * N * H, seed, 1.5), k = floats(B * S * Nkv * H, seed + 1, 1.5), v = floats(B * S * Nkv * H, seed + 2);
    const pk = floats(B * Nkv * P * H, seed + 3, 1.5), pv = floats(B * Nkv * P * H, seed + 4);
    const totals = past.map((p) => p + S);
    const feeds: Feeds = {
      past_k: f32([B, Nkv, P, H], pk), past_v: f32([B, Nkv, P, H], pv),
      seqlens_k: i32([B], totals.map((t) => t - 1)), total: i32([], [Math.max(...totals)]),
    };
    if (packed) {
      const W = (N + 2 * Nkv) * H;
      const qkv = new Float32Array(B * S * W);
      for (let b = 0; b < B; b++) for (let i = 0; i < S; i++) {
        qkv.set(q.subarray((b * S + i) * N * H, (b * S + i + 1) * N * H), (b * S + i) * W);
        qkv.set(k.subarray((b * S + i) * Nkv * H, (b * S + i + 1) * Nkv * H), (b * S + i) * W + N * H);
        qkv.set(v.subarray((b * S + i) * Nkv * H, (b * S + i + 1) * Nkv * H), (b * S + i) * W + (N + Nkv) * H);
      }
      feeds.qkv = f32([B, S, W], qkv);
    } else Object.assign(feeds, { q: f32([B, S, N * H], q), k: f32([B, S, Nkv * H], k), v: f32([B, S, Nkv * H], v) });
    const cat = (cache: Float32Array, cur: Float32Array) => (b: number, m: number, j: number, d: number): number =>
      (j < past[b] ? cache[((b * Nkv + m) * P + j) * H + d] : cur[((b * S + (j - past[b])) * Nkv + m) * H + d]);
    return { feeds, q: bsd(q, S, N, H), k: cat(pk, k), v: cat(pv, v), totals };
  }

  it('prompt (empty cache) and decoding with a ragged cache: n from seqlens_k, not from the buffer', async () => {
    const s = perHead(N);
    const options = { s };
    // Prompt: S = total, cache buffer empty; every row i sees i + 1 keys.
    let c = gqaCase(6, 0, [0, 0], 60);
    await check(gqa({}), c.feeds, 'out', { B, N, Nkv, S: 6, T: 6, H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
      visible: (_b, _n, i, j) => j <= i }, (_b, n, i) => ssmaxFactor(s, i + 1, n), options);
    // Decoding one token after 5 and 8 cached positions in a buffer of 8: n_b = past_b + 1.
    c = gqaCase(1, 8, [5, 8], 70);
    await check(gqa({}), c.feeds, 'out', { B, N, Nkv, S: 1, T: 9, H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
      visible: (b, _n, _i, j) => j < c.totals[b] }, (b, n) => ssmaxFactor(s, c.totals[b], n), options);
  });

  it('a ggd prior through attention_bias: prompt and a ragged cache, the query at position past_b + i of its own item', async () => {
    const s = perHead(N);
    const options = { s, prior: 'ggd' as const, theta: thetaFor(N) };
    for (const [S, P, past] of [[6, 0, [0, 0]], [1, 8, [5, 8]], [1, 8, [2, 7]]] as const) {
      const c = gqaCase(S, P, [...past], 61 + S);
      const row = (b: number, i: number): number => c.totals[b] - S + i;
      const f = (b: number, n: number, i: number): number => ssmaxFactor(s, row(b, i) + 1, n);
      await check(gqa({}), c.feeds, 'out', { B, N, Nkv, S, T: Math.max(...c.totals), H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
        visible: (b, _n, i, j) => j <= row(b, i) }, f, options, 'bsd', (b, n, i, j) => f(b, n, i) * ggd(n, row(b, i), j));
    }
  });

  it('packed QKV: only the query columns are scaled', async () => {
    const c = gqaCase(5, 0, [0, 0], 80, true);
    await check(gqa({ packed: true }), c.feeds, 'out', { B, N, Nkv, S: 5, T: 5, H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
      visible: (_b, _n, i, j) => j <= i }, (_b, _n, i) => ssmaxFactor(0.5, i + 1, 0), { s: 0.5 });
  });

  it('packed QKV with s per head: each query column gets its head\'s factor, the key and value columns none', async () => {
    const s = perHead(N);
    const c = gqaCase(5, 0, [0, 0], 81, true);
    await check(gqa({ packed: true }), c.feeds, 'out', { B, N, Nkv, S: 5, T: 5, H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
      visible: (_b, _n, i, j) => j <= i }, (_b, n, i) => ssmaxFactor(s, i + 1, n), { s });
  });

  it('packed QKV feeding a projection: the patch loads at every optimisation level (the packed width stays known)', async () => {
    // Slicing the query out and concatenating it back made the width unknown; onnxruntime's GroupQueryAttention
    // shape inference then gave its output a width the projection refused, at 'basic' and above
    // (ogenai_tiny-llm-sharedbuffer).
    const m = gqa({ packed: true });
    const D = N * H;
    m.graph!.node.push(node('MatMul', ['out', 'w_o'], ['y']));
    m.graph!.initializer.push(f32Init('w_o', [D, D], Array.from(floats(D * D, 7))));
    m.graph!.output = [value('y', DataType.FLOAT, ['B', 'S', D]), value('present_k', DataType.FLOAT, []), value('present_v', DataType.FLOAT, [])];
    m.graph!.valueInfo.push(value('out', DataType.FLOAT, ['B', 'S', D]));
    const { model: patched } = patchModel(m, { s: 0.5 });
    for (const level of ['all', 'disabled'] as const) {
      const runner = await Runner.create(encodeModel(patched), `patched at ${level}`, level);
      await runner.release();
    }
  });

  it('at default opset 11 every inserted node has its opset-11 form (Unsqueeze with an axes attribute)', async () => {
    const m = gqa({});
    m.opsetImport[0].version = 11;
    const { model: patched } = patchModel(m, { s: perHead(N) });
    const unsqueezes = patched.graph!.node.filter((n) => n.opType === 'Unsqueeze');
    assert.ok(unsqueezes.length > 0 && unsqueezes.every((n) => n.input.length === 1 && n.attribute.some((a) => a.name === 'axes')));
    const c = gqaCase(6, 0, [0, 0], 62);
    const got = await runOnce(patched, c.feeds, 'out');
    const want = toBsd(attention({ B, N, Nkv, S: 6, T: 6, H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
      visible: (_b, _n, i, j) => j <= i, factor: (_b, n, i) => ssmaxFactor(perHead(N), i + 1, n) }), B, N, 6, H);
    assert.ok(maxDiff(got, want) < TOL, `patched output at opset 11 differs from SSMax: ${maxDiff(got, want)}`);
  });

  it('local_window_size W: row i sees keys i − W + 1 … i, n = min(i + 1, W)', async () => {
    const W = 3;
    const c = gqaCase(7, 0, [0, 0], 90);
    await check(gqa({ window: W }), c.feeds, 'out', { B, N, Nkv, S: 7, T: 7, H, scale: 1 / Math.sqrt(H), q: c.q, k: c.k, v: c.v,
      visible: (_b, _n, i, j) => j <= i && j > i - W }, (_b, _n, i) => ssmaxFactor(0.5, Math.min(i + 1, W), 0), { s: 0.5 });
  });

  it('do_rotary: the factor on the query commutes with RoPE inside the kernel', async () => {
    // The CPU kernel's rotary path needs a head size that is a multiple of 16: 2 heads of 16 here.
    const S = 5, M = 16, H = 16, half = H / 2, N = 2, Nkv = 1;
    const cos = new Float32Array(M * half), sin = new Float32Array(M * half);
    for (let p = 0; p < M; p++) for (let d = 0; d < half; d++) {
      const a = p / 10000 ** ((2 * d) / H);
      cos[p * half + d] = Math.cos(a); sin[p * half + d] = Math.sin(a);
    }
    const rope = (x: (b: number, n: number, i: number, d: number) => number, pos: (i: number) => number) =>
      (b: number, n: number, i: number, d: number): number => {
        const p = pos(i), dd = d % half;
        const c0 = cos[p * half + dd], s0 = sin[p * half + dd];
        return d < half ? x(b, n, i, d) * c0 - x(b, n, i, d + half) * s0 : x(b, n, i, d) * c0 + x(b, n, i, d - half) * s0;
      };
    const c = gqaCase(S, 0, [0, 0], 100, false, { N, Nkv, H });
    c.feeds.cos = f32([M, half], cos);
    c.feeds.sin = f32([M, half], sin);
    await check(gqa({ rotary: true }, { N, Nkv, H }), c.feeds, 'out', { B, N, Nkv, S, T: S, H, scale: 1 / Math.sqrt(H),
      q: rope(c.q, (i) => i), k: rope(c.k, (j) => j), v: c.v, visible: (_b, _n, i, j) => j <= i },
    (_b, _n, i) => ssmaxFactor(0.6, i + 1, 0), { s: 0.6 });
  });

  it('softcap, attention sinks and q_norm_weight are refused with their reason; --force-site accepts them', () => {
    const m = gqa({});
    m.graph!.node[0].attribute.push(node('X', [], [], { softcap: 30.5 }).attribute[0]);
    assert.throws(() => patchModel(m, { s: 0.5 }), cliError(/softcap=30\.5.*--force-site GroupQueryAttention/));
    const forced = patchModel(m, { s: 0.5, force: ['GroupQueryAttention'] });
    assert.match(forced.report.sites[0].deviation ?? '', /softcap/);
    const sink = gqa({});
    sink.graph!.node[0].attribute.push(node('X', [], [], { smooth_softmax: 1 }).attribute[0]);
    assert.throws(() => patchModel(sink, { s: 0.5 }), /attention sink/);
    const qnorm = gqa({});
    qnorm.graph!.node[0].input.push('', '', '', '', '', '', '', 'qn', 'kn'); // inputs 14 and 15
    qnorm.graph!.input.push(value('qn', DataType.FLOAT, [8]), value('kn', DataType.FLOAT, [8]));
    assert.throws(() => patchModel(qnorm, { s: 0.5 }), /q_norm_weight/);
    assert.throws(() => patchModel(m, { s: 0.5, force: ['nope'] }), cliError(/--force-site nope: no such attention node/));
  });
});

describe('com.microsoft Attention (Q computed inside from weights)', () => {
  const B = 2, N = 2, H = 4, D = N * H, IN = 6;

  function msAttention(unidirectional: boolean): ModelProto {
    return withMs(model({
      nodes: [ms('Attention', ['x', 'w', 'bias'], ['out'], unidirectional ? { num_heads: N, unidirectional: 1 } : { num_heads: N })],
      inputs: [value('x', DataType.FLOAT, ['B', 'S', IN])], outputs: [value('out', DataType.FLOAT, [])],
      initializers: [f32Init('w', [IN, 3 * D], Array.from(floats(IN * 3 * D, 5, 0.6))), f32Init('bias', [3 * D], Array.from(floats(3 * D, 6, 0.3)))],
    }));
  }

  it('keys n: the query columns of weights and bias are scaled per head, exactly', async () => {
    const w = floats(IN * 3 * D, 5, 0.6), bias = floats(3 * D, 6, 0.3);
    for (const S of [4, 10]) {
      const x = floats(B * S * IN, 7 + S, 1.5);
      const proj = (slot: number) => (b: number, n: number, i: number, d: number): number => {
        let acc = bias[slot * D + n * H + d];
        for (let e = 0; e < IN; e++) acc += x[(b * S + i) * IN + e] * w[e * 3 * D + slot * D + n * H + d];
        return acc;
      };
      const s = perHead(N);
      await check(msAttention(false), { x: f32([B, S, IN], x) }, 'out',
        { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: proj(0), k: proj(1), v: proj(2), visible: () => true },
        (_b, n) => ssmaxFactor(s, S, n), { s });
    }
  });

  it('a ggd prior: through the expansion (causal, n per row) and through attention_bias (keys n, weights scaled)', async () => {
    const w = floats(IN * 3 * D, 5, 0.6), bias = floats(3 * D, 6, 0.3);
    const S = 7, x = floats(B * S * IN, 17, 1.5);
    const proj = (slot: number) => (b: number, n: number, i: number, d: number): number => {
      let acc = bias[slot * D + n * H + d];
      for (let e = 0; e < IN; e++) acc += x[(b * S + i) * IN + e] * w[e * 3 * D + slot * D + n * H + d];
      return acc;
    };
    const s = perHead(N);
    const options = { s, prior: 'ggd' as const, theta: thetaFor(N) };
    const spec = { B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: proj(0), k: proj(1), v: proj(2) };
    const causal = (_b: number, n: number, i: number): number => ssmaxFactor(s, i + 1, n);
    await check(msAttention(true), { x: f32([B, S, IN], x) }, 'out', { ...spec, visible: (_b, _n, i, j) => j <= i }, causal, options,
      'bsd', (b, n, i, j) => causal(b, n, i) * ggd(n, i, j));
    const keys = (_b: number, n: number): number => ssmaxFactor(s, S, n);
    await check(msAttention(false), { x: f32([B, S, IN], x) }, 'out', { ...spec, visible: () => true }, keys, options,
      'bsd', (b, n, i, j) => keys(b, n) * ggd(n, i, j));
  });

  it('unidirectional: expanded with n per row by default; --n keys keeps the node with its weights scaled (n = Tk)', () => {
    const auto = patchModel(msAttention(true), { s: 0.5 });
    assert.equal(auto.report.sites[0].n, 'causal');
    assert.match(auto.report.sites[0].expanded ?? '', /expanded into its definition/);
    assert.ok(!auto.model.graph!.node.some((n) => n.opType === 'Attention'), 'the node is replaced');
    const keys = patchModel(msAttention(true), { s: 0.5, n: 'keys' });
    assert.equal(keys.report.sites[0].n, 'keys');
    assert.equal(keys.report.sites[0].expanded, undefined);
    assert.ok(keys.model.graph!.node.some((n) => n.opType === 'Attention'));
  });

  it('do_rotary with causal masking: Q never leaves the kernel, so refused; forced, n = Tk', () => {
    const m = msAttention(true);
    m.graph!.node[0].attribute.push(node('X', [], [], { do_rotary: 1 }).attribute[0]);
    assert.throws(() => patchModel(m, { s: 0.5 }), cliError(/do_rotary=1 .* n per row is impossible.*--force-site Attention/));
    assert.equal(patchModel(m, { s: 0.5, force: ['Attention'] }).report.sites[0].n, 'keys');
  });
});

describe('ONNX Attention (opset 23)', () => {
  const B = 2, N = 4, Nkv = 2, H = 4;

  function onnxAttention(opts: { causal?: boolean; past?: boolean; threeD?: boolean; mask?: boolean; opset?: number; nonpad?: boolean }): ModelProto {
    const inputs = ['Q', 'K', 'V', opts.mask ? 'mask' : '', opts.past ? 'past_k' : '', opts.past ? 'past_v' : ''];
    if (opts.nonpad) inputs.push('nonpad');
    while (!inputs[inputs.length - 1]) inputs.pop();
    const attrs: Record<string, number> = {};
    if (opts.causal) attrs.is_causal = 1;
    if (opts.threeD) Object.assign(attrs, { q_num_heads: N, kv_num_heads: Nkv });
    const vi = opts.threeD
      ? [value('Q', DataType.FLOAT, ['B', 'S', N * H]), value('K', DataType.FLOAT, ['B', 'L', Nkv * H]), value('V', DataType.FLOAT, ['B', 'L', Nkv * H])]
      : [value('Q', DataType.FLOAT, ['B', N, 'S', H]), value('K', DataType.FLOAT, ['B', Nkv, 'L', H]), value('V', DataType.FLOAT, ['B', Nkv, 'L', H])];
    if (opts.mask) vi.push(value('mask', DataType.FLOAT, ['S', 'T']));
    if (opts.past) vi.push(value('past_k', DataType.FLOAT, ['B', Nkv, 'P', H]), value('past_v', DataType.FLOAT, ['B', Nkv, 'P', H]));
    if (opts.nonpad) vi.push(value('nonpad', DataType.INT64, ['B']));
    const outputs = opts.past ? ['Y', 'present_k', 'present_v'] : ['Y'];
    return model({ nodes: [node('Attention', inputs, outputs, attrs, 'Attention')], inputs: vi,
      outputs: outputs.map((o) => value(o, DataType.FLOAT, [])), opset: opts.opset ?? 23 });
  }

  function tensors(S: number, L: number, P: number, seed: number) {
    return {
      q: floats(B * N * S * H, seed, 1.5), k: floats(B * Nkv * L * H, seed + 1, 1.5), v: floats(B * Nkv * L * H, seed + 2),
      pk: floats(B * Nkv * P * H, seed + 3, 1.5), pv: floats(B * Nkv * P * H, seed + 4),
    };
  }

  it('4-D, GQA heads, causal with a KV cache: n_i = P + i + 1 (prompt, chunk and one decoded token)', async () => {
    const s = perHead(N);
    for (const [S, P] of [[5, 0], [3, 4], [1, 9]]) {
      const t = tensors(S, S, P, 200 + S);
      const cat = (past: Float32Array, cur: Float32Array) => (b: number, m: number, j: number, d: number): number =>
        (j < P ? past[((b * Nkv + m) * P + j) * H + d] : cur[((b * Nkv + m) * S + (j - P)) * H + d]);
      const feeds: Feeds = { Q: f32([B, N, S, H], t.q), K: f32([B, Nkv, S, H], t.k), V: f32([B, Nkv, S, H], t.v),
        past_k: f32([B, Nkv, P, H], t.pk), past_v: f32([B, Nkv, P, H], t.pv) };
      await check(onnxAttention({ causal: true, past: true }), feeds, 'Y',
        { B, N, Nkv, S, T: P + S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: cat(t.pk, t.k), v: cat(t.pv, t.v),
          visible: (_b, _n, i, j) => j <= P + i }, (_b, n, i) => ssmaxFactor(s, P + i + 1, n), { s }, 'bnsd');
    }
  });

  it('3-D with q_num_heads, additive mask: keys n, the mask not scaled', async () => {
    const S = 6;
    const t = tensors(S, S, 0, 300);
    const mask = new Float32Array(S * S).map((_, x) => ((x * 7) % 5 === 0 ? -1e4 : 0));
    const toBsdF = (x: Float32Array, heads: number): Float32Array => Float32Array.from(toBsd(Float64Array.from(x), B, heads, S, H));
    const feeds: Feeds = { Q: f32([B, S, N * H], toBsdF(t.q, N)), K: f32([B, S, Nkv * H], toBsdF(t.k, Nkv)),
      V: f32([B, S, Nkv * H], toBsdF(t.v, Nkv)), mask: f32([S, S], mask) };
    await check(onnxAttention({ threeD: true, mask: true }), feeds, 'Y',
      { B, N, Nkv, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, Nkv, S, H), v: bnsd(t.v, Nkv, S, H),
        visible: () => true, bias: (_b, _n, i, j) => mask[i * S + j] }, () => ssmaxFactor(0.5, S, 0), { s: 0.5 });
  });

  it('a ggd prior through attn_mask: causal with a cache, and added to an existing float mask (3-D, keys n)', async () => {
    const s = perHead(N);
    const prior = { prior: 'ggd' as const, theta: thetaFor(N) };
    for (const [S, P] of [[5, 0], [1, 9]]) {
      const t = tensors(S, S, P, 210 + S);
      const cat = (past: Float32Array, cur: Float32Array) => (b: number, m: number, j: number, d: number): number =>
        (j < P ? past[((b * Nkv + m) * P + j) * H + d] : cur[((b * Nkv + m) * S + (j - P)) * H + d]);
      const feeds: Feeds = { Q: f32([B, N, S, H], t.q), K: f32([B, Nkv, S, H], t.k), V: f32([B, Nkv, S, H], t.v),
        past_k: f32([B, Nkv, P, H], t.pk), past_v: f32([B, Nkv, P, H], t.pv) };
      const c = (_b: number, n: number, i: number): number => ssmaxFactor(s, P + i + 1, n);
      await check(onnxAttention({ causal: true, past: true }), feeds, 'Y',
        { B, N, Nkv, S, T: P + S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: cat(t.pk, t.k), v: cat(t.pv, t.v),
          visible: (_b, _n, i, j) => j <= P + i }, c, { s, ...prior }, 'bnsd', (b, n, i, j) => c(b, n, i) * ggd(n, P + i, j));
    }
    const S = 6;
    const t = tensors(S, S, 0, 310);
    const mask = new Float32Array(S * S).map((_, x) => ((x * 7) % 5 === 0 ? -1e4 : 0));
    const toBsdF = (x: Float32Array, heads: number): Float32Array => Float32Array.from(toBsd(Float64Array.from(x), B, heads, S, H));
    const feeds: Feeds = { Q: f32([B, S, N * H], toBsdF(t.q, N)), K: f32([B, S, Nkv * H], toBsdF(t.k, Nkv)),
      V: f32([B, S, Nkv * H], toBsdF(t.v, Nkv)), mask: f32([S, S], mask) };
    const c = ssmaxFactor(0.5, S, 0);
    await check(onnxAttention({ threeD: true, mask: true }), feeds, 'Y',
      { B, N, Nkv, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, Nkv, S, H), v: bnsd(t.v, Nkv, S, H),
        visible: () => true, bias: (_b, _n, i, j) => mask[i * S + j] }, () => c, { s: 0.5, ...prior }, 'bsd',
    (_b, n, i, j) => c * ggd(n, i, j) + mask[i * S + j]);
  });

  it('opset 24 nonpad_kv_seqlen with a static cache: n from the valid lengths, not the buffer', async () => {
    const S = 1, L = 8, lengths = [5, 8];
    const t = tensors(S, L, 0, 400);
    const feeds: Feeds = { Q: f32([B, N, S, H], t.q), K: f32([B, Nkv, L, H], t.k), V: f32([B, Nkv, L, H], t.v), nonpad: i64([B], lengths) };
    await check(onnxAttention({ causal: true, nonpad: true, opset: 24 }), feeds, 'Y',
      { B, N, Nkv, S, T: L, H, scale: 1 / Math.sqrt(H), q: bnsd(t.q, N, S, H), k: bnsd(t.k, Nkv, L, H), v: bnsd(t.v, Nkv, L, H),
        visible: (b, _n, i, j) => j < lengths[b] && j <= lengths[b] - S + i }, (b) => ssmaxFactor(0.5, lengths[b], 0), { s: 0.5 }, 'bnsd');
  });
});

describe('com.microsoft DecoderMaskedMultiHeadAttention', () => {
  const B = 2, N = 2, H = 8, D = N * H;

  function dmmha(opts: { share: boolean; bias?: boolean }): ModelProto {
    const inputs = ['q', 'k', 'v', '', '', 'past_k', 'past_v', opts.share ? 'past_len' : '', '', '', opts.bias ? 'bias' : ''];
    while (!inputs[inputs.length - 1]) inputs.pop();
    const vi = [value('q', DataType.FLOAT, ['B', 1, D]), value('k', DataType.FLOAT, ['B', 1, D]), value('v', DataType.FLOAT, ['B', 1, D]),
      value('past_k', DataType.FLOAT, ['B', N, 'P', H]), value('past_v', DataType.FLOAT, ['B', N, 'P', H])];
    if (opts.share) vi.push(value('past_len', DataType.INT32, [1]));
    return withMs(model({
      nodes: [ms('DecoderMaskedMultiHeadAttention', inputs, ['out', 'present_k', 'present_v'], { num_heads: N, past_present_share_buffer: opts.share ? 1 : 0 })],
      inputs: vi, outputs: ['out', 'present_k', 'present_v'].map((o) => value(o, DataType.FLOAT, [])),
      initializers: opts.bias ? [f32Init('bias', [3 * D], Array.from(floats(3 * D, 97, 0.5)))] : [],
    }));
  }

  it('one token after a cache, with a shared buffer and past_sequence_length: n = past + 1; the bias handled', async () => {
    const P = 6, MAX = 10;
    const q = floats(B * D, 81, 1.5), k = floats(B * D, 82, 1.5), v = floats(B * D, 83);
    const pk = floats(B * N * MAX * H, 84, 1.5), pv = floats(B * N * MAX * H, 85);
    const bias = floats(3 * D, 97, 0.5);
    const add = (x: Float32Array, off: number) => (b: number, n: number, _i: number, d: number): number => x[b * D + n * H + d] + bias[off + n * H + d];
    const cat = (past: Float32Array, cur: (b: number, n: number, i: number, d: number) => number) => (b: number, n: number, j: number, d: number): number =>
      (j < P ? past[((b * N + n) * MAX + j) * H + d] : cur(b, n, 0, d));
    const feeds: Feeds = { q: f32([B, 1, D], q), k: f32([B, 1, D], k), v: f32([B, 1, D], v),
      past_k: f32([B, N, MAX, H], pk), past_v: f32([B, N, MAX, H], pv), past_len: i32([1], [P]) };
    const s = perHead(N);
    await check(dmmha({ share: true, bias: true }), feeds, 'out',
      { B, N, Nkv: N, S: 1, T: P + 1, H, scale: 1 / Math.sqrt(H), q: add(q, 0), k: cat(pk, add(k, D)), v: cat(pv, add(v, 2 * D)), visible: () => true },
      (_b, n) => ssmaxFactor(s, P + 1, n), { s });
  });

  it('a ggd prior through attention_bias on a shared buffer: the token at position past, keys 0 … past', async () => {
    const P = 6, MAX = 10;
    const q = floats(B * D, 181, 1.5), k = floats(B * D, 182, 1.5), v = floats(B * D, 183);
    const pk = floats(B * N * MAX * H, 184, 1.5), pv = floats(B * N * MAX * H, 185);
    const at = (x: Float32Array) => (b: number, n: number, _i: number, d: number): number => x[b * D + n * H + d];
    const cat = (past: Float32Array, cur: (b: number, n: number, i: number, d: number) => number) => (b: number, n: number, j: number, d: number): number =>
      (j < P ? past[((b * N + n) * MAX + j) * H + d] : cur(b, n, 0, d));
    const feeds: Feeds = { q: f32([B, 1, D], q), k: f32([B, 1, D], k), v: f32([B, 1, D], v),
      past_k: f32([B, N, MAX, H], pk), past_v: f32([B, N, MAX, H], pv), past_len: i32([1], [P]) };
    const s = perHead(N);
    const c = (_b: number, n: number): number => ssmaxFactor(s, P + 1, n);
    await check(dmmha({ share: true }), feeds, 'out',
      { B, N, Nkv: N, S: 1, T: P + 1, H, scale: 1 / Math.sqrt(H), q: at(q), k: cat(pk, at(k)), v: cat(pv, at(v)), visible: () => true },
      c, { s, prior: 'ggd' as const, theta: thetaFor(N) }, 'bsd', (b, n, _i, j) => c(b, n) * ggd(n, P, j));
  });
});

describe('com.microsoft DecoderMaskedMultiHeadAttention, cross attention', () => {
  it('one token attending to cached encoder keys [B,N,L,H]: n = L', async () => {
    const B = 2, N = 2, H = 8, D = N * H, L = 9;
    const q = floats(B * D, 91, 1.5), k = floats(B * N * L * H, 92, 1.5), v = floats(B * N * L * H, 93);
    const m = withMs(model({
      nodes: [ms('DecoderMaskedMultiHeadAttention', ['q', 'k', 'v'], ['out'], { num_heads: N })],
      inputs: [value('q', DataType.FLOAT, ['B', 1, D]), value('k', DataType.FLOAT, ['B', N, 'L', H]), value('v', DataType.FLOAT, ['B', N, 'L', H])],
      outputs: [value('out', DataType.FLOAT, [])],
    }));
    const feeds: Feeds = { q: f32([B, 1, D], q), k: f32([B, N, L, H], k), v: f32([B, N, L, H], v) };
    await check(m, feeds, 'out', { B, N, Nkv: N, S: 1, T: L, H, scale: 1 / Math.sqrt(H), q: bsd(q, 1, N, H), k: bnsd(k, N, L, H), v: bnsd(v, N, L, H),
      visible: () => true }, () => ssmaxFactor(0.5, L, 0), { s: 0.5 });
  });
});

describe('fused sites: --n, per-head s checks, shared buffers, --update-s', () => {
  const B = 2, N = 4, Nkv = 2, H = 8;
  function gqaPrompt(): ModelProto {
    return withMs(model({
      nodes: [ms('GroupQueryAttention', ['q', 'k', 'v', '', '', 'seqlens_k', 'total'], ['out'], { num_heads: N, kv_num_heads: Nkv })],
      inputs: [value('q', DataType.FLOAT, ['B', 'S', N * H]), value('k', DataType.FLOAT, ['B', 'S', Nkv * H]), value('v', DataType.FLOAT, ['B', 'S', Nkv * H]),
        value('seqlens_k', DataType.INT32, ['B']), value('total', DataType.INT32, [])],
      outputs: [value('out', DataType.FLOAT, [])],
    }));
  }
  const S = 6;
  const q = floats(B * S * N * H, 1, 1.5), k = floats(B * S * Nkv * H, 2, 1.5), v = floats(B * S * Nkv * H, 3);
  const feeds: Feeds = { q: f32([B, S, N * H], q), k: f32([B, S, Nkv * H], k), v: f32([B, S, Nkv * H], v),
    seqlens_k: i32([B], [S - 1, S - 1]), total: i32([], [S]) };

  it('--n keys on a causal GroupQueryAttention: every row gets n = total length', async () => {
    const { model: patched, report } = patchModel(gqaPrompt(), { s: 0.5, n: 'keys' });
    assert.equal(report.sites[0].n, 'keys');
    const want = toBsd(attention({ B, N, Nkv, S, T: S, H, scale: 1 / Math.sqrt(H), q: bsd(q, S, N, H), k: bsd(k, S, Nkv, H), v: bsd(v, S, Nkv, H),
      visible: (_b, _n, i, j) => j <= i, factor: () => ssmaxFactor(0.5, S, 0) }), B, N, S, H);
    assert.ok(maxDiff(await runOnce(patched, feeds, 'out'), want) < TOL);
  });

  it('per-head s is checked against num_heads', () => {
    assert.throws(() => patchModel(gqaPrompt(), { s: [0.1, 0.2, 0.3] }), /s gives 3 heads for layer 0, the model has 4 heads there/);
  });

  it('a shared past/present buffer without past_sequence_length is refused: its length is not the sequence length', () => {
    const m = withMs(model({
      nodes: [ms('DecoderMaskedMultiHeadAttention', ['q', 'k', 'v', '', '', 'pk', 'pv'], ['out', 'pko', 'pvo'], { num_heads: 2, past_present_share_buffer: 1 })],
      inputs: [...['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, ['B', 1, 16])), value('pk', DataType.FLOAT, ['B', 2, 'M', 8]), value('pv', DataType.FLOAT, ['B', 2, 'M', 8])],
      outputs: ['out', 'pko', 'pvo'].map((n) => value(n, DataType.FLOAT, [])),
    }));
    assert.throws(() => patchModel(m, { s: 0.5 }), /shared past\/present buffer without past_sequence_length/);
  });

  it('--update-s replaces s of a patched fused site in place', async () => {
    const once = patchModel(gqaPrompt(), { s: 0.3 }).model;
    assert.throws(() => patchModel(once, { s: 0.6 }), /already patched/);
    const updated = patchModel(once, { s: 0.6, updateS: true });
    assert.equal(updated.report.updated, true);
    const fresh = patchModel(gqaPrompt(), { s: 0.6 }).model;
    assert.ok(maxDiff(await runOnce(updated.model, feeds, 'out'), await runOnce(fresh, feeds, 'out')) < 1e-6);
  });
});
