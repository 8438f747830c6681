/**
 * Tiny attention graphs built in TypeScript, one per shape the tool handles, run on onnxruntime against an
 * SSMax computed here in plain loops from the same q, k, v.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { DataType, ModelProto } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { Runner } from '../src/verify/run';
import { f32, i64, model, node, randoms, value } from './support/build';

const B = 2, H = 4, D = 8, HID = H * D;

interface Shape { t: number; mask?: 'padding' | 'causal-trilu' | 'causal-where'; rank?: 3 | 4; opset?: number; softmaxAxis?: number }

/** x [B,T,32] → q,k,v heads → MatMul → Div(√D) → [mask] → Softmax → MatMul(v); output probs·v. */
function attentionModel(shape: Shape): ModelProto {
  const { t, rank = 4, opset = 17 } = shape;
  const nodes = [];
  const inits = [i64('split4', [B, t, H, D]), f32('sqrt_d', [], [Math.sqrt(D)])];
  for (const p of ['q', 'k', 'v']) {
    nodes.push(node('Reshape', [`x_${p}`, 'split4'], [`${p}4`]));
    nodes.push(node('Transpose', [`${p}4`], [`${p}h`], { perm: p === 'k' ? [0, 2, 3, 1] : [0, 2, 1, 3] }));
    if (rank === 3) {
      inits.push(i64(`merge_${p}`, p === 'k' ? [B * H, D, t] : [B * H, t, D]));
      nodes.push(node('Reshape', [`${p}h`, `merge_${p}`], [`${p}r`]));
    }
  }
  const q = rank === 3 ? 'qr' : 'qh', k = rank === 3 ? 'kr' : 'kh', v = rank === 3 ? 'vr' : 'vh';
  nodes.push(node('MatMul', [q, k], ['qk']), node('Div', ['qk', 'sqrt_d'], ['scores']));
  let logits = 'scores';
  const inputs = ['x_q', 'x_k', 'x_v'].map((n) => value(n, DataType.FLOAT, [B, t, HID]));
  if (shape.mask === 'padding') {
    inputs.push(value('mask_add', DataType.FLOAT, [B, 1, 1, t]));
    nodes.push(node('Add', ['scores', 'mask_add'], ['masked']));
    logits = 'masked';
  } else if (shape.mask === 'causal-trilu') {
    inits.push(i64('tt', [t, t]));
    const neg = f32('neg_inf', [1], [-Infinity]);
    nodes.push(node('ConstantOfShape', ['tt'], ['full'], { value: neg }), node('Trilu', ['full', 'one'], ['upper'], { upper: 1 }));
    inits.push(i64('one', [1], true));
    nodes.push(node('Add', ['scores', 'upper'], ['masked']));
    logits = 'masked';
  } else if (shape.mask === 'causal-where') {
    const tri: number[] = [];
    for (let i = 0; i < t; i++) for (let j = 0; j < t; j++) tri.push(j <= i ? 1 : 0);
    inits.push({ ...i64('tri_i', tri), dims: [1, 1, t, t] }, f32('min', [], [-3.4028234663852886e38]));
    nodes.push(node('Cast', ['tri_i'], ['tri'], { to: DataType.BOOL }), node('Where', ['tri', 'scores', 'min'], ['masked']));
    logits = 'masked';
  }
  nodes.push(node('Softmax', [logits], ['probs'], shape.softmaxAxis !== undefined ? { axis: shape.softmaxAxis } : {}));
  nodes.push(node('MatMul', ['probs', v], ['out']));
  return model({ nodes, inputs, outputs: [value('out', DataType.FLOAT, rank === 3 ? [B * H, t, D] : [B, H, t, D])], initializers: inits, opset });
}

/** SSMax attention in plain loops: probs = softmax(c_i·z + mask) with c_i = s_h·ln n_i, out = probs·v. */
function reference(x: Record<string, Float32Array>, t: number, s: number[], n: 'keys' | 'causal', mask?: Float32Array, causal = false, cap?: number): Float32Array {
  const out = new Float32Array(B * H * t * D);
  const at = (a: Float32Array, b: number, i: number, h: number, d: number): number => a[((b * t + i) * H + h) * D + d];
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let i = 0; i < t; i++) {
    const c = s[h] * Math.log(n === 'keys' ? t : i + 1);
    const row: number[] = [];
    for (let j = 0; j < t; j++) {
      let z = 0;
      for (let d = 0; d < D; d++) z += at(x.x_q, b, i, h, d) * at(x.x_k, b, j, h, d);
      const scaled = z / Math.sqrt(D);
      let l = c * (cap ? cap * Math.tanh(scaled / cap) : scaled) + (mask ? mask[b * t + j] : 0);
      if (causal && j > i) l = -Infinity;
      row.push(l);
    }
    const m = Math.max(...row);
    const e = row.map((l) => Math.exp(l - m));
    const sum = e.reduce((a, b2) => a + b2, 0);
    for (let d = 0; d < D; d++) {
      let acc = 0;
      for (let j = 0; j < t; j++) acc += (e[j] / sum) * at(x.x_v, b, j, h, d);
      out[((b * H + h) * t + i) * D + d] = acc;
    }
  }
  return out;
}

