/**
 * ONNX Attention (opset 23, 24) expanded into its definition where the factor cannot go on Q: with a softcap
 * (the cap would come after the factor) or a qk_matmul_output that shows the logits before the mask (a factor on Q
 * would show in it). The node is replaced through the journal by the ops it is defined by, as onnxruntime 1.30
 * computes them, with the same output names:
 *
 *   Q, K, V as [B, N, S, H] (3-D inputs split by q_num_heads / kv_num_heads); present = Concat(past, new)
 *   K and V heads repeated for grouped queries (kv head n // (Nq / Nkv) serves query head n)
 *   qk     = (scale·Q)·Kᵀ, cast to softmax_precision        ← qk_matmul_output mode 0
 *   capped = softcap · tanh(qk / softcap)                    ← mode 1
 *   logits = c · capped + bias                               ← mode 2; the SSMax factor c = s·ln n per row here
 *   probs  = Softmax(logits), 0 on rows whose bias hides every key   ← mode 3
 *   Y      = probs·V, merged back to 3-D when Q was
 *
 * bias = attn_mask (bool: 0 or −inf; a last axis shorter than the keys padded with −inf) + the causal mask
 * (key j ≤ i + P, P the past length, or nonpad_kv_seqlen[b] − S with a static cache) + nonpad_kv_seqlen padding.
 * n = keys the row may see: entries of the bias less than HIDDEN_GAP below the row's largest (the plain-op convention, mask-uses.ts), or Tk.
 */
import { FusedSite } from '../detect/fused';
import { inputOf, ONNX_ATTENTION, outputOf } from '../graph/attention-ops';
import { HIDDEN_GAP } from '../detect/mask-uses';
import { attrFloat, attrInt } from '../graph/graph';
import { Shapes } from '../graph/shapes';
import { DataType } from '../io/onnx';
import { NMode } from '../policy/n-mode';
import { Builder } from './builder';
import { applyFactor } from './dtype';
import { presetFactor } from './factor';
import { InsertedFused, Rows } from './fused';
import { PART } from '../identity';
import { ExpansionParams } from './ms-attention';
import { fusedPrior } from './prior';
import { extremeLastAxis } from './versioned';

type Role = keyof typeof ONNX_ATTENTION.inputs;

/** The operator's input in a role ('' when absent). */
const at = (node: FusedSite['node'], role: Role): string => inputOf(ONNX_ATTENTION, node, role);

export const ONNX_EXPANSION_COST = 'node expanded into its definition (the factor on the logits after the cap): the attention '
  + 'runs as plain ops, with the [B, N, S, T] logits materialised as the fused kernel does not';

export function expandOnnxAttention(b: Builder, shapes: Shapes, site: FusedSite, p: ExpansionParams, opset: number,
  keysOnly: boolean): InsertedFused & { mode: NMode } {
  const node = site.node;
  const input = (role: Role): string | undefined => at(node, role) || undefined;
  const output = (role: keyof typeof ONNX_ATTENTION.outputs): string => outputOf(ONNX_ATTENTION, node, role);
  const dtype = site.queryType ?? DataType.FLOAT;
  const precision = attrInt(node, 'softmax_precision') || dtype;
  const threeD = shapes.rank(at(node, 'Q')) === 3;
  const maskRank = input('attn_mask') ? shapes.rank(at(node, 'attn_mask')) : undefined;
  b.editor.remove(node);
  const heads = (x: string, attr: string, name: string): string => (threeD
    ? b.op('Transpose', [b.op('Reshape', [x, b.int64(`${name}_view`, [0, 0, attrInt(node, attr)!, -1])], {}, `${name}_4d`)], { perm: [0, 2, 1, 3] }, name)
    : x);
  const q = heads(at(node, 'Q'), 'q_num_heads', 'q_heads');
  const keys = cached(b, heads(at(node, 'K'), 'kv_num_heads', 'k_heads'), input('past_key'), output('present_key'));
  const values = cached(b, heads(at(node, 'V'), 'kv_num_heads', 'v_heads'), input('past_value'), output('present_value'));
  const scaled = b.op('Mul', [q, scaleOf(b, node, q, dtype)], {}, 'q_scaled');
  let qk = b.op('MatMul', [scaled, b.op('Transpose', [repeatHeads(b, keys, q)], { perm: [0, 1, 3, 2] }, 'k_t')], {}, 'qk');
  if (precision !== dtype) qk = b.op('Cast', [qk], { to: precision }, 'qk_precise');
  const cap = attrFloat(node, 'softcap') ?? 0;
  const capped = cap ? b.op('Mul', [b.op('Tanh', [b.op('Div', [qk, b.constant('softcap', precision, [], [cap])], {}, 'qk_over_cap')], {}, 'qk_tanh'),
    b.constant('softcap', precision, [], [cap])], {}, 'qk_capped') : qk;
  const bias = biasOf(b, node, q, keys, maskRank, precision, input('past_key') !== undefined);
  const rows = nVisible(b, keysOnly ? undefined : bias, keys);
  const factor = p.sName ? presetFactor(b, p.preset, p.sName, rows.n, rows.ln) : undefined;
  const applied = factor ? applyFactor(b, capped, factor, precision, opset) : undefined;
  let content = applied?.output ?? capped;
  if (p.theta) {
    const dim = (x: string, axis: number, name: string): string => b.op('Gather', [b.op('Shape', [x]), b.int64(`axis${axis}`, [axis], true)], {}, name);
    const S = dim(q, 2, 'q_len'), T = dim(keys, 2, 'kv_len');
    content = b.op('Add', [content, fusedPrior(b, p.theta, { S, T, past: b.op('Sub', [T, S], {}, 'past') }, factor, precision)], {}, PART.logitsPrior);
  }
  const logits = bias ? b.op('Add', [content, bias], {}, 'logits') : content;
  let probs = b.op('Softmax', [logits], { axis: -1 }, PART.probs);
  if (bias) {
    const hidden = b.op('Equal', [b.op('ReduceMax', [bias], { axes: [-1], keepdims: 1 }, 'bias_row_max'), b.constant('minus_inf', precision, [], [-Infinity])], {}, 'row_all_masked');
    probs = b.op('Where', [hidden, b.constant('zero_p', precision, [], [0]), probs], {}, 'probs_safe');
  }
  const out = (x: string): string => (precision !== dtype ? b.op('Cast', [x], { to: dtype }, 'back') : x);
  const y = b.op('MatMul', [out(probs), repeatHeads(b, values, q)], {}, 'y');
  if (threeD) b.node('Reshape', [b.op('Transpose', [y], { perm: [0, 2, 1, 3] }, 'y_t'), b.int64('merge_heads', [0, 0, -1])], [output('Y')]);
  else b.node('Identity', [y], [output('Y')]);
  if (output('qk_matmul_output')) {
    const mode = attrInt(node, 'qk_matmul_output_mode') ?? 0;
    b.node('Identity', [out([qk, capped, logits, probs][Math.min(Math.max(mode, 0), 3)])], [output('qk_matmul_output')]);
  }
  return {
    factor: applied?.output ?? '', apply: applied?.apply ?? '', factorType: applied?.factorType ?? precision, rows,
    mode: keysOnly ? 'keys' : modeOf(node, input('attn_mask') !== undefined),
  };
}

