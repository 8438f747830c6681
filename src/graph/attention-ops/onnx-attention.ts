/**
 * ONNX Attention (opset 23; nonpad_kv_seqlen from 24; onnx's docs/Operators.md): 3-D [B,S,N·H] inputs with
 * q_num_heads / kv_num_heads, or 4-D [B,N,S,H].
 */
import { HeadInfo, headsFromAttr, MaskVerdict, NPlan, patchedOp, Term } from './types';

const inputs = { Q: 0, K: 1, V: 2, attn_mask: 3, past_key: 4, past_value: 5, nonpad_kv_seqlen: 6 } as const;
type Role = keyof typeof inputs;

export const ONNX_ATTENTION = patchedOp({
  id: 'Attention', domain: '', opType: 'Attention', sinceOpset: 23, rule: 'fused/onnx-attention', inputs,
  outputs: { Y: 0, present_key: 1, present_value: 2, qk_matmul_output: 3 },
  elementType: ['Q', 'K', 'V'],
  // attn_mask: a bool mask (true = attend) or a float one added to the scaled logits.
  prior: { input: 'attn_mask', bool: true },
  // onnxruntime 1.30's qk_matmul_output: 0 the scaled Q·Kᵀ, 1 after softcap, 2 after the mask, 3 the probabilities.
  probabilities: {
    output: 'qk_matmul_output', mode: { attribute: 'qk_matmul_output_mode', enable: 3 },
    holds: (mode) => (mode === 3 ? 'probs' : mode === 0 ? { reason: 'its qk output holds the logits before the mask' } : 'logits'),
  },
  expansion: 'softcap ≠ 0, or a qk_matmul_output in mode 0 or 1 (the logits before the mask): the node becomes its definition, the '
    + 'factor on the capped logits (rewrite/onnx-attention.ts)',
  contracts: {
    lengths: { nonpad_kv_seqlen: { keysOf: 'K' } },
    divisible: [{ size: 'q_num_heads', by: 'kv_num_heads' }],
    notes: [
      'Q: (batch_size, q_num_heads, q_sequence_length, head_size) or (batch_size, q_sequence_length, q_hidden_size) with q_num_heads; '
        + 'K and V likewise with kv_num_heads',
      'attn_mask: bool (true = attend) or of Q\'s type (added), its last axis padded with −inf up to the key count',
      'nonpad_kv_seqlen: int64 (batch_size), the valid keys of a static cache; is_causal then aligns each item at nonpad − S',
    ],
  },
  match(v) {
    const qRank = v.rank('Q');
    const kRank = v.rank('K');
    if (qRank !== 3 && qRank !== 4) return { reason: 'ONNX Attention: rank of Q unknown (3-D or 4-D layout cannot be told)' };
    if (kRank !== 3 && kRank !== 4) return { reason: 'ONNX Attention: rank of K unknown' };
    const softcap = v.float('softcap') ?? 0;
    const mode = v.int('qk_matmul_output_mode') ?? 0;
    const expand = softcap !== 0 ? `softcap=${softcap}: the cap comes after a factor on Q, so the factor goes after it in the expanded node`
      : v.hasOutput('qk_matmul_output') && mode <= 1 ? `qk_matmul_output_mode=${mode} outputs the logits before the mask, which a factor on Q would change` : undefined;
    const h = v.declaredDim('Q', 1);
    const heads: HeadInfo = qRank === 3 ? headsFromAttr(v, 'q_num_heads')
      : h ? { heads: h, axis: 1, reason: `declared shape of Q has ${h} heads at axis 1` } : { axis: 1, reason: 'heads are axis 1 of Q; its size is not declared' };
    const past: Term<Role>[] = v.has('past_key') ? [{ role: 'past_key', axis: 2 }] : [];
    const tk: Term<Role>[] = [{ role: 'K', axis: kRank === 3 ? 1 : 2 }, ...past];
    const isCausal = v.int('is_causal') === 1;
    const mask: MaskVerdict = isCausal ? { causal: true, reason: 'causal: is_causal=1' } : v.masks(['attn_mask'], 'no attn_mask');
    let n: NPlan<Role>;
    // The key buffer a prior spans (a static cache with nonpad_kv_seqlen), K's sequence axis taken from Q's layout.
    if (v.has('nonpad_kv_seqlen')) n = { kind: 'lengths', lengths: 'nonpad_kv_seqlen', plusOne: false, causal: mask.causal, keys: [{ role: 'K', axis: qRank === 4 ? 2 : 1 }, ...past] };
    else if (isCausal) n = { kind: 'causal-offset', tk, offset: past };
    else n = mask.causal ? { kind: 'causal', tk } : { kind: 'keys', tk };
    return {
      heads, mask, n, expand,
      query: qRank === 3 ? { layout: 'bsd', input: 'Q' } : { layout: 'bnsd', input: 'Q' },
      queryLength: { role: 'Q', axis: qRank === 3 ? 1 : 2 },
    };
  },
});