function inputs(t: number): Record<string, Float32Array> {
  return Object.fromEntries(['x_q', 'x_k', 'x_v'].map((n, i) => [n, Float32Array.from(randoms(B * t * HID, 11 + i, 1.5))]));
}

async function run(m: ModelProto, feeds: Record<string, { data: Float32Array; dims: number[] }>): Promise<Float32Array | Float64Array> {
  const runner = await Runner.create(encodeModel(m), 'test');
  const out = await runner.run(Object.fromEntries(Object.entries(feeds).map(([k, v]) => [k, { type: 'float32' as const, ...v }])));
  await runner.release();
  return out.out.data;
}

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

const perHead = [0.2, 0.35, 0.5, 0.65];

describe('tiny attention graphs against a loop reference', () => {
  const cases: { title: string; shape: Shape; options: PatchOptions; s: number[]; n: 'keys' | 'causal' }[] = [
    { title: '4-D, no mask, scalar s, keys', shape: { t: 7 }, options: { s: 0.4 }, s: [0.4, 0.4, 0.4, 0.4], n: 'keys' },
    { title: '4-D, padding mask, per-head s, --n keys', shape: { t: 6, mask: 'padding' }, options: { n: 'keys', s: perHead }, s: perHead, n: 'keys' },
    { title: '3-D [B·H,T,T], per-head s (tiled over batch)', shape: { t: 5, rank: 3 }, options: { s: perHead }, s: perHead, n: 'keys' },
    { title: 'Trilu causal mask, auto → causal', shape: { t: 6, mask: 'causal-trilu' }, options: { s: 0.5 }, s: [0.5, 0.5, 0.5, 0.5], n: 'causal' },
    { title: 'Where causal mask with finfo.min, per-head, auto → causal', shape: { t: 9, mask: 'causal-where' }, options: { s: perHead }, s: perHead, n: 'causal' },
    { title: 'opset 11 Softmax with axis=3', shape: { t: 4, opset: 11, softmaxAxis: 3 }, options: { s: 0.3 }, s: [0.3, 0.3, 0.3, 0.3], n: 'keys' },
  ];
  for (const c of cases) {
    it(c.title, async () => {
      const m = attentionModel(c.shape);
      const { model: patched, report } = patchModel(m, c.options);
      assert.equal(report.sites.length, 1);
      assert.equal(report.sites[0].n, c.n, report.sites[0].nReason);
      assert.equal(report.sites[0].heads, H);
      const x = inputs(c.shape.t);
      const mask = c.shape.mask === 'padding'
        ? Float32Array.from({ length: B * c.shape.t }, (_, i) => (i >= c.shape.t * 2 - 2 ? -3.4e38 : 0)) : undefined;
      const feeds: Record<string, { data: Float32Array; dims: number[] }> = Object.fromEntries(
        Object.entries(x).map(([k, v]) => [k, { data: v, dims: [B, c.shape.t, HID] }]));
      if (mask) feeds.mask_add = { data: mask, dims: [B, 1, 1, c.shape.t] };
      const got = await run(patched, feeds);
      const want = reference(x, c.shape.t, c.s, c.n, mask, c.shape.mask?.startsWith('causal'));
      assert.ok(maxDiff(got, want) < 1e-5, `max diff ${maxDiff(got, want)}`);
      const plain = await run(m, feeds);
      assert.ok(maxDiff(plain, want) > 1e-3, 'SSMax should change the output');
    });
  }

  it('a fully masked row (finfo.min everywhere) stays finite and equal to the original', async () => {
    const t = 5;
    const m = attentionModel({ t, mask: 'padding' });
    const { model: patched } = patchModel(m, { s: 2.5, n: 'keys' });
    const x = inputs(t);
    const feeds: Record<string, { data: Float32Array; dims: number[] }> = Object.fromEntries(
      Object.entries(x).map(([k, v]) => [k, { data: v, dims: [B, t, HID] }]));
    feeds.mask_add = { data: Float32Array.from({ length: B * t }, (_, i) => (i >= t ? -3.4028234663852886e38 : 0)), dims: [B, 1, 1, t] };
    const got = await run(patched, feeds);
    const plain = await run(m, feeds);
    assert.ok(got.every(Number.isFinite), 'NaN or Inf in patched output');
    const half = got.length / 2;
    assert.ok(maxDiff(got.slice(half), plain.slice(half)) < 1e-6, 'fully masked item must stay uniform as in the original');
  });
});