function modeOf(node: FusedSite['node'], mask: boolean): NMode {
  const causal = (attrInt(node, 'is_causal') ?? 0) === 1;
  const nonpad = Boolean(at(node, 'nonpad_kv_seqlen'));
  if (mask) return 'mask';
  if (causal) return nonpad ? 'causal-padding' : 'causal';
  return nonpad ? 'padding' : 'keys';
}

/** Past followed by the new ones, written to the operator's present output when it has one. */
function cached(b: Builder, current: string, past: string | undefined, present: string | undefined): string {
  if (!past && !present) return current;
  const out = present || b.graph.uniqueName(`${b.prefix}present`);
  if (past) b.node('Concat', [past, current], [out], { axis: 2 });
  else b.node('Identity', [current], [out]);
  return out;
}

/** K or V [B, Nkv, T, ·] with each head repeated Nq / Nkv times, as Q's heads need them. */
function repeatHeads(b: Builder, x: string, q: string): string {
  const dims = (t: string, name: string): string => b.op('Shape', [t], {}, name);
  const part = (shape: string, from: number, to: number, name: string): string => b.op('Slice', [shape, b.int64('from', [from]), b.int64('to', [to])], {}, name);
  const xs = dims(x, 'kv_shape');
  const group = b.op('Div', [part(dims(q, 'q_shape'), 1, 2, 'q_heads_n'), part(xs, 1, 2, 'kv_heads_n')], {}, 'group');
  const wide = b.op('Concat', [part(xs, 0, 2, 'batch_heads'), group, part(xs, 2, 4, 'len_size')], { axis: 0 }, 'group_shape');
  const grouped = b.op('Expand', [b.op('Unsqueeze', [x], { axes: [2] }, 'kv_5d'), wide], {}, 'kv_grouped');
  const merged = b.op('Concat', [part(xs, 0, 1, 'batch'), b.int64('minus_one', [-1]), part(xs, 2, 4, 'len_size')], { axis: 0 }, 'merged_shape');
  return b.op('Reshape', [grouped, merged], {}, 'kv_repeated');
}

/** The operator's scale, else 1/√H with H Q's head size, as Q's type. */
function scaleOf(b: Builder, node: FusedSite['node'], q: string, dtype: number): string {
  const given = attrFloat(node, 'scale');
  if (given) return b.constant('scale', dtype, [], [given]);
  const size = b.op('Cast', [b.op('Gather', [b.op('Shape', [q]), b.int64('axis3', [3], true)], {}, 'head_size')], { to: DataType.FLOAT }, 'head_size_f');
  return b.op('Cast', [b.op('Reciprocal', [b.op('Sqrt', [size], {}, 'sqrt_head_size')], {}, 'scale_f')], { to: dtype }, 'scale');
}

