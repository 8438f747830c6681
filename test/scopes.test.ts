/**
 * Attention inside If branches, Loop and Scan bodies and model-local functions: patched where it is, numbered
 * per graph, run on onnxruntime against the loop reference. A function used by several layers gets one s per
 * call site through a new function input.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { findAttentionSoftmax } from '../src/detect/find-attention';
import { modelScopes } from '../src/graph/scopes';
import { readModel } from '../src/io/model-file';
import { DataType, FunctionProto, GraphProto, ModelProto, NodeProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { withUnitFactor } from '../src/verify/verify';
import { attention, bnsd, f32, floats, maxDiff, runOnce, ssmaxFactor } from './support/attention';
import { attentionNodes, f32 as f32Init, graphAttr, i64 as i64Init, model, node, value } from './support/build';
import { CORPUS, corpusSkip } from './support/ref';

const B = 2, N = 2, S = 5, H = 4, D = N * H;
const TOL = 2e-5;

function branch(name: string, nodes: NodeProto[], output: string): GraphProto {
  return { name, node: nodes, input: [], output: [value(output, DataType.FLOAT, [])], initializer: [], valueInfo: [] };
}

const qkvFeeds = (seed: number) => {
  const q = floats(B * N * S * H, seed, 1.5), k = floats(B * N * S * H, seed + 1, 1.5), v = floats(B * N * S * H, seed + 2);
  return { q, k, v, feeds: { q: f32([B, N, S, H], q), k: f32([B, N, S, H], k), v: f32([B, N, S, H], v) } };
};

const ref = (q: Float32Array, k: Float32Array, v: Float32Array, c: (n: number, i: number) => number, causal = false): Float64Array =>
  attention({ B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: bnsd(q, N, S, H), k: bnsd(k, N, S, H), v: bnsd(v, N, S, H),
    visible: (_b, _n, i, j) => !causal || j <= i, factor: (_b, n, i) => c(n, i) });

describe('attention in subgraphs', () => {
  function ifModel(): ModelProto {
    const m = model({
      nodes: [{ ...node('If', ['cond'], ['out'], {}, 'If'), attribute: [
        graphAttr('then_branch', branch('then', attentionNodes('q', 'k', 'v', 'then_out', 'then'), 'then_out')),
        graphAttr('else_branch', branch('else', attentionNodes('k', 'q', 'v', 'else_out', 'else'), 'else_out')),
      ] }],
      inputs: [value('cond', DataType.BOOL, []), ...['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, [B, N, S, H]))],
      outputs: [value('out', DataType.FLOAT, [])], initializers: [f32Init('sqrt_d', [], [Math.sqrt(H)])],
    });
    return m;
  }

  it('If: both branches patched, numbered per graph; a per-layer s gives row 0 to layer 0 of each', async () => {
    const { q, k, v, feeds } = qkvFeeds(1);
    const s = [[0.3, 0.7]];
    const { model: patched, report } = patchModel(ifModel(), { s });
    assert.deepEqual(report.sites.map((x) => [x.scope, x.layer, x.node]), [['main/If.then_branch', 0, 'then_Softmax'], ['main/If.else_branch', 0, 'else_Softmax']]);
    for (const [cond, qq, kk] of [[true, q, k], [false, k, q]] as const) {
      const got = await runOnce(patched, { ...feeds, cond: { type: 'bool', dims: [], data: Uint8Array.from([cond ? 1 : 0]) } }, 'out');
      const want = ref(qq, kk, v, (n) => ssmaxFactor(s[0], S, n));
      assert.ok(maxDiff(got, want) < TOL, `cond=${cond}: ${maxDiff(got, want)}`);
    }
  });

  it('Loop: the body\'s attention is patched and applied at every iteration', async () => {
    const { q, k, v, feeds } = qkvFeeds(11);
    const body: GraphProto = {
      name: 'body', initializer: [], valueInfo: [],
      input: [value('i', DataType.INT64, []), value('c_in', DataType.BOOL, []), value('state', DataType.FLOAT, [B, N, S, H])],
      output: [value('c_out', DataType.BOOL, []), value('state_out', DataType.FLOAT, [B, N, S, H])],
      node: [node('Identity', ['c_in'], ['c_out'], {}, 'loop_cond'), ...attentionNodes('state', 'k', 'v', 'state_out', 'loop')],
    };
    const m = model({
      nodes: [{ ...node('Loop', ['trips', 'go', 'q'], ['out'], {}, 'Loop'), attribute: [graphAttr('body', body)] }],
      inputs: ['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, [B, N, S, H])), outputs: [value('out', DataType.FLOAT, [])],
      initializers: [f32Init('sqrt_d', [], [Math.sqrt(H)]), i64Init('trips', [2], true), { ...i64Init('go', [1], true), dataType: DataType.BOOL, rawData: Uint8Array.from([1]) }],
    });
    const { model: patched, report } = patchModel(m, { s: 0.6 });
    assert.equal(report.sites[0].scope, 'main/Loop.body');
    const once = Float32Array.from(ref(q, k, v, () => ssmaxFactor(0.6, S, 0)));
    const twice = ref(once, k, v, () => ssmaxFactor(0.6, S, 0));
    assert.ok(maxDiff(await runOnce(patched, feeds, 'out'), twice) < TOL);
  });

  it('Scan: attention over each batch element (3-D logits) is patched', async () => {
    const { q, k, v, feeds } = qkvFeeds(21);
    const body: GraphProto = {
      name: 'scan_body', initializer: [], valueInfo: [],
      input: ['qs', 'ks', 'vs'].map((n) => value(n, DataType.FLOAT, [N, S, H])), output: [value('os', DataType.FLOAT, [N, S, H])],
      node: [
        node('Transpose', ['ks'], ['scan_kt'], { perm: [0, 2, 1] }, 'scan_Transpose'), node('MatMul', ['qs', 'scan_kt'], ['scan_mm'], {}, 'scan_MatMul'),
        node('Div', ['scan_mm', 'sqrt_d'], ['scan_scores'], {}, 'scan_Div'), node('Softmax', ['scan_scores'], ['scan_p'], { axis: 2 }, 'scan_Softmax'),
        node('MatMul', ['scan_p', 'vs'], ['os'], {}, 'scan_MatMulV'),
      ],
    };
    const m = model({
      nodes: [{ ...node('Scan', ['q', 'k', 'v'], ['out'], { num_scan_inputs: 3 }, 'Scan'), attribute: [graphAttr('body', body), node('x', [], [], { num_scan_inputs: 3 }).attribute[0]] }],
      inputs: ['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, [B, N, S, H])), outputs: [value('out', DataType.FLOAT, [])],
      initializers: [f32Init('sqrt_d', [], [Math.sqrt(H)])],
    });
    const { model: patched, report } = patchModel(m, { s: 0.5 });
    assert.equal(report.sites[0].scope, 'main/Scan.body');
    assert.equal(report.sites[0].logitsRank, 3);
    assert.ok(maxDiff(await runOnce(patched, feeds, 'out'), ref(q, k, v, () => ssmaxFactor(0.5, S, 0))) < TOL);
  });

  const greedy = path.join(CORPUS, 'ort_tiny_gpt2_greedysearch_with_init_decoder.onnx');
  it('GreedySearch decoder graphs (corpus): the causal com.microsoft Attention nodes of both decoders are expanded and patched',
    { skip: corpusSkip(path.basename(greedy)) }, async () => {
      const m = readModel(greedy);
      const { model: patched, report } = patchModel(m, { s: 0.4 });
      assert.equal(report.sites.length, 10);
      assert.deepEqual([...new Set(report.sites.map((x) => x.scope))].sort(), ['main/GreedySearch_gpt2.decoder', 'main/GreedySearch_gpt2.init_decoder']);
      assert.ok(report.sites.every((x) => x.n === 'causal-padding' && x.expanded), report.sites.map((x) => `${x.n} ${x.nReason}`).join('\n'));
      // Item 0 left-padded (pad token 0): the decoders see an attention mask with zeros.
      const feeds = { input_ids: { type: 'int32' as const, dims: [2, 4], data: Int32Array.from([0, 0, 30, 40, 10, 20, 30, 40]) },
        max_length: { type: 'int32' as const, dims: [1], data: Int32Array.from([12]) }, min_length: { type: 'int32' as const, dims: [1], data: Int32Array.from([1]) },
        repetition_penalty: { type: 'float32' as const, dims: [1], data: Float32Array.from([1]) } };
      const original = await runOnce(m, feeds, 'sequences');
      assert.deepEqual(Array.from(await runOnce(withUnitFactor(patched), feeds, 'sequences')), Array.from(original), 'factor 1 changed the generated tokens');
      assert.equal((await runOnce(patched, feeds, 'sequences')).length, 24);
    });
});

describe('attention inside model-local functions', () => {
  /** local:SelfAttention(x, wq, wk, wv) → y: projections, heads, attention, merge; weights come in as inputs. */
  function selfAttentionFn(): FunctionProto {
    const split = (x: string): NodeProto[] => [
      node('MatMul', ['x', `w${x}`], [`${x}p`], {}, `${x}_proj`), node('Reshape', [`${x}p`, 'heads'], [`${x}4`], {}, `${x}_heads`),
      node('Transpose', [`${x}4`], [`${x}h`], { perm: x === 'k' ? [0, 2, 3, 1] : [0, 2, 1, 3] }, `${x}_transpose`),
    ];
    return {
      name: 'SelfAttention', domain: 'local', input: ['x', 'wq', 'wk', 'wv'], output: ['y'], opsetImport: [{ domain: '', version: 17 }],
      node: [
        node('Constant', [], ['heads'], { value: i64Init('', [0, 0, N, H]) }, 'c_heads'), node('Constant', [], ['merge'], { value: i64Init('', [0, 0, D]) }, 'c_merge'),
        node('Constant', [], ['sqrt_d'], { value: f32Init('', [], [Math.sqrt(H)]) }, 'c_sqrt'),
        ...split('q'), ...split('k'), ...split('v'),
        node('MatMul', ['qh', 'kh'], ['mm'], {}, 'qk'), node('Div', ['mm', 'sqrt_d'], ['scores'], {}, 'scale'),
        node('Softmax', ['scores'], ['p'], { axis: -1 }, 'fn_Softmax'), node('MatMul', ['p', 'vh'], ['ctx'], {}, 'pv'),
        node('Transpose', ['ctx'], ['ctx_t'], { perm: [0, 2, 1, 3] }, 'ctx_transpose'), node('Reshape', ['ctx_t', 'merge'], ['y'], {}, 'ctx_merge'),
      ],
    };
  }

  function twoLayers(): ModelProto {
    const call = (x: string, layer: number, y: string): NodeProto => ({ ...node('SelfAttention', [x, `wq${layer}`, `wk${layer}`, `wv${layer}`], [y], {}, `layer${layer}`), domain: 'local' });
    const weights = [0, 1].flatMap((l) => ['q', 'k', 'v'].map((x, i) => f32Init(`w${x}${l}`, [D, D], Array.from(floats(D * D, 100 + 10 * l + i, 0.6)))));
    const m = model({
      nodes: [call('x', 0, 'h1'), call('h1', 1, 'out')],
      inputs: [value('x', DataType.FLOAT, ['B', 'S', D])], outputs: [value('out', DataType.FLOAT, [])], initializers: weights,
    });
    m.opsetImport.push({ domain: 'local', version: 1 });
    m.functions.push(selfAttentionFn());
    return m;
  }

  /** The two-layer model in loops: per layer, projections and SSMax attention with that layer's s. */
  function reference(x: Float32Array, s: number[][]): Float64Array {
    let h = Float64Array.from(x);
    for (let l = 0; l < 2; l++) {
      const w = ['q', 'k', 'v'].map((_, i) => floats(D * D, 100 + 10 * l + i, 0.6));
      const proj = w.map((wm) => {
        const out = new Float32Array(B * S * D);
        for (let r = 0; r < B * S; r++) for (let c = 0; c < D; c++) {
          let acc = 0;
          for (let e = 0; e < D; e++) acc += h[r * D + e] * wm[e * D + c];
          out[r * D + c] = acc;
        }
        return out;
      });
      const at = (t: Float32Array) => (b: number, n: number, i: number, d: number): number => t[(b * S + i) * D + n * H + d];
      const o = attention({ B, N, Nkv: N, S, T: S, H, scale: 1 / Math.sqrt(H), q: at(proj[0]), k: at(proj[1]), v: at(proj[2]),
        visible: () => true, factor: (_b, n) => ssmaxFactor(s[l], S, n) });
      const next = new Float64Array(B * S * D);
      for (let b = 0; b < B; b++) for (let n = 0; n < N; n++) for (let i = 0; i < S; i++) for (let d = 0; d < H; d++) {
        next[(b * S + i) * D + n * H + d] = o[((b * N + n) * S + i) * H + d];
      }
      h = next;
    }
    return h;
  }

  it('one function, two call sites: two layers, each with its own per-head s', async () => {
    const s = [[0.3, 0.5], [0.7, 0.4]];
    const { model: patched, report } = patchModel(twoLayers(), { s });
    assert.deepEqual(report.sites.map((x) => [x.layer, x.scope, x.kind, x.heads]), [[0, 'main', 'call local:SelfAttention', N], [1, 'main', 'call local:SelfAttention', N]]);
    const fn = patched.functions[0];
    assert.equal(fn.input.length, 5, 's comes in through one new function input');
    assert.ok(!fn.node.some((n) => n.opType === 'Constant' && n.output[0].endsWith('/s')), 's is not baked into the body');
    const x = floats(B * S * D, 9, 1.5);
    const got = await runOnce(patched, { x: f32([B, S, D], x) }, 'out');
    assert.ok(maxDiff(got, reference(x, s)) < TOL, `${maxDiff(got, reference(x, s))}`);
    assert.ok(maxDiff(await runOnce(twoLayers(), { x: f32([B, S, D], x) }, 'out'), reference(x, [[0, 0], [0, 0]].map((r) => r.map(() => 1 / Math.log(S))))) < TOL);
  });

  it('--update-s changes the per-call s of a patched function in place', async () => {
    const once = patchModel(twoLayers(), { s: 0.3 }).model;
    const s = [[0.6, 0.2], [0.5, 0.5]];
    assert.throws(() => patchModel(once, { s: 0.6 }), /already patched/);
    assert.throws(() => patchModel(once, { s, updateS: true }), /cannot change s from shape \[\] to \[2,1,1\]/);
    const updated = patchModel(once, { s: 0.45, updateS: true });
    const fresh = patchModel(twoLayers(), { s: 0.45 }).model;
    const x = floats(B * S * D, 19, 1.5);
    assert.ok(maxDiff(await runOnce(updated.model, { x: f32([B, S, D], x) }, 'out'), await runOnce(fresh, { x: f32([B, S, D], x) }, 'out')) < 1e-6);
    assert.equal(updated.model.functions[0].input.length, 5, 'no second factor added');
  });

  it('inside a function, weights passed in from initializers are constants: a classifier head there is skipped', () => {
    const fn: FunctionProto = {
      name: 'Head', domain: 'local', input: ['h', 'w'], output: ['p'], opsetImport: [{ domain: '', version: 17 }],
      node: [node('MatMul', ['h', 'w'], ['logits'], {}, 'head_MatMul'), node('Softmax', ['logits'], ['p'], { axis: -1 }, 'head_Softmax')],
    };
    const m = twoLayers();
    m.functions.push(fn);
    m.graph!.initializer.push(f32Init('w_head', [D, 3], Array.from(floats(D * 3, 7))));
    m.graph!.node.push({ ...node('Head', ['out', 'w_head'], ['probs'], {}, 'head'), domain: 'local' });
    const { report } = patchModel(m, { s: 0.4 });
    assert.equal(report.sites.length, 2);
    const skipped = report.skipped.find((x) => x.node === 'head_Softmax')!;
    assert.match(skipped.reason, /constant weight/);
    assert.equal(skipped.scope, 'function local:Head');
  });

  it('a function nobody calls, and a call from inside another function, are reported, not silently skipped', () => {
    const m = twoLayers();
    m.functions.push({ ...selfAttentionFn(), name: 'Unused' });
    m.functions.push({ name: 'Outer', domain: 'local', input: ['x', 'a', 'b', 'c'], output: ['y'], opsetImport: [{ domain: '', version: 17 }, { domain: 'local', version: 1 }],
      node: [{ ...node('SelfAttention', ['x', 'a', 'b', 'c'], ['y'], {}, 'inner_call'), domain: 'local' }] });
    const { report } = patchModel(m, { s: 0.4 });
    assert.match(report.skipped.find((x) => x.node === 'fn_Softmax' && /Unused/.test(x.reason))?.reason ?? '', /which no graph calls/);
    assert.match(report.skipped.find((x) => x.node === 'inner_call')?.reason ?? '', /nested calls are not patched/);
  });
});

