/**
 * com.microsoft PackedAttention (onnxruntime's docs/ContribOperators.md): com.microsoft Attention on a token-packed
 * (padding-free) input [token_count, input_hidden_size], Q computed inside. Refused.
 */
import { refusedOp } from './types';

export const PACKED_ATTENTION = refusedOp({
  id: 'com.microsoft.PackedAttention', domain: 'com.microsoft', opType: 'PackedAttention',
  inputs: { input: 0, weights: 1, bias: 2, token_offset: 3, cumulative_sequence_length: 4, attention_bias: 5 },
  outputs: { output: 0 },
  elementType: ['input', 'weights', 'bias'],
  refused: 'packed (padding-free) token layout, Q computed inside: not handled yet; patch the model before packing (onnxruntime\'s optimizer) instead',
  contracts: {
    packedTokens: { offsets: 'token_offset', cumulative: 'cumulative_sequence_length' },
    divisible: [{ size: 'hidden_size (qkv_hidden_sizes[0], else a third of the weights\' columns)', by: 'num_heads' }],
    notes: [
      'token_offset: int32 (batch_size, sequence_length), each token\'s position before packing (real tokens first, then the padding)',
      'cumulative_sequence_length: int32 (batch_size + 1), 0 then the running total of the items\' lengths',
      'attention_bias: (batch_size or 1, num_heads or 1, sequence_length, sequence_length); right padding only (BERT-like models)',
    ],
  },
});
