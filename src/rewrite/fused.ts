/**
 * SSMax for fused attention operators: the factor c_i = s·ln n_i multiplies query row i before the operator
 * (scaling a query row scales that row's logits; RoPE inside the kernel is a rotation, so it commutes).
 *
 *   n       from the operator's inputs (see NPlan in graph/attention-ops), as ln n of shape [Bn, Sn]
 *           (Bn = 1 or batch, Sn = 1 or query length);
 *   c       s·ln n, with per-head s laid out along the query's head axis;
 *   query   [B,S,N·H] (×c per row, per head via a [B,S,N,H] view), [B,N,S,H], packed [B,S,N,3,H] (only the
 *           query slot), packed [B,S,W] (only the query columns), or the query columns of the weights.
 *
 * A `bias` the kernel adds to the query after our factor would not be scaled: the query part of the bias is
 * added here before the factor, and the operator gets the bias with that part set to zero.
 */
import { FusedSite } from '../detect/fused';
import { inputAt, inputOf, NPlan, opSpec, PatchedOp, Term } from '../graph/attention-ops';
import { Shapes } from '../graph/shapes';
import { makeTensor } from '../graph/tensor';
import { DataType, TensorProto } from '../io/onnx';
import { Preset } from '../policy/factor';
import { NMode } from '../policy/n-mode';
import { LayerScale } from '../policy/scale';
import { Builder } from './builder';
import { Applied, applyFactor } from './dtype';
import { presetFactor } from './factor';
import { fusedPrior, ThetaTensors } from './prior';
import { unsqueeze } from './versioned';

export interface InsertedFused {
  factor: string;
  apply: string;
  factorType: number;
  /** n and ln n of the rows, [Bn, Sn]: a prior's factor is built from them. */
  rows: Rows;
}

/** n (at least 1) and ln n per batch item and query row, float [Bn, Sn] (Bn = 1 or batch, Sn = 1 or S). */
export interface Rows { n: string; ln: string }

/** What the factor of a fused site is made of: the preset's formula, s (one, or one per head) and the rows' n. */
export interface RowFactor { preset: Preset; s: string; perHead: boolean; rows: Rows }

// Slice clamps ends to the dimension; 2^53 − 1 is the largest end a JS number writes exactly as int64.
export const INT64_MAX = Number.MAX_SAFE_INTEGER;

/** The n plan after the user's --n choice: keys turns causal plans into key counts and the reverse. */
export function planFor(site: FusedSite, mode: NMode | 'mask'): NPlan {
  const n = site.n;
  if (site.query.layout === 'weights') return weightsPlan(site.query.expandable, n, mode);
  if (n.kind === 'lengths') return { ...n, causal: mode !== 'keys' };
  if (mode === 'keys') return n.kind === 'causal' || n.kind === 'causal-offset' ? { kind: 'keys', tk: n.tk } : n;
  return n.kind === 'keys' ? { kind: 'causal', tk: n.tk } : n;
}

/**
 * com.microsoft Attention: keys on the query columns of its weights; any other n on the node expanded (unless it
 * cannot be: then keys, the only form left).
 */
function weightsPlan(expandable: boolean, n: NPlan, mode: NMode | 'mask'): NPlan {
  const tk = n.kind === 'keys' || n.kind === 'mask-index' ? n.tk : [];
  if (mode === 'keys' || !expandable) return { kind: 'keys', tk };
  if (n.kind === 'mask-index') return mode === 'causal' ? { ...n, causal: true } : n;
  return mode === 'causal' ? { kind: 'mask-index', causal: true, unidirectional: false, tk } : n;
}

/** One line on how n is computed, for the report (inputs by position, as the operator's schema numbers them). */
export function describePlan(plan: NPlan, spec: PatchedOp): string {
  const at = (role: string): number => inputAt(spec, role);
  const terms = (t: Term[]): string => t.map((x) => ('value' in x ? `value of input ${at(x.role)}` : `input ${at(x.role)} dim ${x.axis}`)).join(' + ') || '0';
  switch (plan.kind) {
    case 'keys': return `n = Tk = ${terms(plan.tk)}`;
    case 'causal': return `n_i = Tk − S + i + 1, Tk = ${terms(plan.tk)}`;
    case 'causal-offset': return `n_i = P + i + 1, P = ${terms(plan.offset)}`;
    case 'lengths': {
      const total = `T_b = input ${at(plan.lengths)}${plan.plusOne ? ' + 1' : ''}`;
      const rows = plan.causal ? `n_{b,i} = T_b − S + i + 1${plan.promptTotal !== undefined ? ' (i + 1 on the first prompt)' : ''}` : 'n_b = T_b';
      return `${rows}, ${total}${plan.window !== undefined ? `, at most ${plan.window}` : ''}`;
    }
    case 'mask-index': {
      const seen = [plan.mask !== undefined ? `left visible by mask_index (input ${at(plan.mask)}, rank ${plan.maskRank})` : '',
        plan.causal ? 'at or before the row\'s position P + i' : ''].filter(Boolean).join(' and ');
      return `n_{b,i} = keys ${seen || 'in the cache and the input'}, counted outside the node (expanded)`;
    }
  }
}

