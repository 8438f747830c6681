/**
 * The fused-operator specs (src/graph/attention-ops): their input and output positions are the operators'
 * schemas, every role a spec names elsewhere is one of its own, the plans its matcher makes read only inputs the
 * node gives, each patched spec is a detection rule in the order of the spec list and each refused one a
 * refusal with its reason, and the lookups by node and by role.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { findAttentionSoftmax } from '../src/detect/find-attention';
import { RULES } from '../src/detect/rules';
import {
  AttentionOp, inputAt, inputList, MS_ATTENTION, MULTI_HEAD_ATTENTION, NodeView, ONNX_ATTENTION, OpMatch, PATCHED_OPS, PatchedOp, REFUSED_OPS,
  roleAt, specOf, Term,
} from '../src/graph/attention-ops';
import { DataType, NodeProto } from '../src/io/onnx';
import { model, node, value } from './support/build';

/**
 * The inputs and outputs by position as the schemas list them ('' where a position has no role here):
 * onnxruntime's docs/ContribOperators.md, onnx's docs/Operators.md; GroupQueryAttention's q_norm_weight and
 * k_norm_weight (14, 15) are onnxruntime 1.30's.
 */
const SCHEMAS: Record<string, { inputs: string[]; outputs: string[] }> = {
  'com.microsoft.MultiHeadAttention': {
    inputs: ['query', 'key', 'value', 'bias', 'key_padding_mask', 'attention_bias', 'past_key', 'past_value', 'past_sequence_length', 'cache_indirection'],
    outputs: ['output', 'present_key', 'present_value', 'qk'],
  },
  'com.microsoft.GroupQueryAttention': {
    inputs: ['query', 'key', 'value', 'past_key', 'past_value', 'seqlens_k', 'total_sequence_length', 'cos_cache', 'sin_cache', 'position_ids',
      'attention_bias', 'head_sink', '', '', 'q_norm_weight', 'k_norm_weight'],
    outputs: ['output', 'present_key', 'present_value', 'output_qk'],
  },
  'com.microsoft.DecoderMaskedMultiHeadAttention': {
    inputs: ['query', 'key', 'value', 'mask_index', 'attention_bias', 'past_key', 'past_value', 'past_sequence_length', 'beam_width',
      'cache_indirection', 'bias'],
    outputs: ['output', 'present_key', 'present_value', 'qk'],
  },
  'com.microsoft.Attention': { inputs: ['input', 'weights', 'bias', 'mask_index', 'past', 'attention_bias', 'past_sequence_length'], outputs: ['output', 'present'] },
  Attention: { inputs: ['Q', 'K', 'V', 'attn_mask', 'past_key', 'past_value', 'nonpad_kv_seqlen'], outputs: ['Y', 'present_key', 'present_value', 'qk_matmul_output'] },
  'com.microsoft.PackedAttention': { inputs: ['input', 'weights', 'bias', 'token_offset', 'cumulative_sequence_length', 'attention_bias'], outputs: ['output'] },
  'com.microsoft.PackedMultiHeadAttention': {
    inputs: ['query', 'key', 'value', 'bias', 'token_offset', 'cumulative_sequence_length', 'attention_bias'], outputs: ['output'],
  },
};

const ALL: AttentionOp[] = [...PATCHED_OPS, ...REFUSED_OPS];

/** Roles by position: the inverse of a spec's table. */
function byPosition(table: Readonly<Record<string, number>>): string[] {
  const list: string[] = [];
  for (const [role, at] of Object.entries(table)) {
    assert.equal(list[at] ?? '', '', `two roles at position ${at}: ${list[at]} and ${role}`);
    while (list.length < at) list.push('');
    list[at] = role;
  }
  return list;
}

/** Every role a spec names outside its input and output tables. */
function namedRoles(spec: AttentionOp): { inputs: string[]; outputs: string[] } {
  const c = spec.contracts;
  const inputs = [...spec.elementType, ...Object.keys(c.lengths ?? {}), ...Object.values(c.lengths ?? {}).flatMap((f) => (typeof f === 'object' ? [f.keysOf] : [])),
    ...(c.keyEnds ? [c.keyEnds] : []), ...(c.sharedBuffer ? [...c.sharedBuffer.caches, ...(c.sharedBuffer.length ? [c.sharedBuffer.length] : [])] : []),
    ...(c.packedTokens ? [c.packedTokens.offsets, c.packedTokens.cumulative] : [])];
  if ('refused' in spec) return { inputs, outputs: [] };
  return { inputs: [...inputs, spec.prior.input], outputs: spec.probabilities ? [spec.probabilities.output] : [] };
}

