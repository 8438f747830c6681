/**
 * Fused attention operators (com.microsoft MultiHeadAttention, GroupQueryAttention, DecoderMaskedMultiHeadAttention,
 * Attention; ONNX Attention from opset 23), one rule each: the Softmax is inside the kernel, so the SSMax factor
 * goes on the query (scaling query row i by c_i scales logits row i by c_i, also through RoPE, which is linear).
 * Each rule says where the query is, how n is read from the operator's inputs, and where the equivalence breaks
 * (a deviation: refused unless the user forces the site).
 */
import { attrFloat, attrInt, attrInts } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { Shapes } from '../graph/shapes';
import { NodeProto } from '../io/onnx';
import { isApplyNode, isPatchNode } from '../rewrite/identity';
import { declaredDim, HeadInfo } from './heads';
import { classifyMasks, MaskVerdict } from './mask';
import type { Rule } from './rules';

/** Where the query is and how its rows and heads are laid out. */
export type QueryPlan =
  /** [B, S, N·H]; `bias`: an input whose first N·H entries the kernel adds to the query. */
  | { layout: 'bsd'; input: number; bias?: number }
  /** [B, N, S, H] (ONNX Attention with 4-D inputs). */
  | { layout: 'bnsd'; input: number }
  /** MultiHeadAttention packed QKV [B, S, N, 3, H]: the query is index 0 of axis 3. */
  | { layout: 'bsn3h'; input: number }
  /** Packed QKV [B, S, W]: the query is the first qParts/parts of W (GQA: N of N + 2·Nkv; DMMHA: 1 of 3). */
  | { layout: 'packed'; input: number; qParts: number; parts: number; bias?: number }
  /**
   * com.microsoft Attention computes Q = input·W[:, :hidden] + bias[:hidden] inside: scaling the query columns of
   * `weights` (and `bias`) gives one factor per head, the same for every row (exact for n = Tk). Any other n takes
   * the node expanded (rewrite/ms-attention.ts), unless `expandable` is false (Q is rotated inside the kernel).
   */
  | { layout: 'weights'; weights: number; bias?: number; qWidth?: number; expandable: boolean };

/** One term of a sequence length: a dimension of an input, or the value of a scalar integer input. */
export type Term = { input: number; axis: number } | { input: number; value: true };

export type NPlan =
  /** n = Tk for every row. */
  | { kind: 'keys'; tk: Term[] }
  /** n_i = Tk − S + i + 1 (bottom-right aligned causal mask, right for KV-cache decoding). */
  | { kind: 'causal'; tk: Term[] }
  /** n_i = P + i + 1 with P the cached length (ONNX Attention's is_causal: row i sees keys ≤ i + P). */
  | { kind: 'causal-offset'; tk: Term[]; offset: Term[] }
  /**
   * Per-batch total lengths from an input (GQA: seqlens_k + 1; ONNX Attention: nonpad_kv_seqlen).
   * causal: n_{b,i} = past_b + i + 1 with past_b = T_b − S, or 0 while GQA processes the first prompt;
   * window: at most `window` keys (GQA local_window_size). Otherwise n_b = T_b.
   */
  | { kind: 'lengths'; lengths: number; plusOne: boolean; causal: boolean; promptTotal?: number; window?: number }
  /**
   * com.microsoft Attention: n_{b,i} = the keys row i of item b may see under `mask` (mask_index, any format the
   * operator accepts) and, when `causal`, at or before its position P + i (`unidirectional`: the kernel itself
   * masks them). Counted outside the kernel, so the node is expanded. `tk`: the key count, for n = Tk instead.
   */
  | { kind: 'mask-index'; causal: boolean; unidirectional: boolean; mask?: number; maskRank?: number; tk: Term[] };

export type FusedOp = 'com.microsoft.MultiHeadAttention' | 'com.microsoft.GroupQueryAttention'
  | 'com.microsoft.DecoderMaskedMultiHeadAttention' | 'com.microsoft.Attention' | 'Attention';

