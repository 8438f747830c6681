/**
 * com.microsoft DecoderMaskedMultiHeadAttention (onnxruntime's docs/ContribOperators.md): one query token; self
 * attention over past + 1, or cross attention over cached keys given as key [B,N,L,H].
 */
import { headsFromAttr, patchedOp, Term } from './types';

const inputs = {
  query: 0, key: 1, value: 2, mask_index: 3, attention_bias: 4, past_key: 5, past_value: 6, past_sequence_length: 7, beam_width: 8,
  cache_indirection: 9, bias: 10,
} as const;
type Role = keyof typeof inputs;

export const DECODER_MASKED_MULTI_HEAD_ATTENTION = patchedOp({
  id: 'com.microsoft.DecoderMaskedMultiHeadAttention', domain: 'com.microsoft', opType: 'DecoderMaskedMultiHeadAttention', rule: 'fused/ms-dmmha',
  inputs,
  outputs: { output: 0, present_key: 1, present_value: 2, qk: 3 },
  elementType: ['query', 'key', 'value'],
  prior: { input: 'attention_bias' },
  // output_qk = 1: qk holds the scaled Q·Kᵀ, (batch_size, num_heads, 1, total_sequence_length).
  probabilities: { output: 'qk', mode: { attribute: 'output_qk', enable: 1 }, holds: (mode) => (mode === 1 ? 'logits' : { reason: 'its qk output is not enabled' }) },
  contracts: {
    lengths: { past_sequence_length: 'past' },
    queryRows: { rows: 1 },
    beams: { width: 'beam_width', indirection: 'cache_indirection' },
    minPast: { tokens: 1, why: 'onnxruntime 1.30\'s CPU kernel corrupts memory (the process aborts) on an empty cache (past_sequence_length 0)' },
    sharedBuffer: { attribute: 'past_present_share_buffer', caches: ['past_key', 'past_value'], axis: 2, length: 'past_sequence_length' },
    notes: [
      'query: (batch_size, 1, hidden_size), or packed QKV (batch_size, 1, 2 * hidden_size + v_hidden_size)',
      'key, value: (batch_size, 1, ·) for self attention, or the cached (batch_size, num_heads, kv_sequence_length, head_size) for cross attention',
      'mask_index: (batch_size, total_sequence_length) or (batch_size, kv_sequence_length)',
      'a shared key buffer is re-ordered to (batch_size, num_heads, head_size / x, max_sequence_length, x), x = 16 / sizeof(T)',
    ],
  },
  match(v) {
    const packed = !v.has('key');
    const kRank = v.rank('key');
    const cross = !packed && (kRank === 4 || (kRank === undefined && !v.has('past_key')));
    const share = v.int('past_present_share_buffer') === 1;
    let tk: Term<Role>[];
    if (cross) tk = [{ role: 'key', axis: 2 }];
    else if (share && v.has('past_sequence_length')) tk = [{ role: 'past_sequence_length', value: true }, { role: 'query', axis: 1 }];
    else if (share) tk = [{ role: 'past_key', axis: 2 }, { role: 'query', axis: 1 }];
    else tk = [...(v.has('past_key') ? [{ role: 'past_key' as const, axis: 2 }] : []), { role: 'query', axis: 1 }];
    const deviation = !cross && share && !v.has('past_sequence_length')
      ? 'shared past/present buffer without past_sequence_length: its length is not the sequence length' : undefined;
    const bias = v.has('bias') ? 'bias' as const : undefined;
    return {
      heads: headsFromAttr(v, 'num_heads'),
      mask: v.masks(['mask_index', 'attention_bias'], 'one query token attends to every cached key'),
      query: packed ? { layout: 'packed', input: 'query', qParts: 1, parts: 3, bias } : { layout: 'bsd', input: 'query', bias },
      // One query token: causal and keys give the same n = Tk.
      n: { kind: 'keys', tk }, queryLength: { role: 'query', axis: 1 }, deviation,
    };
  },
});