export function modeOf(plan: NPlan): NMode {
  if (plan.kind === 'mask-index') {
    if (plan.mask === undefined) return plan.causal ? 'causal' : 'keys';
    const keyPadding = (plan.maskRank ?? 4) <= 2;
    return keyPadding ? (plan.causal ? 'causal-padding' : 'padding') : 'mask';
  }
  return plan.kind === 'keys' || (plan.kind === 'lengths' && !plan.causal) ? 'keys' : 'causal';
}

/** The factor of the preset on the query (or weights) of a fused site; s is already in the graph (`sName`). */
export function insertFused(b: Builder, site: FusedSite, preset: Preset, s: LayerScale, plan: NPlan, opset: number, sName: string): InsertedFused {
  const f: RowFactor = { preset, s: sName, perHead: Array.isArray(s), rows: nRows(b, site, plan) };
  const q = site.query;
  let applied: Applied;
  switch (q.layout) {
    case 'bsd': applied = scaleQuery(b, site, inputOf(opSpec(site.op), site.node, q.input), f, q.bias, opset); break;
    case 'packed': applied = scalePacked(b, site, q, f, opset); break;
    case 'bnsd': applied = scaleBnsd(b, site, q.input, f, opset); break;
    case 'bsn3h': applied = scaleBsn3h(b, site, q.input, f, opset); break;
    case 'weights': applied = scaleWeights(b, site, q, f, opset); break;
  }
  // scaleWeights rewires the weights itself, before it scales their bias.
  if (q.layout !== 'weights') b.editor.setInput(site.node, inputAt(opSpec(site.op), q.input), applied.output);
  return { factor: applied.output, apply: applied.apply, factorType: applied.factorType, rows: f.rows };
}

/**
 * A positional prior on a fused operator through its additive bias input (attention_bias; ONNX Attention's attn_mask,
 * a bool one turned into 0 / −inf): the operator adds it to its scaled logits, after the factor on the query, so
 * it must be c·B. `f.rows` is absent for the none preset (c = 1).
 */
export function addFusedPrior(b: Builder, site: FusedSite, plan: NPlan, f: Partial<RowFactor> & { preset: Preset }, theta: ThetaTensors,
  shapes: Shapes): void {
  const dtype = (site.query.layout === 'weights' ? undefined : site.queryType) ?? DataType.FLOAT;
  const factor = f.rows && f.s ? factorBnsd(b, f as RowFactor) : undefined;
  const prior = fusedPrior(b, theta, priorPositions(b, site, plan), factor, dtype);
  const spec = opSpec(site.op);
  const index = inputAt(spec, spec.prior.input);
  let existing = site.node.input[index] || undefined;
  if (existing && spec.prior.bool && shapes.type(existing) === DataType.BOOL) {
    existing = b.op('Where', [existing, b.constant('kept', dtype, [], [0]), b.constant('hidden', dtype, [], [-Infinity])], {}, 'attn_mask_additive');
  }
  b.editor.setInput(site.node, index, existing ? b.op('Add', [existing, prior], {}, 'bias_prior') : prior);
}

/** c in the [B, H, S, 1] layout of an additive bias [B|1, H|1, S, T]: per head when s is, per row and item. */
export function factorBnsd(b: Builder, f: RowFactor): string {
  const s = f.perHead ? b.op('Reshape', [f.s, b.int64('heads_4d', [1, -1, 1, 1])], {}, 's_bnsd') : f.s;
  return presetFactor(b, f.preset, s, unsqueeze(b, f.rows.n, [1, 3], 'n_4d'), unsqueeze(b, f.rows.ln, [1, 3], 'ln_n_4d'));
}

// ---- n ---------------------------------------------------------------------------------------------------