export interface FusedSite {
  /** 0-based, in graph order within its scope (shared with the Softmax sites). */
  layer: number;
  scope: string;
  /** The detection rule that matched (rules.ts). */
  rule: string;
  node: NodeProto; op: FusedOp; heads: HeadInfo; mask: MaskVerdict; query: QueryPlan; n: NPlan;
  /** The query length S: a dimension of an input. */
  queryLength: { input: number; axis: number };
  /** Element type of the query (or weights), when known. */
  queryType?: number;
  /** Why SSMax on the query is not exactly SSMax on the kernel's logits; set sites are refused unless forced. */
  deviation?: string;
  /** Set when a deviation was accepted with --force-site. */
  forced?: boolean;
  /** The inserted node that applies an earlier run's factor, when the site is already patched. */
  patchedBy?: NodeProto;
  /**
   * Why the factor cannot go on the operator's inputs, so the node is expanded into its definition and the factor
   * put on the logits there (ONNX Attention: softcap, a qk_matmul_output that shows the logits before the factor).
   */
  expand?: string;
}

export type FusedMatch = Omit<FusedSite, 'layer' | 'scope' | 'rule'>;

const MS = 'com.microsoft';

/** Attention operators this tool recognises but cannot patch, with the reason. */
const unsupported: Record<string, string> = {
  PackedAttention: 'packed (padding-free) token layout, Q computed inside: not handled yet; patch the model before packing (onnxruntime\'s optimizer) instead',
  PackedMultiHeadAttention: 'packed (padding-free) token layout: not handled yet; patch the model before packing (onnxruntime\'s optimizer) instead',
  SparseAttention: 'block-sparse kernel: n is the number of keys its block layout leaves, which the tool does not reproduce; patch the dense model instead',
  PagedAttention: 'paged KV cache: n needs the block tables',
  LongformerAttention: 'sliding-window plus global attention: n differs per row in ways the inputs do not state',
  QAttention: 'quantized kernel (int8 query weights): patch the float model, then quantize it',
  QOrderedAttention: 'quantized kernel (int8 query weights): patch the float model, then quantize it',
  QOrderedLongformerAttention: 'quantized kernel (int8 query weights): patch the float model, then quantize it',
  DecoderAttention: 'legacy DecoderAttention: Q is computed inside from weights with a per-step cache layout',
  DecoderMaskedSelfAttention: 'Q is computed inside from weights with a shared cache buffer',
  FlexAttention: 'onnxruntime has no kernel for it, so a patch could not be checked against the original, and its score_mod may change '
    + 'the logits arbitrarily; expand it into its function body (the model\'s `_expanded` form, or onnx\'s function inliner) and patch that: '
    + 'the plain-op rules put the factor on the content logits there',
};

type Matcher = (ctx: Scope, node: NodeProto) => Omit<FusedMatch, 'queryType'> | { reason: string };

/** A fused-operator rule: the operator's matcher, then its deviation from exact SSMax refused unless forced. */
const fusedRule = (name: string, applies: Rule['applies'], matcher: Matcher): Rule => ({
  name, applies,
  match: (ctx, node) => {
    const m = matcher(ctx.scope, node);
    if ('reason' in m) return { at: node, reason: m.reason, steps: 0, attention: true };
    if (m.deviation && !ctx.forced) return { at: node, reason: `${m.op.replace(`${MS}.`, '')}: ${m.deviation}`, steps: 1, attention: true, forcible: true };
    const query = node.input[m.query.layout === 'weights' ? m.query.weights : m.query.input];
    // An earlier run's factor on the query: the first inserted `apply` node up its chain of inserted nodes.
    const patchedBy = ctx.scope.graph.query.first('ssmax-apply', query, (_t, p) => (!p || !isPatchNode(p) ? null
      : isApplyNode(p) ? p : undefined));
    const queryType = ctx.scope.shapes.type(query) ?? fusedElementType(ctx.scope.shapes, node);
    return { kind: 'fused', site: { ...m, queryType, forced: Boolean(m.deviation), patchedBy } };
  },
});

/**
 * The element type T of a fused attention operator: inputs 0-2 of every operator here (query, key, value; input,
 * weights, bias) share it, so any of them tells it when another comes from an op of unknown output type.
 */
export function fusedElementType(shapes: Shapes, node: NodeProto): number | undefined {
  return node.input.slice(0, 3).map((i) => shapes.type(i)).find((t) => t !== undefined);
}

const ms = (op: string) => (node: NodeProto): boolean => node.domain === MS && node.opType === op;

