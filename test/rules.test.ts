/**
 * Detection as named rules: the registry and the README's rule table agree, every candidate node gets a trace of
 * the rules tried (matched, or the node where each stopped and why), a skip names its closest rule, the report
 * names the rule of each site, and --explain prints a trace without writing anything.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { formatPatch } from '../src/cli/format';
import { explainNode, findAttentionSoftmax } from '../src/detect/find-attention';
import { RULES } from '../src/detect/rules';
import { InputError } from '../src/errors';
import { DataType, ModelProto, NodeProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { f32, i64, model, node, randoms, value } from './support/build';
import { assertOneLineError, cli, removeScratch, snapshot, tmpdir } from './support/io';
import { docPages } from './support/readme';
import { TORCH } from './support/ref';

after(removeScratch);

const ROOT = path.resolve(__dirname, '../..');
const B = 1, H = 2, T = 4, D = 8;

/** The rows of the docs' table whose header starts with `header`: its first, second-to-last and last cells. */
function readmeTable(header: string): { first: string; rule: string; last: string }[] {
  const lines = [...docPages().values()].join('\n').split('\n');
  const start = lines.findIndex((l) => l.startsWith(header));
  assert.ok(start >= 0, `the docs have no table headed '${header}'`);
  const rows = [];
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const cells = line.split(' | ');
    rows.push({ first: cells[0].replace(/^\| /, ''), rule: cells[cells.length - 2], last: cells[cells.length - 1].replace(/ \|$/, '') });
  }
  return rows;
}

/** q [B,H,T,D] · kᵀ [B,H,D,T] → Div(√D) → Softmax → · v: one attention site, named after `tag`. */
function attentionNodes(tag = ''): NodeProto[] {
  return [
    node('MatMul', [`q${tag}`, `kt${tag}`], [`qk${tag}`]), node('Div', [`qk${tag}`, 'sqrt_d'], [`scores${tag}`]),
    node('Softmax', [`scores${tag}`], [`p${tag}`], { axis: -1 }), node('MatMul', [`p${tag}`, `v${tag}`], [`out${tag}`]),
  ];
}

function withAttention(extra: { nodes: NodeProto[]; inputs?: ReturnType<typeof value>[]; outputs?: ReturnType<typeof value>[];
  initializers?: ReturnType<typeof f32>[] }, opset = 17): ModelProto {
  return model({
    nodes: [...attentionNodes(), ...extra.nodes],
    inputs: [value('q', DataType.FLOAT, [B, H, T, D]), value('kt', DataType.FLOAT, [B, H, D, T]), value('v', DataType.FLOAT, [B, H, T, D]),
      ...(extra.inputs ?? [])],
    outputs: [value('out', DataType.FLOAT, [B, H, T, D]), ...(extra.outputs ?? [])],
    initializers: [f32('sqrt_d', [], [Math.sqrt(D)]), ...(extra.initializers ?? [])], opset,
  });
}

/** A router: h [B,T,16] · constant w [16,4] → Softmax over 4 experts → TopK. */
const router = {
  nodes: [node('MatMul', ['h', 'w_router'], ['router_logits']), node('Softmax', ['router_logits'], ['router_p'], { axis: -1 }),
    node('TopK', ['router_p', 'k2'], ['top_v', 'top_i'], { axis: -1 })],
  inputs: [value('h', DataType.FLOAT, [B, T, 16])], outputs: [value('top_v', DataType.FLOAT, [B, T, 2])],
  initializers: [f32('w_router', [16, 4], randoms(64, 3)), i64('k2', [2])],
};

function ms(opType: string, inputs: string[], attrs: Record<string, number>): NodeProto {
  return { ...node(opType, inputs, ['y'], attrs, opType), domain: 'com.microsoft' };
}

function fusedModel(n: NodeProto): ModelProto {
  const m = model({
    nodes: [n], inputs: ['q', 'k', 'v'].map((x) => value(x, DataType.FLOAT, [B, T, H * D])), outputs: [value('y', DataType.FLOAT, [])],
  });
  m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
  return m;
}

