/**
 * com.microsoft GroupQueryAttention (onnxruntime's docs/ContribOperators.md): n from seqlens_k (total − 1 per
 * batch entry) and total_sequence_length, never from the cache buffer's shape (which may be a shared max-length
 * buffer). Inputs 14 and 15 (q_norm_weight, k_norm_weight) are onnxruntime 1.30's; the fetched documentation
 * ends at head_sink (11).
 */
import { headsFromAttr, MaskVerdict, patchedOp } from './types';

const inputs = {
  query: 0, key: 1, value: 2, past_key: 3, past_value: 4, seqlens_k: 5, total_sequence_length: 6, cos_cache: 7, sin_cache: 8,
  position_ids: 9, attention_bias: 10, head_sink: 11, q_norm_weight: 14, k_norm_weight: 15,
} as const;

export const GROUP_QUERY_ATTENTION = patchedOp({
  id: 'com.microsoft.GroupQueryAttention', domain: 'com.microsoft', opType: 'GroupQueryAttention', rule: 'fused/ms-gqa', inputs,
  outputs: { output: 0, present_key: 1, present_value: 2, output_qk: 3 },
  elementType: ['query', 'key', 'value'],
  prior: { input: 'attention_bias' },
  // qk_output: 1 the logits before the Softmax, 2 the probabilities.
  probabilities: {
    output: 'output_qk', mode: { attribute: 'qk_output', enable: 2 },
    holds: (mode) => (mode === 2 ? 'probs' : mode === 1 ? 'logits' : { reason: 'its qk output is in a mode that holds no probabilities' }),
  },
  contracts: {
    lengths: { seqlens_k: 'total-1', total_sequence_length: 'total' },
    divisible: [{ size: 'num_heads', by: 'kv_num_heads' }],
    notes: [
      'seqlens_k: int32 (batch_size), total_sequence_lengths − 1; total_sequence_length: int32 scalar, the batch\'s maximum total (past + new)',
      'packed QKV (no key, no value): (batch_size, sequence_length, num_heads * head_size + 2 * kv_num_heads * head_size)',
      'key, value: (batch_size, kv_sequence_length, kv_num_heads * head_size); past_key, past_value: BNSH, of max_sequence_length when '
        + 'shared with present',
      'cos_cache, sin_cache: (max_sequence_length, head_size / 2) with do_rotary',
    ],
  },
  match(v) {
    const heads = headsFromAttr(v, 'num_heads');
    const kvHeads = v.int('kv_num_heads') ?? 0;
    const packed = !v.has('key');
    if (packed && (!heads.heads || kvHeads <= 0)) return { reason: 'GroupQueryAttention packed QKV without num_heads/kv_num_heads' };
    const deviations: string[] = [];
    const softcap = v.float('softcap') ?? 0;
    if (softcap !== 0) deviations.push(`softcap=${softcap}: tanh capping after the factor is not SSMax`);
    const sink = v.int('smooth_softmax') === 1 || v.has('head_sink');
    if (sink) deviations.push('attention sink (smooth_softmax / head_sink): the extra softmax term is not scaled with n');
    const qNorm = v.has('q_norm_weight') || v.has('k_norm_weight');
    if (qNorm) deviations.push('q_norm_weight: the kernel RMS-normalises Q after the point where the factor goes, undoing it');
    const causal = (v.int('causal') ?? 1) === 1;
    const window = v.int('local_window_size') ?? -1;
    const mask: MaskVerdict = causal ? { causal: true, reason: `causal: GroupQueryAttention${window > 0 ? ` with local_window_size=${window}` : ''}` }
      : v.masks(['attention_bias'], 'causal=0');
    return {
      heads, mask,
      query: packed ? { layout: 'packed', input: 'query', qParts: heads.heads!, parts: heads.heads! + 2 * kvHeads } : { layout: 'bsd', input: 'query' },
      n: { kind: 'lengths', lengths: 'seqlens_k', plusOne: true, causal, promptTotal: 'total_sequence_length', window: window > 0 ? window : undefined },
      queryLength: { role: 'query', axis: 1 },
      deviation: deviations.length ? deviations.join('; ') : undefined,
    };
  },
});