export const msMultiHead = fusedRule('fused/ms-multihead', ms('MultiHeadAttention'), multiHead);
export const msGqa = fusedRule('fused/ms-gqa', ms('GroupQueryAttention'), groupQuery);
export const msDmmha = fusedRule('fused/ms-dmmha', ms('DecoderMaskedMultiHeadAttention'), decoderMasked);
export const msAttention = fusedRule('fused/ms-attention', ms('Attention'), msAttentionOp);
export const onnxAttention = fusedRule('fused/onnx-attention',
  (node, ctx) => node.opType === 'Attention' && (node.domain === '' || node.domain === 'ai.onnx') && ctx.scope.opset >= 23, onnxAttentionOp);
/** Attention operators of other domains this tool recognises but cannot patch: refused with the reason. */
export const unsupportedFused = fusedRule('fused/unsupported',
  (node) => node.domain !== '' && node.domain !== 'ai.onnx' && node.opType in unsupported,
  (_ctx, node) => ({ reason: `fused ${node.opType}: not patched (${unsupported[node.opType]})` }));

const present = (node: NodeProto, i: number): boolean => Boolean(node.input[i]);
const rankOf = (ctx: Scope, node: NodeProto, i: number): number | undefined => (present(node, i) ? ctx.shapes.rank(node.input[i]) : undefined);

function headsFromAttr(node: NodeProto, name: string): HeadInfo {
  const h = attrInt(node, name);
  return h && h > 0 ? { heads: h, axis: 1, reason: `${name}=${h} attribute` } : { axis: 1, reason: `no ${name} attribute` };
}

const masksOf = (ctx: Scope, node: NodeProto, inputs: number[], why: string): MaskVerdict =>
  classifyMasks(ctx.graph, inputs.filter((i) => present(node, i)).map((i) => node.input[i]), `no mask (${why})`);

/**
 * com.microsoft MultiHeadAttention: query [B,S,N·H] (bias added inside) or packed QKV [B,S,N,3,H]; keys from
 * key [B,L,·] / [B,N,L,H] (cross attention on cached keys) / packed KV [B,L,N,2,H], plus past_key [B,N,P,H].
 */
function multiHead(ctx: Scope, node: NodeProto): ReturnType<Matcher> {
  const qRank = rankOf(ctx, node, 0);
  const packed = !present(node, 1) || qRank === 5;
  if (packed && qRank !== undefined && qRank !== 5) return { reason: 'MultiHeadAttention without key: expected packed QKV of rank 5' };
  if (packed && present(node, 3)) return { reason: 'MultiHeadAttention: bias with packed QKV is not handled' };
  const kRank = rankOf(ctx, node, 1);
  let kv: Term;
  if (packed) kv = { input: 0, axis: 1 };
  else if (kRank === 4) kv = { input: 1, axis: 2 };
  else if (kRank === 3 || kRank === 5) kv = { input: 1, axis: 1 };
  else return { reason: 'MultiHeadAttention: rank of key unknown, cannot tell its sequence axis' };
  const tk: Term[] = [kv];
  if (present(node, 8)) tk.push({ input: 8, value: true });
  else if (present(node, 6)) tk.push({ input: 6, axis: 2 });
  const mask = attrInt(node, 'unidirectional') === 1
    ? { causal: true, reason: 'causal: unidirectional=1' } : masksOf(ctx, node, [4, 5], 'no key_padding_mask or attention_bias');
  const deviation = kRank === 4 && present(node, 6) ? 'past_key given with 4-D key: the key length is ambiguous' : undefined;
  return {
    node, op: 'com.microsoft.MultiHeadAttention', heads: headsFromAttr(node, 'num_heads'), mask,
    query: packed ? { layout: 'bsn3h', input: 0 } : { layout: 'bsd', input: 0, bias: present(node, 3) ? 3 : undefined },
    n: mask.causal ? { kind: 'causal', tk } : { kind: 'keys', tk },
    queryLength: { input: 0, axis: 1 }, deviation,
  };
}

/**
 * com.microsoft GroupQueryAttention: n from seqlens_k (total − 1 per batch entry) and total_sequence_length,
 * never from the cache buffer's shape (which may be a shared max-length buffer).
 */