/** A scalar int64 from a term: a dimension of one of the node's inputs, or the value of a scalar input. */
function termValue(b: Builder, site: FusedSite, t: Term): string {
  const name = inputOf(opSpec(site.op), site.node, t.role);
  if ('value' in t) return b.op('Reshape', [b.op('Cast', [name], { to: DataType.INT64 }), b.int64('scalar', [])], {}, 'len');
  return b.op('Gather', [b.op('Shape', [name]), b.int64(`axis${t.axis}`, [t.axis], true)], {}, 'len');
}

function sum(b: Builder, site: FusedSite, terms: Term[]): string {
  if (terms.length === 0) return b.int64('zero', [0], true);
  return terms.map((t) => termValue(b, site, t)).reduce((acc, v) => b.op('Add', [acc, v], {}, 'len_sum'));
}

/** n as float rows [Bn, Sn] with its logarithm. */
function withLog(b: Builder, n: string, shape: number[]): Rows {
  const rows = b.op('Reshape', [b.op('Cast', [n], { to: DataType.FLOAT }, 'n'), b.int64('rows_shape', shape)], {}, 'n_rows_f');
  return { n: rows, ln: b.op('Log', [rows], {}, 'ln_n_rows') };
}

/** n and ln n as float tensors [Bn, Sn]. */
function nRows(b: Builder, site: FusedSite, plan: NPlan): Rows {
  const one = b.int64('one', [1], true);
  const S = termValue(b, site, site.queryLength);
  const rows = (start: string): string => b.op('Range', [start, b.op('Add', [start, S], {}, 'n_end'), one], {}, 'n_rows');
  switch (plan.kind) {
    case 'keys':
      return withLog(b, sum(b, site, plan.tk), [1, 1]);
    case 'causal':
    case 'causal-offset': {
      const past = plan.kind === 'causal' ? b.op('Sub', [sum(b, site, plan.tk), S], {}, 'past') : sum(b, site, plan.offset);
      return withLog(b, rows(b.op('Add', [past, one], {}, 'n_first')), [1, -1]);
    }
    case 'lengths':
      return nFromLengths(b, site, plan, S, one);
    case 'mask-index':
      throw new Error('mask-index n is built by rewrite/ms-attention.ts');
  }
}

/**
 * Per-batch lengths T_b: n_b = T_b, or causal n_{b,i} = past_b + i + 1, clamped to ≥ 1 and to the window
 * (onnxruntime 1.30's GroupQueryAttention lets row i see keys i − W + 1 … i: W keys, self included).
 */
function nFromLengths(b: Builder, site: FusedSite, plan: LengthsPlan, S: string, one: string): Rows {
  const column = b.int64('column', [-1, 1]);
  let n: string;
  if (!plan.causal) n = b.op('Reshape', [totalOf(b, site, plan, one), column], {}, 'n_batch');
  else {
    const positions = b.op('Range', [one, b.op('Add', [S, one], {}, 'n_end'), one], {}, 'positions');
    n = b.op('Add', [b.op('Reshape', [pastOf(b, site, plan, S, one), column]), b.op('Unsqueeze', [positions], { axes: [0] }, 'positions_row')], {}, 'n_rows');
  }
  let nf = b.op('Cast', [n], { to: DataType.FLOAT }, 'n');
  if (plan.window !== undefined) nf = b.op('Min', [nf, b.constant('window', DataType.FLOAT, [], [plan.window])], {}, 'n_window');
  // Rows before the first visible key (n ≤ 0) see nothing; factor 0 there instead of ln 0 = −inf.
  nf = b.op('Max', [nf, b.constant('one_f', DataType.FLOAT, [], [1])], {}, 'n_clamped');
  return { n: nf, ln: b.op('Log', [nf], {}, 'ln_n_rows') };
}

type LengthsPlan = Extract<NPlan, { kind: 'lengths' }>;

/** T_b: the keys item b has in total (GroupQueryAttention: seqlens_k + 1; ONNX Attention: nonpad_kv_seqlen). */
function totalOf(b: Builder, site: FusedSite, plan: LengthsPlan, one: string): string {
  const total = b.op('Cast', [inputOf(opSpec(site.op), site.node, plan.lengths)], { to: DataType.INT64 }, 'total');
  return plan.plusOne ? b.op('Add', [total, one], {}, 'total') : total;
}