describe('the rule registry', () => {
  it('every rule has a unique name and one row in the README rule table, which names no other rule', () => {
    const names = RULES.map((r) => r.name);
    assert.equal(new Set(names).size, names.length, `duplicate rule names: ${names}`);
    for (const name of names) assert.match(name, /^(softmax|fused|guard|call)\/[a-z0-9-]+$/);
    const rows = readmeTable('| rule | applies to |');
    assert.deepEqual(rows.map((r) => r.first.replace(/`/g, '')), names, 'README rule table: one row per rule, in registry order');
    for (const { first, last } of rows) {
      const tests = [...last.matchAll(/`(test\/[\w.-]+\.test\.ts)`/g)].map((m) => m[1]);
      const fixtures = [...last.matchAll(/`([a-z0-9_]+)`/g)].map((m) => m[1]);
      assert.ok(tests.length > 0, `${first}: no test named`);
      for (const t of tests) assert.ok(fs.existsSync(path.join(ROOT, t)), `${first}: ${t} does not exist`);
      for (const f of fixtures) assert.ok(fs.existsSync(path.join(TORCH, `${f}.onnx`)), `${first}: fixture ${f} does not exist`);
    }
  });

  it('the README pattern table names a rule for every pattern, and every rule is among them', () => {
    const named = new Set<string>();
    for (const { first, rule } of readmeTable('| pattern | rule |')) {
      const found = [...rule.matchAll(/`([a-z]+\/[a-z0-9-]+)`/g)].map((m) => m[1]);
      assert.ok(found.length > 0, `pattern row without a rule: ${first.slice(0, 80)}`);
      for (const f of found) {
        assert.ok(RULES.some((r) => r.name === f), `pattern table names unknown rule ${f}`);
        named.add(f);
      }
    }
    assert.deepEqual([...named].sort(), RULES.map((r) => r.name).sort());
  });
});

describe('the trace of a candidate', () => {
  it('a classifier head: softmax/matmul-qk stops at the constant-weight MatMul, not at the Softmax', () => {
    const m = model({
      nodes: [node('MatMul', ['x', 'w'], ['logits']), node('Softmax', ['logits'], ['p'], { axis: -1 })],
      inputs: [value('x', DataType.FLOAT, ['batch', 16])], outputs: [value('p', DataType.FLOAT, ['batch', 5])],
      initializers: [f32('w', [16, 5], randoms(80, 3))],
    });
    const d = findAttentionSoftmax(m);
    assert.equal(d.skipped.length, 1);
    const k = d.skipped[0];
    assert.equal(k.reason, 'logits come from a MatMul with a constant weight (a projection, not query·key)');
    assert.equal(k.rule, 'softmax/matmul-qk');
    assert.equal(k.stoppedAt, 'MatMul_logits');
    const [trace] = d.traces;
    assert.equal(trace.node, 'Softmax_p');
    assert.deepEqual(trace.attempts.map((a) => [a.rule, a.matched, a.stoppedAt, a.steps]),
      [['softmax/matmul-qk', false, 'MatMul_logits', 1], ['softmax/einsum-qk', false, 'MatMul_logits', 1]]);
  });

  it('an MoE router beside attention: the router skip names its MatMul, the site its rule; the report prints both', () => {
    const { report } = patchModel(withAttention(router), { s: 0.3 });
    assert.deepEqual(report.sites.map((s) => [s.node, s.rule]), [['Softmax_p', 'softmax/matmul-qk']]);
    assert.deepEqual(report.skipped.map((k) => [k.node, k.rule, k.stoppedAt]), [['Softmax_router_p', 'softmax/matmul-qk', 'MatMul_router_logits']]);
    const text = formatPatch(report).join('\n');
    assert.match(text, /L0 {2}Softmax_p .* rule softmax\/matmul-qk$/m);
    assert.match(text, /Softmax_router_p: logits come from a MatMul with a constant weight .*\(rule softmax\/matmul-qk stopped at 'MatMul_router_logits'\)$/m);
  });

  it('an Einsum attention: softmax/matmul-qk stops at the Einsum, softmax/einsum-qk matches', () => {
    const m = model({
      nodes: [node('Einsum', ['q', 'k'], ['scores'], { equation: 'bhqd,bhkd->bhqk' }), node('Softmax', ['scores'], ['p'], { axis: -1 }),
        node('Einsum', ['p', 'v'], ['out'], { equation: 'bhqk,bhkd->bhqd' })],
      inputs: ['q', 'k', 'v'].map((x) => value(x, DataType.FLOAT, [B, H, T, D])), outputs: [value('out', DataType.FLOAT, [B, H, T, D])],
    });
    const d = findAttentionSoftmax(m);
    assert.deepEqual(d.sites.map((s) => s.rule), ['softmax/einsum-qk']);
    assert.deepEqual(d.traces[0].attempts, [
      { rule: 'softmax/matmul-qk', matched: false, steps: 1, stoppedAt: 'Einsum_scores', reason: 'logits come from Einsum, not MatMul or FusedMatMul' },
      { rule: 'softmax/einsum-qk', matched: true },
    ]);
  });

  it('the closest rule is the one that passed most checks: an Einsum attention map exported only', () => {
    const m = model({
      nodes: [node('Einsum', ['q', 'k'], ['scores'], { equation: 'bhqd,bhkd->bhqk' }), node('Softmax', ['scores'], ['p'], { axis: -1 })],
      inputs: ['q', 'k'].map((x) => value(x, DataType.FLOAT, [B, H, T, D])), outputs: [value('p', DataType.FLOAT, [B, H, T, T])],
    });
    const [k] = findAttentionSoftmax(m).skipped;
    assert.deepEqual([k.reason, k.rule, k.stoppedAt], ['probabilities do not reach a MatMul with values', 'softmax/einsum-qk', 'Softmax_p']);
  });

  it('opset 11: softmax/opset11-reshape alone applies to Softmax(axis=1); with the rank unknown, n is the normalised group', () => {
    const flat = model({
      nodes: [node('MatMul', ['q', 'kt'], ['qk']), node('Reshape', ['qk', 'rows'], ['flat']), node('Softmax', ['flat'], ['pf'], { axis: 1 }),
        node('Reshape', ['pf', 'back'], ['p']), node('MatMul', ['p', 'v'], ['out'])],
      inputs: [value('q', DataType.FLOAT, [B, H, T, D]), value('kt', DataType.FLOAT, [B, H, D, T]), value('v', DataType.FLOAT, [B, H, T, D])],
      outputs: [value('out', DataType.FLOAT, [B, H, T, D])], initializers: [i64('rows', [B * H * T, T]), i64('back', [B, H, T, T])], opset: 11,
    });
    const d = findAttentionSoftmax(flat);
    assert.deepEqual(d.sites.map((s) => s.rule), ['softmax/opset11-reshape']);
    assert.deepEqual(d.traces[0].attempts.map((a) => a.rule), ['softmax/opset11-reshape']);
    // The same chain with no shape information: the Softmax normalises the axes from 1 on, whatever they are.
    const blind = structuredClone(flat);
    blind.graph!.input.forEach((v) => delete v.type);
    blind.graph!.initializer = [];
    blind.graph!.input.push({ name: 'rows' }, { name: 'back' });
    const [site] = findAttentionSoftmax(blind).sites;
    assert.deepEqual([site.rule, site.groupAxis], ['softmax/opset11-reshape', 1]);
  });

  it('refused fused operators name their rule and stop at the operator', () => {
    const capped = findAttentionSoftmax(fusedModel(ms('GroupQueryAttention', ['q', 'k', 'v'], { num_heads: H, kv_num_heads: H, softcap: 30.5 })));
    assert.deepEqual(capped.skipped.map((k) => [k.rule, k.stoppedAt, k.forcible, k.layer]), [['fused/ms-gqa', 'GroupQueryAttention', true, 0]]);
    assert.match(capped.skipped[0].reason, /^GroupQueryAttention: softcap=30\.5/);
    const forced = findAttentionSoftmax(fusedModel(ms('GroupQueryAttention', ['q', 'k', 'v'], { num_heads: H, kv_num_heads: H, softcap: 30.5 })),
      { force: ['GroupQueryAttention'] });
    assert.deepEqual(forced.fused.map((s) => [s.rule, s.forced]), [['fused/ms-gqa', true]]);
    const packed = findAttentionSoftmax(fusedModel(ms('PackedAttention', ['q', 'k', 'v'], { num_heads: H })));
    assert.deepEqual(packed.skipped.map((k) => [k.rule, k.stoppedAt, Boolean(k.forcible)]), [['fused/unsupported', 'PackedAttention', false]]);
    assert.match(packed.skipped[0].reason, /fused PackedAttention: not patched \(packed/);
    // Every operator refused outright says what to patch instead (issue 35: a refusal is a dead end otherwise).
    const refused = ['PackedAttention', 'PackedMultiHeadAttention', 'SparseAttention', 'PagedAttention', 'LongformerAttention', 'QAttention',
      'QOrderedAttention', 'QOrderedLongformerAttention', 'DecoderAttention', 'DecoderMaskedSelfAttention', 'FlexAttention'];
    for (const op of refused) {
      const n = { ...ms(op, ['q', 'k', 'v'], { num_heads: H }), ...(op === 'FlexAttention' ? { domain: 'ai.onnx.preview' } : {}) };
      const m = fusedModel(n);
      if (op === 'FlexAttention') m.opsetImport.push({ domain: 'ai.onnx.preview', version: 1 });
      const [skip] = findAttentionSoftmax(m).skipped;
      assert.equal(skip?.rule, 'fused/unsupported', op);
      assert.match(skip.reason, new RegExp(`^fused ${op}: not patched \\(.*[:;] (patch|expand) `), op);
    }
    const bias = findAttentionSoftmax(fusedModel(ms('BiasSoftmax', ['q', 'k'], { axis: -1 })));
    assert.deepEqual(bias.skipped.map((k) => [k.rule, k.attention]), [['guard/bias-softmax', true]]);
    assert.deepEqual(bias.traces.map((t) => [t.op, t.rule]), [['com.microsoft.BiasSoftmax', 'guard/bias-softmax']]);
  });

  it('explainNode: a name, a glob, and an unknown name as an input error listing candidates', () => {
    const m = withAttention(router);
    assert.deepEqual(explainNode(m, 'Softmax_router_p').map((e) => e.verdict), [
      'skipped: logits come from a MatMul with a constant weight (a projection, not query·key)']);
    assert.deepEqual(explainNode(m, 'Softmax_*').map((e) => [e.node, e.verdict]),
      [['Softmax_p', 'attention (rule softmax/matmul-qk)'], ['Softmax_router_p', explainNode(m, 'Softmax_router_p')[0].verdict]]);
    assert.throws(() => explainNode(m, 'MatMul_qk'), (e: Error) => e instanceof InputError
      && /no attention candidate named 'MatMul_qk' \(candidates: Softmax_p, Softmax_router_p\)/.test(e.message));
  });
});

describe('--explain NODE', () => {
  const dir = tmpdir('ssmax-explain-');
  const input = path.join(dir, 'sdpa.onnx');
  fs.copyFileSync(path.join(TORCH, 'sdpa_cache.onnx'), input);

  it('lists every rule tried on the node with where it stopped, exits 0 and writes nothing', () => {
    const before = snapshot(dir);
    const r = cli([input, '--explain', '/blocks.1/mlp/Softmax']);
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trim().split('\n');
    assert.equal(lines[0], '/blocks.1/mlp/Softmax  Softmax: skipped: logits come from a MatMul with a constant weight (a projection, not query·key)');
    assert.match(lines[1], /^ {2}stopped {2}softmax\/matmul-qk at '\/blocks\.1\/mlp\/router\/MatMul' after 1 check\(s\): logits come from a MatMul with a constant weight .* \(closest\)$/);
    assert.match(lines[2], /^ {2}stopped {2}softmax\/einsum-qk at '\/blocks\.1\/mlp\/router\/MatMul'/);
    assert.equal(lines.length, 3);
    assert.deepEqual(snapshot(dir), before);
  });

  it('a glob lists each candidate; attention shows the rule that matched', () => {
    const r = cli([input, '--explain', '/blocks.*/Softmax']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.split('\n').filter((l) => !l.startsWith(' ') && l), [
      '/blocks.0/attn/Softmax  Softmax: attention (rule softmax/matmul-qk)',
      '/blocks.1/attn/Softmax  Softmax: attention (rule softmax/matmul-qk)',
      '/blocks.1/mlp/Softmax  Softmax: skipped: logits come from a MatMul with a constant weight (a projection, not query·key)',
    ]);
    assert.equal(r.stdout.split('\n').filter((l) => l === '  matched  softmax/matmul-qk').length, 2);
  });

  it('a name that is no candidate is a one-line usage error naming candidates', () => {
    assertOneLineError(cli([input, '--explain', '/blocks.0/attn/MatMul']), 2,
      /^ssmax-patch: no attention candidate named '\/blocks\.0\/attn\/MatMul' \(candidates: \/blocks\.0\/attn\/Softmax, /);
  });

  it('the default report names the rule of each site and the stop of each skip', () => {
    const r = cli([input, '--s', '0.3', '--dry-run']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.split('\n').filter((l) => /^ {2}L\d .* rule softmax\/matmul-qk$/.test(l)).length, 2);
    assert.match(r.stdout, /\/blocks\.1\/mlp\/Softmax: logits come from .* \(rule softmax\/matmul-qk stopped at '\/blocks\.1\/mlp\/router\/MatMul'\)/);
  });
});