function groupQuery(ctx: Scope, node: NodeProto): ReturnType<Matcher> {
  const heads = headsFromAttr(node, 'num_heads');
  const kvHeads = attrInt(node, 'kv_num_heads') ?? 0;
  const packed = !present(node, 1);
  if (packed && (!heads.heads || kvHeads <= 0)) return { reason: 'GroupQueryAttention packed QKV without num_heads/kv_num_heads' };
  const deviations: string[] = [];
  const softcap = attrFloat(node, 'softcap') ?? 0;
  if (softcap !== 0) deviations.push(`softcap=${softcap}: tanh capping after the factor is not SSMax`);
  const sink = attrInt(node, 'smooth_softmax') === 1 || present(node, 11);
  if (sink) deviations.push('attention sink (smooth_softmax / head_sink): the extra softmax term is not scaled with n');
  const qNorm = present(node, 14) || present(node, 15);
  if (qNorm) deviations.push('q_norm_weight: the kernel RMS-normalises Q after the point where the factor goes, undoing it');
  const causal = (attrInt(node, 'causal') ?? 1) === 1;
  const window = attrInt(node, 'local_window_size') ?? -1;
  const mask: MaskVerdict = causal ? { causal: true, reason: `causal: GroupQueryAttention${window > 0 ? ` with local_window_size=${window}` : ''}` }
    : masksOf(ctx, node, [10], 'causal=0');
  return {
    node, op: 'com.microsoft.GroupQueryAttention', heads, mask,
    query: packed ? { layout: 'packed', input: 0, qParts: heads.heads!, parts: heads.heads! + 2 * kvHeads } : { layout: 'bsd', input: 0 },
    n: { kind: 'lengths', lengths: 5, plusOne: true, causal, promptTotal: 6, window: window > 0 ? window : undefined },
    queryLength: { input: 0, axis: 1 },
    deviation: deviations.length ? deviations.join('; ') : undefined,
  };
}

/** com.microsoft DecoderMaskedMultiHeadAttention: one query token; self attention over past + 1, or cross attention. */
function decoderMasked(ctx: Scope, node: NodeProto): ReturnType<Matcher> {
  const packed = !present(node, 1);
  const kRank = rankOf(ctx, node, 1);
  const cross = !packed && (kRank === 4 || (kRank === undefined && !present(node, 5)));
  const share = attrInt(node, 'past_present_share_buffer') === 1;
  let tk: Term[];
  if (cross) tk = [{ input: 1, axis: 2 }];
  else if (share && present(node, 7)) tk = [{ input: 7, value: true }, { input: 0, axis: 1 }];
  else if (share) tk = [{ input: 5, axis: 2 }, { input: 0, axis: 1 }];
  else tk = [...(present(node, 5) ? [{ input: 5, axis: 2 }] : []), { input: 0, axis: 1 }];
  const deviation = !cross && share && !present(node, 7)
    ? 'shared past/present buffer without past_sequence_length: its length is not the sequence length' : undefined;
  return {
    node, op: 'com.microsoft.DecoderMaskedMultiHeadAttention', heads: headsFromAttr(node, 'num_heads'),
    mask: masksOf(ctx, node, [3, 4], 'one query token attends to every cached key'),
    query: packed
      ? { layout: 'packed', input: 0, qParts: 1, parts: 3, bias: present(node, 10) ? 10 : undefined }
      : { layout: 'bsd', input: 0, bias: present(node, 10) ? 10 : undefined },
    // One query token: causal and keys give the same n = Tk.
    n: { kind: 'keys', tk }, queryLength: { input: 0, axis: 1 }, deviation,
  };
}

/**
 * com.microsoft Attention: Q = input·weights[:, :hidden] + bias[:hidden] is computed inside. Without a mask and
 * without causal masking every row sees n = Tk keys: scaling the query columns of weights and bias is exact. A
 * causal or masked node needs n per row and per item: it is expanded into its projection and MultiHeadAttention.
 */