/** past_b = T_b − S, the absolute position of item b's first query row; 0 while GroupQueryAttention processes the first prompt. */
function pastOf(b: Builder, site: FusedSite, plan: LengthsPlan, S: string, one: string): string {
  let past = b.op('Sub', [totalOf(b, site, plan, one), S], {}, 'past');
  if (plan.promptTotal !== undefined) {
    // GroupQueryAttention's first prompt (S equals total_sequence_length) starts at position 0 in every row.
    const maxTotal = b.op('Reshape', [b.op('Cast', [inputOf(opSpec(site.op), site.node, plan.promptTotal)], { to: DataType.INT64 }), b.int64('scalar', [])], {}, 'max_total');
    const prompt = b.op('Equal', [S, maxTotal], {}, 'first_prompt');
    past = b.op('Where', [prompt, b.int64('zero', [0], true), past], {}, 'past');
  }
  return past;
}

/**
 * Where a prior goes on a fused site: S query rows, T keys along the bias's last axis, and the absolute position of
 * each item's first row (T − S when every item has the same keys; per item from the lengths otherwise).
 */
export function priorPositions(b: Builder, site: FusedSite, plan: NPlan): { S: string; T: string; past: string } {
  const one = b.int64('one', [1], true);
  const S = termValue(b, site, site.queryLength);
  if (plan.kind === 'lengths') {
    const T = plan.promptTotal !== undefined
      ? b.op('Reshape', [b.op('Cast', [inputOf(opSpec(site.op), site.node, plan.promptTotal)], { to: DataType.INT64 }), b.int64('scalar', [])], {}, 'bias_keys')
      : sum(b, site, plan.keys ?? []);
    return { S, T, past: pastOf(b, site, plan, S, one) };
  }
  if (plan.kind === 'mask-index') throw new Error('the expanded operator places its prior itself');
  const T = sum(b, site, plan.tk);
  return { S, T, past: plan.kind === 'causal-offset' ? sum(b, site, plan.offset) : b.op('Sub', [T, S], {}, 'past') };
}

// ---- c and the query -------------------------------------------------------------------------------------

/** c for a [B,S,N,·] view: [Bn,Sn,N,1] per head, [Bn,Sn,1] (whole rows) for one s. */
function factorRowsHeads(b: Builder, f: RowFactor): string {
  if (!f.perHead) return unsqueeze(b, presetFactor(b, f.preset, f.s, f.rows.n, f.rows.ln), [2], 'factor_rows');
  const sHeads = b.op('Reshape', [f.s, b.int64('heads_col', [-1, 1])], {}, 's_heads');
  return presetFactor(b, f.preset, sHeads, unsqueeze(b, f.rows.n, [2, 3], 'n_4d'), unsqueeze(b, f.rows.ln, [2, 3], 'ln_n_4d'));
}

export function scaleRows(b: Builder, q: string, f: RowFactor, heads: number | undefined, qType: number | undefined, opset: number): Applied {
  const c = factorRowsHeads(b, f);
  if (!f.perHead) return applyFactor(b, q, c, qType, opset);
  const view = b.op('Reshape', [q, b.int64('heads_view', [0, 0, heads!, -1])], {}, 'q_heads');
  const applied = applyFactor(b, view, c, qType, opset);
  return { ...applied, output: b.op('Reshape', [applied.output, b.int64('merge_heads', [0, 0, -1])], {}, 'q_scaled') };
}

/** A [B,S,N·H] query times c; with a bias, q + bias_q is formed here and the operator's bias loses its query part. */
function scaleQuery(b: Builder, site: FusedSite, q: string, f: RowFactor, bias: string | undefined, opset: number): Applied {
  let qType = site.queryType;
  if (bias !== undefined) ({ q, qType } = foldQueryBias(b, site, q, bias, qType));
  const applied = scaleRows(b, q, f, site.heads.heads, qType, opset);
  if (qType === site.queryType) return applied;
  return { ...applied, output: b.op('Cast', [applied.output], { to: site.queryType! }, 'q_cast') };
}