/** A node as a matcher sees it: the given inputs (by role) with their ranks, the outputs, the attributes. */
interface FakeNode { ranks: Record<string, number>; outputs?: string[]; attrs?: Record<string, number> }

function view(n: FakeNode): NodeView<string, string> {
  const has = (role: string): boolean => role in n.ranks;
  return {
    has, hasOutput: (role) => (n.outputs ?? []).includes(role), rank: (role) => n.ranks[role], declaredDim: () => undefined,
    int: (name) => n.attrs?.[name], float: (name) => n.attrs?.[name], ints: () => undefined,
    masks: (roles, why) => ({ causal: false, reason: roles.some(has) ? 'a mask' : `no mask (${why})` }),
  };
}

/** The inputs a match reads: its query, the terms and inputs of its n plan, the query length. */
function readRoles(m: OpMatch): string[] {
  const q = m.query;
  const terms = (t: Term[]): string[] => t.map((x) => x.role);
  const n = m.n;
  const plan = n.kind === 'lengths' ? [n.lengths, ...(n.promptTotal ? [n.promptTotal] : []), ...terms(n.keys ?? [])]
    : n.kind === 'mask-index' ? [...terms(n.tk), ...(n.mask ? [n.mask] : [])]
      : n.kind === 'causal-offset' ? [...terms(n.tk), ...terms(n.offset)] : terms(n.tk);
  const query = q.layout === 'weights' ? [q.weights, ...(q.bias ? [q.bias] : [])] : [q.input, ...('bias' in q && q.bias ? [q.bias] : [])];
  return [...query, ...plan, m.queryLength.role];
}

/** Nodes each patched operator's matcher accepts, over its layouts, caches, masks and lengths. */
const CASES: Record<string, FakeNode[]> = {
  'com.microsoft.MultiHeadAttention': [
    { ranks: { query: 3, key: 3, value: 3 } },
    { ranks: { query: 3, key: 3, value: 3, bias: 1, key_padding_mask: 2, attention_bias: 4, past_key: 4, past_value: 4 }, attrs: { num_heads: 2 } },
    { ranks: { query: 3, key: 3, value: 3, past_key: 4, past_value: 4, past_sequence_length: 1 }, attrs: { unidirectional: 1 } },
    { ranks: { query: 3, key: 4, value: 4 } },
    { ranks: { query: 5 } },
  ],
  'com.microsoft.GroupQueryAttention': [
    { ranks: { query: 3, key: 3, value: 3, seqlens_k: 1, total_sequence_length: 0 }, attrs: { num_heads: 4, kv_num_heads: 2 } },
    { ranks: { query: 3, seqlens_k: 1, total_sequence_length: 0, past_key: 4, past_value: 4 }, attrs: { num_heads: 4, kv_num_heads: 2, local_window_size: 8 } },
    { ranks: { query: 3, key: 3, value: 3, seqlens_k: 1, total_sequence_length: 0, attention_bias: 4 }, attrs: { num_heads: 4, kv_num_heads: 2, causal: 0 } },
  ],
  'com.microsoft.DecoderMaskedMultiHeadAttention': [
    { ranks: { query: 3, key: 3, value: 3, past_key: 4, past_value: 4, bias: 1 } },
    { ranks: { query: 3, key: 3, value: 3, past_key: 4, past_value: 4, past_sequence_length: 1 }, attrs: { past_present_share_buffer: 1 } },
    { ranks: { query: 3, key: 4, value: 4, mask_index: 2 } },
    { ranks: { query: 3, past_key: 4, past_value: 4 } },
    { ranks: { query: 3, key: 3, value: 3 } },
  ],
  'com.microsoft.Attention': [
    { ranks: { input: 3, weights: 2, bias: 1 } },
    { ranks: { input: 3, weights: 2, bias: 1, mask_index: 1, past: 5 }, attrs: { unidirectional: 1 } },
    { ranks: { input: 3, weights: 2, mask_index: 4 } },
    { ranks: { input: 3, weights: 2, past: 5, past_sequence_length: 1 }, attrs: { past_present_share_buffer: 1, unidirectional: 1 } },
  ],
  Attention: [
    { ranks: { Q: 3, K: 3, V: 3 }, attrs: { q_num_heads: 2, kv_num_heads: 2 } },
    { ranks: { Q: 4, K: 4, V: 4, past_key: 4, past_value: 4 }, attrs: { is_causal: 1 } },
    { ranks: { Q: 4, K: 4, V: 4, past_key: 4, past_value: 4, nonpad_kv_seqlen: 1 }, attrs: { is_causal: 1 } },
    { ranks: { Q: 3, K: 3, V: 3, attn_mask: 2 }, outputs: ['qk_matmul_output'], attrs: { softcap: 30 } },
  ],
};

