/**
 * com.microsoft PackedMultiHeadAttention (onnxruntime's docs/ContribOperators.md): MultiHeadAttention on
 * token-packed (padding-free) query, key and value [token_count, ·], or packed QKV [token_count, N, 3, H]. Refused.
 */
import { refusedOp } from './types';

export const PACKED_MULTI_HEAD_ATTENTION = refusedOp({
  id: 'com.microsoft.PackedMultiHeadAttention', domain: 'com.microsoft', opType: 'PackedMultiHeadAttention',
  inputs: { query: 0, key: 1, value: 2, bias: 3, token_offset: 4, cumulative_sequence_length: 5, attention_bias: 6 },
  outputs: { output: 0 },
  elementType: ['query', 'key', 'value'],
  refused: 'packed (padding-free) token layout: not handled yet; patch the model before packing (onnxruntime\'s optimizer) instead',
  contracts: {
    packedTokens: { offsets: 'token_offset', cumulative: 'cumulative_sequence_length' },
    notes: [
      'token_offset: int32 (batch_size, sequence_length), each token\'s position before packing',
      'cumulative_sequence_length: int32 (batch_size + 1), 0 then the running total of the items\' lengths',
      'attention_bias: (batch_size or 1, num_heads or 1, sequence_length, sequence_length); right padding only (BERT-like models)',
    ],
  },
});