/** attn_mask (padded to the key count), the causal mask and nonpad_kv_seqlen, added up; undefined when none. */
function biasOf(b: Builder, node: FusedSite['node'], q: string, keys: string, maskRank: number | undefined, t: number, hasPast: boolean): string | undefined {
  const parts: string[] = [];
  const inf = (): string => b.constant('minus_inf', t, [], [-Infinity]);
  const zero = (): string => b.constant('zero_t', t, [], [0]);
  const dim = (x: string, axis: number, name: string): string => b.op('Gather', [b.op('Shape', [x]), b.int64(`axis${axis}`, [axis], true)], {}, name);
  const S = dim(q, 2, 'q_len');
  const T = dim(keys, 2, 'kv_len');
  const keyPos = b.op('Range', [b.int64('zero', [0], true), T, b.int64('one', [1], true)], {}, 'key_pos');
  const mask = at(node, 'attn_mask'), lengths = at(node, 'nonpad_kv_seqlen');
  if (mask && maskRank !== undefined) parts.push(maskBias(b, mask, maskRank, T, t, inf, zero));
  const nonpad = lengths ? b.op('Reshape', [lengths, b.int64('column4', [-1, 1, 1, 1])], {}, 'nonpad') : undefined;
  if ((attrInt(node, 'is_causal') ?? 0) === 1) {
    // Key j is visible to row i when j ≤ i + offset: the past length, or per item nonpad − S with a static cache.
    const offset = !hasPast && nonpad ? b.op('Sub', [nonpad, S], {}, 'causal_offset') : hasPast ? b.op('Sub', [T, S], {}, 'past_len') : b.int64('zero', [0], true);
    const rows = b.op('Unsqueeze', [b.op('Range', [b.int64('zero', [0], true), S, b.int64('one', [1], true)], {}, 'row_pos')], { axes: [1] }, 'row_col');
    const allowed = b.op('LessOrEqual', [keyPos, b.op('Add', [rows, offset], {}, 'row_limit')], {}, 'causal_keep');
    parts.push(b.op('Where', [allowed, zero(), inf()], {}, 'causal_bias'));
  }
  if (nonpad) parts.push(b.op('Where', [b.op('Less', [keyPos, nonpad], {}, 'nonpad_keep'), zero(), inf()], {}, 'nonpad_bias'));
  return parts.reduce<string | undefined>((acc, x) => (acc ? b.op('Add', [acc, x], {}, 'bias') : x), undefined);
}

/** attn_mask as an additive bias in type `t`: bool → 0 / −inf, padded with −inf to the key count. */
function maskBias(b: Builder, mask: string, rank: number, T: string, t: number, inf: () => string, zero: () => string): string {
  const width = b.op('Gather', [b.op('Shape', [mask]), b.int64('last', [-1], true)], {}, 'mask_width');
  const missing = b.op('Reshape', [b.op('Sub', [T, width], {}, 'mask_short'), b.int64('one_dim', [1])], {}, 'mask_pad');
  const pads = b.op('Concat', [b.int64('pads_zero', new Array(2 * rank - 1).fill(0)), missing], { axis: 0 }, 'pads');
  const padded = b.op('Pad', [mask, pads], {}, 'mask_padded'); // pads with 0: false, or a 0 bias fixed below
  if (b.graph.elemType(mask) === DataType.BOOL) return b.op('Where', [padded, zero(), inf()], {}, 'mask_bias');
  // Float masks: the padded keys get −inf, as the operator pads them.
  const inside = b.op('Less', [b.op('Range', [b.int64('zero', [0], true), T, b.int64('one', [1], true)], {}, 'key_pos_m'), width], {}, 'mask_inside');
  return b.op('Where', [inside, b.op('Cast', [padded], { to: t }, 'mask_t'), inf()], {}, 'mask_bias');
}

/**
 * max(n, 1) and its logarithm: the keys each row may see under the bias (entries less than HIDDEN_GAP below the row's
 * largest), or Tk.
 */
function nVisible(b: Builder, bias: string | undefined, keys: string): Rows {
  let n: string;
  if (bias) {
    const limit = b.op('Sub', [extremeLastAxis(b, bias, 'ReduceMax', 'bias_row_max'),
      b.op('CastLike', [b.constant('hidden_gap', DataType.FLOAT, [], [HIDDEN_GAP]), bias], {}, 'hidden_gap_t')], {}, 'hidden_below');
    const visible = b.op('Cast', [b.op('Greater', [bias, limit], {}, 'visible')], { to: DataType.FLOAT }, 'visible_f');
    n = b.op('ReduceSum', [visible], { axes: [-1], keepdims: 1 }, 'n_visible');
  } else n = b.op('Cast', [b.op('Gather', [b.op('Shape', [keys]), b.int64('axis2', [2], true)], {}, 'kv_len')], { to: DataType.FLOAT }, 'n_keys');
  const clamped = b.op('Max', [n, b.constant('one_f', DataType.FLOAT, [], [1])], {}, 'n_at_least_1');
  return { n: clamped, ln: b.op('Log', [clamped], {}, 'ln_n') };
}