describe('a function body read through its calls', () => {
  /** local:MaskedAttn(q, k, v, mask): attention with an additive mask that comes in as an input. */
  const body = (tag: string, mask: string, sqrt: NodeProto): NodeProto[] => [sqrt,
    node('Transpose', ['k'], [`${tag}kt`], { perm: [0, 1, 3, 2] }, `${tag}Transpose`), node('MatMul', ['q', `${tag}kt`], [`${tag}mm`], {}, `${tag}MatMul`),
    node('Div', [`${tag}mm`, `${tag}sqrt_d`], [`${tag}scores`], {}, `${tag}Div`), node('Add', [`${tag}scores`, mask], [`${tag}masked`], {}, `${tag}Add`),
    node('Softmax', [`${tag}masked`], [`${tag}p`], { axis: -1 }, `${tag}Softmax`), node('MatMul', [`${tag}p`, 'v'], [`${tag}out`], {}, `${tag}MatMulV`)];
  const sqrtNode = (tag: string): NodeProto => node('Constant', [], [`${tag}sqrt_d`], { value: f32Init('', [], [Math.sqrt(H)]) }, `${tag}c_sqrt`);
  const fn = (): FunctionProto => ({ name: 'MaskedAttn', domain: 'local', input: ['q', 'k', 'v', 'mask'], output: ['f_out'], opsetImport: [{ domain: '', version: 17 }],
    node: body('f_', 'mask', sqrtNode('f_')) });
  const causal = (name: string) => f32Init(name, [S, S], Array.from({ length: S * S }, (_, i) => (i % S <= Math.floor(i / S) ? 0 : -10000)));
  const qkv = ['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, [B, N, S, H]));
  const pad = value('pad', DataType.FLOAT, [B, 1, 1, S]);
  const call = (name: string, mask: string, out: string, q = 'q'): NodeProto => ({ ...node('MaskedAttn', [q, 'k', 'v', mask], [out], {}, name), domain: 'local' });

  function withCalls(nodes: NodeProto[], outputs: string[], initializers = [causal('causal')], inputs = qkv): ModelProto {
    const m = model({ nodes, inputs, outputs: outputs.map((o) => value(o, DataType.FLOAT, [])), initializers });
    m.opsetImport.push({ domain: 'local', version: 1 });
    m.functions.push(fn());
    return m;
  }
  const sites = (m: ModelProto): string[] => patchModel(m, { s: 0.4 }).report.sites.map((x) => `${x.node} n=${x.n} heads=${x.heads ?? '?'}`);

  it('a causal mask passed in is causal inside the body, as it is written inline: the same n, heads and outputs', async () => {
    const inline = model({ nodes: body('i_', 'causal', sqrtNode('i_')).map((n) => ({ ...n, input: n.input.map((x) => (x === 'q' || x === 'k' || x === 'v' ? x : x)) })),
      inputs: qkv, outputs: [value('i_out', DataType.FLOAT, [])], initializers: [causal('causal')] });
    const wrapped = withCalls([call('call0', 'causal', 'out')], ['out']);
    assert.deepEqual(sites(inline), ['i_Softmax n=causal heads=2']);
    assert.deepEqual(sites(wrapped), ['call0 → f_Softmax n=causal heads=2']);
    const { feeds } = qkvFeeds(31);
    const want = await runOnce(patchModel(inline, { s: 0.4 }).model, feeds, 'i_out');
    assert.ok(maxDiff(await runOnce(patchModel(wrapped, { s: 0.4 }).model, feeds, 'out'), want) < TOL);
  });

  it('calls that pass masks of different kinds (causal, padding) refuse the body\'s site with both, rather than pick one', () => {
    const m = withCalls([call('call0', 'causal', 'h'), call('call1', 'pad', 'out', 'h')], ['out'], [causal('causal')], [...qkv, pad]);
    const d = findAttentionSoftmax(m);
    assert.equal(d.calls.length, 0);
    const refused = d.skipped.find((x) => x.node === 'f_Softmax')!;
    assert.match(refused.reason, /^calls 'call0' and 'call1' of function 'MaskedAttn' see this attention differently \(.*causal mask.*; against .*padding mask.*\)/);
    assert.equal(refused.attention, true);
    assert.throws(() => patchModel(m, { s: 0.4 }), /see this attention differently/);
  });

  it('calls that agree (each its own causal constant) patch the body once, causal for both', async () => {
    const m = withCalls([call('call0', 'causal', 'h'), call('call1', 'causal2', 'out', 'h')], ['out'], [causal('causal'), causal('causal2')]);
    assert.deepEqual(sites(m), ['call0 → f_Softmax n=causal heads=2', 'call1 → f_Softmax n=causal heads=2']);
    const { feeds } = qkvFeeds(41);
    assert.ok((await runOnce(patchModel(m, { s: 0.4 }).model, feeds, 'out')).every(Number.isFinite));
  });

  it('caller names the body also uses (q, and f_p on the mask\'s path) are read as the caller\'s: still causal', () => {
    const m = withCalls([node('Identity', ['causal'], ['f_p'], {}, 'caller_id'), call('call0', 'f_p', 'h'), call('call1', 'f_p', 'out', 'h')], ['out']);
    assert.equal(modelScopes(m).find((x) => x.kind === 'function')!.calls?.length, 2);
    assert.deepEqual(sites(m), ['call0 → f_Softmax n=causal heads=2', 'call1 → f_Softmax n=causal heads=2']);
  });
});