/** q + bias[:W] (in fp32 when q is fp16/bf16), and the node's bias replaced by [0…0, bias[W:]]. */
function foldQueryBias(b: Builder, site: FusedSite, q: string, biasRole: string, qType: number | undefined): { q: string; qType: number | undefined } {
  const biasIndex = inputAt(opSpec(site.op), biasRole);
  const bias = site.node.input[biasIndex];
  const width = b.op('Slice', [b.op('Shape', [q]), b.int64('last', [-1]), b.int64('end', [INT64_MAX])], {}, 'q_width');
  const zero1 = b.int64('zero1', [0]);
  const biasQ = b.op('Slice', [bias, zero1, width, zero1], {}, 'bias_q');
  const rest = b.op('Slice', [bias, width, b.int64('end', [INT64_MAX]), zero1], {}, 'bias_kv');
  const zeros = b.op('Sub', [biasQ, biasQ], {}, 'bias_q_zero');
  b.editor.setInput(site.node, biasIndex, b.op('Concat', [zeros, rest], { axis: 0 }, 'bias'));
  const wide = qType === DataType.FLOAT16 || qType === DataType.BFLOAT16;
  if (!wide) return { q: b.op('Add', [q, biasQ], {}, 'q_biased'), qType };
  const qf = b.op('Cast', [q], { to: DataType.FLOAT }, 'q_f32');
  const bf = b.op('Cast', [biasQ], { to: DataType.FLOAT }, 'bias_q_f32');
  return { q: b.op('Add', [qf, bf], {}, 'q_biased'), qType: DataType.FLOAT };
}

/**
 * Packed [B,S,W]: only the first W·qParts/parts columns are the query. The packed tensor is multiplied whole by a
 * column factor (c on the query columns, 1 on the others), so it keeps its shape: slicing out the query and
 * concatenating it back leaves the last dim unknown to onnxruntime's shape inference, and its GroupQueryAttention
 * inference then gives the output a wrong width at any optimisation level above 'disabled'.
 */
function scalePacked(b: Builder, site: FusedSite, q: Extract<FusedSite['query'], { layout: 'packed' }>, f: RowFactor, opset: number): Applied {
  const spec = opSpec(site.op);
  const packed = inputOf(spec, site.node, q.input);
  const scalar = (x: string, name: string): string => b.op('Reshape', [x, b.int64('scalar', [])], {}, name);
  const width = scalar(b.op('Slice', [b.op('Shape', [packed]), b.int64('last', [-1]), b.int64('end', [INT64_MAX])], {}, 'width'), 'width_scalar');
  const qWidth = b.op('Mul', [b.op('Div', [width, b.int64('parts', [q.parts], true)], {}, 'part'), b.int64('q_parts', [q.qParts], true)], {}, 'q_width');
  const columns = b.op('Range', [b.int64('zero', [0], true), width, b.int64('one', [1], true)], {}, 'columns');
  const isQuery = b.op('Less', [columns, qWidth], {}, 'is_query');
  const factor = b.op('Where', [isQuery, queryColumnFactor(b, site, f, columns, qWidth), b.constant('one_f', DataType.FLOAT, [], [1])], {}, 'factor_cols');
  let x = packed, xType = site.queryType;
  if (q.bias !== undefined) ({ x, xType } = foldPackedBias(b, site, packed, q.bias, isQuery));
  const applied = applyFactor(b, x, factor, xType, opset);
  if (xType === site.queryType) return applied;
  return { ...applied, output: b.op('Cast', [applied.output], { to: site.queryType! }, 'qkv_cast') };
}

/** c per query column, [Bn,Sn,1] (one s) or [Bn,Sn,W] (per head: column j belongs to head j / (qWidth / N)). */
function queryColumnFactor(b: Builder, site: FusedSite, f: RowFactor, columns: string, qWidth: string): string {
  const c = factorRowsHeads(b, f);
  if (!f.perHead) return c;
  const heads = site.heads.heads!;
  const headSize = b.op('Div', [qWidth, b.int64('heads', [heads], true)], {}, 'head_size');
  const head = b.op('Min', [b.op('Div', [columns, headSize], {}, 'column_head'), b.int64('last_head', [heads - 1], true)], {}, 'column_head_clamped');
  return b.op('Gather', [b.op('Reshape', [c, b.int64('rows_heads', [0, 0, -1])], {}, 'c_heads'), head], { axis: 2 }, 'c_columns');
}