/**
 * attentionModel with a softcap (Div → Tanh → Mul, Gemma 2) on its scores, behind views of them: `roundTrip` puts a
 * Reshape to 1-D and back between the product and the scaling (the cap then acts on the 4-D logits), `flat` caps the
 * 1-D view and reshapes back after the cap.
 */
function softcapModel(t: number, form: 'roundTrip' | 'flat', cap: number): ModelProto {
  const m = attentionModel({ t });
  const g = m.graph!;
  g.initializer.push(f32('cap', [], [cap]), i64('flat_shape', [-1]));
  const div = g.node.findIndex((n) => n.output[0] === 'scores');
  const capNodes = (x: string, y: string) => [node('Div', [x, 'cap'], [`${y}_d`]), node('Tanh', [`${y}_d`], [`${y}_t`], {}, 'cap_tanh'), node('Mul', [`${y}_t`, 'cap'], [y])];
  const softmax = g.node.find((n) => n.opType === 'Softmax')!;
  if (form === 'roundTrip') {
    g.node[div].input[0] = 'qk_back';
    g.node.splice(div, 0, node('Shape', ['qk'], ['qk_shape']), node('Reshape', ['qk', 'flat_shape'], ['qk_flat']), node('Reshape', ['qk_flat', 'qk_shape'], ['qk_back']));
    g.node.splice(g.node.indexOf(softmax), 0, ...capNodes('scores', 'capped'));
  } else {
    g.node.splice(g.node.indexOf(softmax), 0, node('Shape', ['scores'], ['s_shape']), node('Reshape', ['scores', 'flat_shape'], ['s_flat']),
      ...capNodes('s_flat', 'capped_flat'), node('Reshape', ['capped_flat', 's_shape'], ['capped']));
  }
  softmax.input[0] = 'capped';
  return m;
}

describe('a softcap behind views of the logits', () => {
  it('a Reshape round trip before the cap: the factor goes after the cap (exactly SSMax of what the Softmax sees)', async () => {
    const t = 6, cap = 0.8;
    const { model: patched, report } = patchModel(softcapModel(t, 'roundTrip', cap), { s: 0.5 });
    assert.equal(report.sites.length, 1);
    const x = inputs(t);
    const feeds = Object.fromEntries(Object.entries(x).map(([k, v]) => [k, { data: v, dims: [B, t, HID] }]));
    const got = await run(patched, feeds);
    const want = reference(x, t, [0.5, 0.5, 0.5, 0.5], 'keys', undefined, false, cap);
    // The factor before the cap (what this tool wrote before): c·cap·tanh(z/cap) ≠ cap·tanh(c·z/cap) at this small cap.
    assert.ok(maxDiff(got, want) < 1e-5, `max diff ${maxDiff(got, want)}`);
  });

  it('a cap on a 1-D view of the logits: refused as attention naming the Tanh, not patched before the cap', () => {
    assert.throws(() => patchModel(softcapModel(5, 'flat', 0.8), { s: 0.5 }), (e: unknown) => e instanceof InputError
      && e.code === 'attention-refused' && /a softcap \(Tanh 'cap_tanh'\) on a view of the logits that does not keep their rows and keys/.test(e.message));
  });
});

