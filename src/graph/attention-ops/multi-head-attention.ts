/**
 * com.microsoft MultiHeadAttention (onnxruntime's docs/ContribOperators.md): query [B,S,N·H] (bias added inside)
 * or packed QKV [B,S,N,3,H]; keys from key [B,L,·] / [B,N,L,H] (cross attention on cached keys) / packed KV
 * [B,L,N,2,H], plus past_key [B,N,P,H].
 */
import { headsFromAttr, patchedOp, Term } from './types';

const inputs = {
  query: 0, key: 1, value: 2, bias: 3, key_padding_mask: 4, attention_bias: 5, past_key: 6, past_value: 7, past_sequence_length: 8,
  cache_indirection: 9,
} as const;
type Role = keyof typeof inputs;

export const MULTI_HEAD_ATTENTION = patchedOp({
  id: 'com.microsoft.MultiHeadAttention', domain: 'com.microsoft', opType: 'MultiHeadAttention', rule: 'fused/ms-multihead', inputs,
  outputs: { output: 0, present_key: 1, present_value: 2, qk: 3 },
  elementType: ['query', 'key', 'value'],
  prior: { input: 'attention_bias' },
  // qk: the scaled Q·Kᵀ with the mask applied, (batch_size, num_heads, sequence_length, total_sequence_length).
  probabilities: { output: 'qk', holds: () => 'logits' },
  contracts: {
    lengths: { past_sequence_length: 'past' },
    // With a cache indirection the node runs DecoderMaskedMultiHeadAttention's kernel, with its contract: one query
    // token, a cache of at least one token, and batch × beams = the query's batch.
    beams: { indirection: 'cache_indirection' },
    queryRows: { rows: 1, given: 'cache_indirection' },
    minPast: { tokens: 1, why: 'with a cache indirection, onnxruntime 1.30\'s CPU kernel corrupts memory (the process aborts) on an empty cache (past_sequence_length 0)', given: 'cache_indirection' },
    // A past_sequence_length makes the caches one buffer: present_key has past_key's shape (onnxruntime 1.30, CPU).
    sharedBuffer: { attribute: 'past_present_share_buffer', given: 'past_sequence_length', caches: ['past_key', 'past_value'], axis: 2, length: 'past_sequence_length' },
    notes: [
      'key_padding_mask: (batch_size), (3 * batch_size + 2), (batch_size, kv_sequence_length), (batch_size, total_sequence_length) '
        + 'or (batch_size, sequence_length, total_sequence_length); 0 = padding',
      'bias: (hidden_size + hidden_size + v_hidden_size), the input projection\'s',
      'past_key, past_value: (batch_size, num_heads, past_sequence_length, head_size), or max_sequence_length with a shared buffer',
    ],
  },
  match(v) {
    const qRank = v.rank('query');
    const packed = !v.has('key') || qRank === 5;
    if (packed && qRank !== undefined && qRank !== 5) return { reason: 'MultiHeadAttention without key: expected packed QKV of rank 5' };
    if (packed && v.has('bias')) return { reason: 'MultiHeadAttention: bias with packed QKV is not handled' };
    const kRank = v.rank('key');
    let kv: Term<Role>;
    if (packed) kv = { role: 'query', axis: 1 };
    else if (kRank === 4) kv = { role: 'key', axis: 2 };
    else if (kRank === 3 || kRank === 5) kv = { role: 'key', axis: 1 };
    else return { reason: 'MultiHeadAttention: rank of key unknown, cannot tell its sequence axis' };
    const tk: Term<Role>[] = [kv];
    if (v.has('past_sequence_length')) tk.push({ role: 'past_sequence_length', value: true });
    else if (v.has('past_key')) tk.push({ role: 'past_key', axis: 2 });
    const mask = v.int('unidirectional') === 1
      ? { causal: true, reason: 'causal: unidirectional=1' } : v.masks(['key_padding_mask', 'attention_bias'], 'no key_padding_mask or attention_bias');
    const deviation = kRank === 4 && v.has('past_key') ? 'past_key given with 4-D key: the key length is ambiguous' : undefined;
    return {
      heads: headsFromAttr(v, 'num_heads'), mask,
      query: packed ? { layout: 'bsn3h', input: 'query' } : { layout: 'bsd', input: 'query', bias: v.has('bias') ? 'bias' : undefined },
      n: mask.causal ? { kind: 'causal', tk } : { kind: 'keys', tk },
      queryLength: { role: 'query', axis: 1 }, deviation,
    };
  },
});