/** packed + bias on the query columns (in fp32 when packed is fp16/bf16), and the node's bias keeps only its other columns. */
function foldPackedBias(b: Builder, site: FusedSite, packed: string, biasRole: string, isQuery: string): { x: string; xType: number | undefined } {
  const biasIndex = inputAt(opSpec(site.op), biasRole);
  const bias = site.node.input[biasIndex];
  const zero = b.op('Sub', [bias, bias], {}, 'bias_zero');
  const biasQ = b.op('Where', [isQuery, bias, zero], {}, 'bias_q');
  b.editor.setInput(site.node, biasIndex, b.op('Where', [isQuery, zero, bias], {}, 'bias'));
  const qType = site.queryType;
  if (qType !== DataType.FLOAT16 && qType !== DataType.BFLOAT16) return { x: b.op('Add', [packed, biasQ], {}, 'qkv_biased'), xType: qType };
  const wide = (t: string, name: string): string => b.op('Cast', [t], { to: DataType.FLOAT }, name);
  return { x: b.op('Add', [wide(packed, 'qkv_f32'), wide(biasQ, 'bias_q_f32')], {}, 'qkv_biased'), xType: DataType.FLOAT };
}

/** [B,N,S,H]: c as [Bn,N,Sn,1] (per head) or [Bn,1,Sn,1]. */
function scaleBnsd(b: Builder, site: FusedSite, input: string, f: RowFactor, opset: number): Applied {
  return applyFactor(b, inputOf(opSpec(site.op), site.node, input), factorBnsd(b, f), site.queryType, opset);
}

/** MultiHeadAttention packed [B,S,N,3,H]: factor [Bn,Sn,N|1,3,1] = [c, 1, 1] along the Q/K/V axis. */
function scaleBsn3h(b: Builder, site: FusedSite, input: string, f: RowFactor, opset: number): Applied {
  const c4 = f.perHead ? factorRowsHeads(b, f) : unsqueeze(b, factorRowsHeads(b, f), [3], 'factor_rows');
  const c5 = unsqueeze(b, c4, [3], 'factor_5d');
  const ones = b.op('ConstantOfShape', [b.op('Shape', [c5])], { value: oneTensor() }, 'ones');
  const qkv = b.op('Concat', [c5, ones, ones], { axis: 3 }, 'factor_qkv');
  return applyFactor(b, inputOf(opSpec(site.op), site.node, input), qkv, site.queryType, opset);
}

/**
 * com.microsoft Attention: the query columns of weights [in, W] and bias [W] times c per head (n = Tk is the
 * same for every row, so one column factor is exact in keys mode).
 */
function scaleWeights(b: Builder, site: FusedSite, q: Extract<FusedSite['query'], { layout: 'weights' }>, f: RowFactor, opset: number): Applied {
  const perHead = f.perHead;
  const spec = opSpec(site.op);
  const weights = inputOf(spec, site.node, q.weights);
  const width = b.op('Slice', [b.op('Shape', [weights]), b.int64('last', [-1]), b.int64('end', [INT64_MAX])], {}, 'width');
  const qWidth = q.qWidth !== undefined ? b.int64('q_width', [q.qWidth]) : b.op('Div', [width, b.int64('three', [3])], {}, 'q_width');
  // width and qWidth are 1-D [1]; the column layout is [N, H] per head, or [1, hidden].
  const heads = site.heads.heads ?? 1;
  const scalar = (x: string, name: string): string => b.op('Reshape', [x, b.int64('scalar', [])], {}, name);
  const sHeads = b.op('Reshape', [f.s, b.int64('heads_col', [-1, 1])], {}, 's_heads');
  const perHeadC = presetFactor(b, f.preset, sHeads, scalar(f.rows.n, 'n'), scalar(f.rows.ln, 'ln_n'));
  const headSize = b.op('Div', [qWidth, b.int64('heads', [heads])], {}, 'head_size');
  const shape = b.op('Concat', [b.int64('heads1', [perHead ? heads : 1]), perHead ? headSize : qWidth], { axis: 0 }, 'cols_shape');
  const qCols = b.op('Reshape', [b.op('Expand', [perHeadC, shape], {}, 'q_cols_2d'), b.int64('flat', [-1])], {}, 'q_cols');
  const kvCols = b.op('ConstantOfShape', [b.op('Sub', [width, qWidth], {}, 'kv_width')], { value: oneTensor() }, 'kv_cols');
  const cols = b.op('Concat', [qCols, kvCols], { axis: 0 }, 'factor_cols');
  const applied = applyFactor(b, weights, cols, site.queryType, opset);
  b.editor.setInput(site.node, inputAt(spec, q.weights), applied.output);
  if (q.bias !== undefined) {
    const biased = applyFactor(b, inputOf(spec, site.node, q.bias), cols, site.queryType, opset);
    b.editor.setInput(site.node, inputAt(spec, q.bias), biased.output);
  }
  return applied;
}

const oneTensor = (): TensorProto => makeTensor('', DataType.FLOAT, [1], [1]);