describe('fused-operator specs', () => {
  it('input and output positions are the operators\' schemas', () => {
    assert.deepEqual(Object.keys(SCHEMAS).sort(), ALL.map((s) => s.id).sort());
    for (const spec of ALL) {
      assert.deepEqual({ inputs: byPosition(spec.inputs), outputs: byPosition(spec.outputs) }, SCHEMAS[spec.id], spec.id);
    }
  });

  it('every role a spec names is one of its inputs or outputs', () => {
    for (const spec of ALL) {
      const named = namedRoles(spec);
      for (const role of named.inputs) assert.ok(role in spec.inputs, `${spec.id}: '${role}' is not an input`);
      for (const role of named.outputs) assert.ok(role in spec.outputs, `${spec.id}: '${role}' is not an output`);
    }
  });

  it('the plans a matcher makes read only inputs the node gives', () => {
    assert.deepEqual(Object.keys(CASES).sort(), PATCHED_OPS.map((s) => s.id).sort());
    for (const spec of PATCHED_OPS as readonly PatchedOp[]) {
      for (const c of CASES[spec.id]) {
        const m = spec.match(view(c));
        assert.ok(!('reason' in m), `${spec.id} ${JSON.stringify(c)}: ${'reason' in m ? m.reason : ''}`);
        for (const role of readRoles(m)) assert.ok(role in c.ranks, `${spec.id} ${JSON.stringify(c)} reads '${role}', which the node does not give`);
      }
    }
  });

  it('each patched spec is a detection rule, in the order of the spec list; each refused one a refusal with its reason', () => {
    const names = RULES.map((r) => r.name);
    const fused = PATCHED_OPS.map((s) => s.rule);
    const first = names.indexOf(fused[0]);
    assert.deepEqual(names.slice(first, first + fused.length + 1), [...fused, 'fused/unsupported']);
    for (const spec of REFUSED_OPS) {
      const m = model({ nodes: [{ ...node(spec.opType, ['q', 'k', 'v'], ['y'], { num_heads: 2 }, spec.opType), domain: spec.domain }],
        inputs: ['q', 'k', 'v'].map((x) => value(x, DataType.FLOAT, [1, 4, 8])), outputs: [value('y', DataType.FLOAT, [])] });
      m.opsetImport.push({ domain: spec.domain, version: 1 });
      const { skipped } = findAttentionSoftmax(m);
      assert.deepEqual(skipped.map((k) => [k.rule, k.reason]), [['fused/unsupported', `fused ${spec.opType}: not patched (${spec.refused})`]]);
    }
  });

  it('finds a node\'s spec by domain and op type (ONNX\'s own as \'\' or ai.onnx), and inputs by role', () => {
    const n = (domain: string, opType: string): NodeProto => ({ ...node(opType, [], []), domain });
    assert.equal(specOf(n('com.microsoft', 'Attention')), MS_ATTENTION);
    assert.equal(specOf(n('', 'Attention')), ONNX_ATTENTION);
    assert.equal(specOf(n('ai.onnx', 'Attention')), ONNX_ATTENTION);
    assert.equal(specOf(n('', 'MultiHeadAttention')), undefined);
    assert.equal(roleAt(MS_ATTENTION, 3), 'mask_index');
    assert.equal(roleAt(MS_ATTENTION, 9), undefined);
    assert.deepEqual(inputList(MULTI_HEAD_ATTENTION, { query: 'q', key: 'k', value: 'v', attention_bias: 'b' }), ['q', 'k', 'v', '', '', 'b']);
    assert.deepEqual(inputList(MULTI_HEAD_ATTENTION, { query: 'q', key: 'k', value: 'v', attention_bias: undefined }), ['q', 'k', 'v']);
    assert.throws(() => inputAt<string>(MS_ATTENTION, 'seqlens_k'), /internal error: com.microsoft.Attention has no input 'seqlens_k'/);
  });
});