describe('top-k attention', () => {
  it('q·kᵀ → Softmax → TopK → Gather of the values: refused as attention naming the TopK (exit 2), not "no attention"', () => {
    // deeploy_Kernels_FP32_Attention's form: Q [1, 8] · K [8, 6] → Softmax(axis 1) → TopK(3) → Gather(V) and MatMul.
    const m = model({
      nodes: [node('MatMul', ['q', 'k'], ['scores']), node('Softmax', ['scores'], ['p'], { axis: 1 }),
        node('TopK', ['p', 'kk'], ['top_p', 'top_i'], { axis: 1 }, 'tk'), node('Gather', ['v', 'top_i'], ['kept_v'], { axis: 0 }),
        node('MatMul', ['top_p', 'kept_v'], ['out'])],
      inputs: [value('q', DataType.FLOAT, [1, 8]), value('k', DataType.FLOAT, [8, 6]), value('v', DataType.FLOAT, [6, 4])],
      outputs: [value('out', DataType.FLOAT, [])], initializers: [i64('kk', [3])], opset: 11,
    });
    assert.throws(() => patchModel(m, { s: 0.3 }), (e: unknown) => e instanceof InputError && e.code === 'attention-refused'
      && /^attention found, none of it patched \(1 node\(s\) refused or skipped: top-k attention: the probabilities go through TopK 'tk'/.test(e.message));
  });
});

describe('top-k attention over the kept scores', () => {
  it('q·kᵀ → TopK → Softmax → MatMul with the gathered values: refused as attention naming the TopK, not "logits not produced by MatMul"', () => {
    const m = model({
      nodes: [node('MatMul', ['q', 'k'], ['scores']), node('TopK', ['scores', 'kk'], ['top_s', 'top_i'], { axis: -1 }, 'tk'),
        node('Softmax', ['top_s'], ['p'], { axis: -1 }), node('Gather', ['v', 'top_i'], ['kept_v'], { axis: 0 }),
        node('Squeeze', ['kept_v'], ['kept_v2']), node('MatMul', ['p', 'kept_v2'], ['out'])],
      inputs: [value('q', DataType.FLOAT, [1, 8]), value('k', DataType.FLOAT, [8, 6]), value('v', DataType.FLOAT, [6, 4])],
      outputs: [value('out', DataType.FLOAT, [])], initializers: [i64('kk', [3])], opset: 11,
    });
    assert.throws(() => patchModel(m, { s: 0.3 }), (e: unknown) => e instanceof InputError && e.code === 'attention-refused'
      && /top-k attention: the Softmax normalises the scores TopK 'tk' kept/.test(e.message));
  });
});

describe('Softmax nodes that are not attention', () => {
  it('classifier head over classes is skipped: logits from a constant weight', () => {
    const m = model({
      nodes: [node('MatMul', ['x', 'w'], ['logits']), node('Softmax', ['logits'], ['p'], { axis: -1 })],
      inputs: [value('x', DataType.FLOAT, ['batch', 16])], outputs: [value('p', DataType.FLOAT, ['batch', 5])],
      initializers: [f32('w', [16, 5], randoms(80, 3))],
    });
    assert.throws(() => patchModel(m, { s: 0.3 }), /no attention Softmax found.*constant weight/);
  });

  it('MoE router Softmax over experts is skipped, attention beside it is patched', () => {
    const att = attentionModel({ t: 4 });
    att.graph!.input.push(value('h', DataType.FLOAT, [B, 4, HID]));
    att.graph!.initializer.push(f32('w_router', [HID, 8], randoms(HID * 8, 5)));
    att.graph!.node.push(node('MatMul', ['h', 'w_router'], ['router_logits']), node('Softmax', ['router_logits'], ['router_p'], { axis: -1 }),
      node('TopK', ['router_p', 'k2'], ['top_v', 'top_i'], { axis: -1 }));
    att.graph!.initializer.push(i64('k2', [2]));
    att.graph!.output.push(value('top_v', DataType.FLOAT, [B, 4, 2]));
    const { report } = patchModel(att, { s: 0.3 });
    assert.equal(report.sites.length, 1);
    assert.deepEqual(report.skipped.map((s) => s.node), ['Softmax_router_p']);
    assert.match(report.skipped[0].reason, /constant weight/);
  });

  it('Softmax over channels (axis 1 of a rank-4 tensor) is skipped', () => {
    const m = model({
      nodes: [node('Softmax', ['x'], ['p'], { axis: 1 })],
      inputs: [value('x', DataType.FLOAT, [1, 3, 8, 8])], outputs: [value('p', DataType.FLOAT, [1, 3, 8, 8])],
    });
    assert.throws(() => patchModel(m, { s: 0.3 }), /not over the last \(key\) axis/);
  });

  it('probabilities that never reach a value MatMul are not attention', () => {
    const m = model({
      nodes: [node('MatMul', ['a', 'b'], ['s']), node('Softmax', ['s'], ['p'], { axis: -1 })],
      inputs: [value('a', DataType.FLOAT, [2, 3, 4]), value('b', DataType.FLOAT, [2, 4, 3])],
      outputs: [value('p', DataType.FLOAT, [2, 3, 3])],
    });
    assert.throws(() => patchModel(m, { s: 0.3 }), /probabilities do not reach a MatMul with values/);
  });
});

describe('patching a patched model', () => {
  it('refuses to stack a second factor, and --update-s replaces s in place', async () => {
    const m = attentionModel({ t: 5 });
    const once = patchModel(m, { s: 0.4 }).model;
    assert.throws(() => patchModel(once, { s: 0.4 }), /already patched/);
    const updated = patchModel(once, { s: 0.7, updateS: true });
    assert.equal(updated.report.updated, true);
    const fresh = patchModel(m, { s: 0.7 }).model;
    const x = inputs(5);
    const feeds = Object.fromEntries(Object.entries(x).map(([k, v]) => [k, { data: v, dims: [B, 5, HID] }]));
    assert.ok(maxDiff(await run(updated.model, feeds), await run(fresh, feeds)) < 1e-6);
    assert.equal(updated.model.graph!.node.filter((n) => /\/apply$/.test(n.name)).length, 1);
  });
});
