/**
 * com.microsoft Attention (onnxruntime's docs/ContribOperators.md): Q = input·weights[:, :hidden] + bias[:hidden]
 * is computed inside. Without a mask and without causal masking every row sees n = Tk keys: scaling the query
 * columns of weights and bias is exact. A causal or masked node needs n per row and per item: it is expanded into
 * its projection and MultiHeadAttention (rewrite/ms-attention.ts).
 */
import { headsFromAttr, NPlan, patchedOp, Term } from './types';

const inputs = { input: 0, weights: 1, bias: 2, mask_index: 3, past: 4, attention_bias: 5, past_sequence_length: 6 } as const;
type Role = keyof typeof inputs;

export const MS_ATTENTION = patchedOp({
  id: 'com.microsoft.Attention', domain: 'com.microsoft', opType: 'Attention', rule: 'fused/ms-attention', inputs,
  outputs: { output: 0, present: 1 },
  elementType: ['input', 'weights', 'bias'],
  prior: { input: 'attention_bias' },
  // No attention output: verification recomputes the probabilities from the inputs (verify/row-max.ts).
  expansion: 'n per row or per item (unidirectional=1, or a mask_index): the node becomes its QKV projection and MultiHeadAttention, '
    + 'the factor on the projected query rows; not with do_rotary=1 (Q is rotated inside)',
  contracts: {
    keyEnds: 'mask_index',
    divisible: [{ size: 'hidden_size (qkv_hidden_sizes[0], else a third of the weights\' columns)', by: 'num_heads' }],
    sharedBuffer: { attribute: 'past_present_share_buffer', caches: ['past'], axis: 3, length: 'past_sequence_length' },
    notes: [
      'weights: (input_hidden_size, hidden_size + hidden_size + v_hidden_size), split at qkv_hidden_sizes (equal thirds without it)',
      'mask_index: int32 (batch_size) key lengths, (2 * batch_size) end then start positions, (3 * batch_size + 2), raw (batch_size, '
        + 'total_sequence_length) or (batch_size, sequence_length, total_sequence_length) with 1 = attend, or (batch_size, 1, '
        + 'max_sequence_length, max_sequence_length)',
      'past: (2, batch_size, num_heads, past_sequence_length, head_size), given with present; with past, Q, K and V have one hidden size',
      'past_sequence_length: required with past_present_share_buffer (0 allowed)',
    ],
  },
  match(v) {
    const share = v.int('past_present_share_buffer') === 1;
    if (v.has('past_sequence_length') && !share) {
      return { reason: `com.microsoft Attention with input ${inputs.past_sequence_length} (separate key, or past_sequence_length without a shared buffer) is not handled` };
    }
    const tk: Term<Role>[] = [{ role: 'input', axis: 1 }];
    const deviations: string[] = [];
    if (share && v.has('past_sequence_length')) tk.push({ role: 'past_sequence_length', value: true });
    else if (v.has('past')) {
      tk.push({ role: 'past', axis: 3 });
      if (share) deviations.push('shared past/present buffer without past_sequence_length: its length is not the sequence length');
    }
    const unidirectional = v.int('unidirectional') === 1;
    const mask = v.has('mask_index') ? 'mask_index' as const : undefined;
    const maskRank = mask === undefined ? undefined : v.rank(mask);
    if (mask !== undefined && (maskRank === undefined || maskRank < 1 || maskRank > 4)) {
      return { reason: 'com.microsoft Attention: mask_index of unknown rank, so its format (lengths, raw 2-D, 3-D, 4-D) cannot be told' };
    }
    if (maskRank === 4 && unidirectional) return { reason: 'com.microsoft Attention: a 4-D (Megatron) mask_index with unidirectional=1 is invalid for this operator' };
    const rotary = v.int('do_rotary') === 1;
    const perRow = unidirectional || mask !== undefined;
    if (perRow && rotary) {
      deviations.push(`do_rotary=1 with ${unidirectional ? 'causal masking' : 'a mask_index'}: the kernel rotates Q after projecting it, so Q cannot `
        + 'leave the node and n per row is impossible; forced, every row gets n = Tk (fuse to MultiHeadAttention + RotaryEmbedding instead)');
    }
    const sizes = v.ints('qkv_hidden_sizes');
    const n: NPlan<Role> = perRow && !rotary ? { kind: 'mask-index', causal: unidirectional, unidirectional, mask, maskRank, tk } : { kind: 'keys', tk };
    const why = unidirectional ? `causal: unidirectional=1${mask !== undefined ? ` and a mask_index of rank ${maskRank}` : ''}`
      : mask !== undefined ? `mask_index of rank ${maskRank}: n counts the keys it leaves visible` : 'no mask_index';
    return {
      heads: headsFromAttr(v, 'num_heads'), mask: { causal: unidirectional, reason: why },
      query: { layout: 'weights', weights: 'weights', bias: v.has('bias') ? 'bias' : undefined, qWidth: sizes?.[0], expandable: !rotary },
      n, queryLength: { role: 'input', axis: 1 },
      deviation: deviations.length ? deviations.join('; ') : undefined,
    };
  },
});