function msAttentionOp(ctx: Scope, node: NodeProto): ReturnType<Matcher> {
  const share = attrInt(node, 'past_present_share_buffer') === 1;
  if (present(node, 6) && !share) {
    return { reason: 'com.microsoft Attention with input 6 (separate key, or past_sequence_length without a shared buffer) is not handled' };
  }
  const tk: Term[] = [{ input: 0, axis: 1 }];
  const deviations: string[] = [];
  if (share && present(node, 6)) tk.push({ input: 6, value: true });
  else if (present(node, 4)) {
    tk.push({ input: 4, axis: 3 });
    if (share) deviations.push('shared past/present buffer without past_sequence_length: its length is not the sequence length');
  }
  const unidirectional = attrInt(node, 'unidirectional') === 1;
  const mask = present(node, 3) ? 3 : undefined;
  const maskRank = mask === undefined ? undefined : rankOf(ctx, node, mask);
  if (mask !== undefined && (maskRank === undefined || maskRank < 1 || maskRank > 4)) {
    return { reason: 'com.microsoft Attention: mask_index of unknown rank, so its format (lengths, raw 2-D, 3-D, 4-D) cannot be told' };
  }
  if (maskRank === 4 && unidirectional) return { reason: 'com.microsoft Attention: a 4-D (Megatron) mask_index with unidirectional=1 is invalid for this operator' };
  const rotary = attrInt(node, 'do_rotary') === 1;
  const perRow = unidirectional || mask !== undefined;
  if (perRow && rotary) {
    deviations.push(`do_rotary=1 with ${unidirectional ? 'causal masking' : 'a mask_index'}: the kernel rotates Q after projecting it, so Q cannot `
      + 'leave the node and n per row is impossible; forced, every row gets n = Tk (fuse to MultiHeadAttention + RotaryEmbedding instead)');
  }
  const sizes = attrInts(node, 'qkv_hidden_sizes');
  const n: NPlan = perRow && !rotary ? { kind: 'mask-index', causal: unidirectional, unidirectional, mask, maskRank, tk } : { kind: 'keys', tk };
  const why = unidirectional ? `causal: unidirectional=1${mask !== undefined ? ` and a mask_index of rank ${maskRank}` : ''}`
    : mask !== undefined ? `mask_index of rank ${maskRank}: n counts the keys it leaves visible` : 'no mask_index';
  return {
    node, op: 'com.microsoft.Attention', heads: headsFromAttr(node, 'num_heads'), mask: { causal: unidirectional, reason: why },
    query: { layout: 'weights', weights: 1, bias: present(node, 2) ? 2 : undefined, qWidth: sizes?.[0], expandable: !rotary },
    n, queryLength: { input: 0, axis: 1 },
    deviation: deviations.length ? deviations.join('; ') : undefined,
  };
}

/** ONNX Attention (opset 23+): 3-D [B,S,N·H] with q_num_heads, or 4-D [B,N,S,H] inputs. */
function onnxAttentionOp(ctx: Scope, node: NodeProto): ReturnType<Matcher> {
  const qRank = rankOf(ctx, node, 0);
  const kRank = rankOf(ctx, node, 1);
  if (qRank !== 3 && qRank !== 4) return { reason: 'ONNX Attention: rank of Q unknown (3-D or 4-D layout cannot be told)' };
  if (kRank !== 3 && kRank !== 4) return { reason: 'ONNX Attention: rank of K unknown' };
  const softcap = attrFloat(node, 'softcap') ?? 0;
  const mode = attrInt(node, 'qk_matmul_output_mode') ?? 0;
  // onnxruntime 1.30's qk_matmul_output: 0 the scaled Q·Kᵀ, 1 after softcap, 2 after the mask, 3 the probabilities.
  const expand = softcap !== 0 ? `softcap=${softcap}: the cap comes after a factor on Q, so the factor goes after it in the expanded node`
    : node.output[3] && mode <= 1 ? `qk_matmul_output_mode=${mode} outputs the logits before the mask, which a factor on Q would change` : undefined;
  const h = declaredDim(ctx.graph, node.input[0], 1);
  const heads: HeadInfo = qRank === 3 ? headsFromAttr(node, 'q_num_heads')
    : h ? { heads: h, axis: 1, reason: `declared shape of Q has ${h} heads at axis 1` } : { axis: 1, reason: 'heads are axis 1 of Q; its size is not declared' };
  const tk: Term[] = [{ input: 1, axis: kRank === 3 ? 1 : 2 }];
  if (present(node, 4)) tk.push({ input: 4, axis: 2 });
  const isCausal = attrInt(node, 'is_causal') === 1;
  const mask: MaskVerdict = isCausal ? { causal: true, reason: 'causal: is_causal=1' } : masksOf(ctx, node, [3], 'no attn_mask');
  let n: NPlan;
  if (present(node, 6)) n = { kind: 'lengths', lengths: 6, plusOne: false, causal: mask.causal };
  else if (isCausal) n = { kind: 'causal-offset', tk, offset: present(node, 4) ? [{ input: 4, axis: 2 }] : [] };
  else n = mask.causal ? { kind: 'causal', tk } : { kind: 'keys', tk };
  return {
    node, op: 'Attention', heads, mask, n, expand,
    query: qRank === 3 ? { layout: 'bsd', input: 0 } : { layout: 'bnsd', input: 0 },
    queryLength: { input: 0, axis: qRank === 3 ? 1 : 2 },
  };
}
