/**
 * Outputs for attention sharpness: the largest probability of each of the last ROW_SAMPLE rows of every site's
 * attention, in the original and the patched model alike. A plain-op site is read at its Softmax, in whichever
 * graph holds it (expose.ts); a fused operator where its kernel can give its probabilities or logits as an extra
 * output (com.microsoft MultiHeadAttention `qk`, GroupQueryAttention `qk_output`, ONNX Attention
 * `qk_matmul_output_mode`). Reducing only a slice keeps the extra work and memory small at long lengths.
 */
import { fusedElementType } from '../detect/fused';
import { softmaxNamed } from '../detect/softmax';
import { findValueMatMul } from '../detect/trace';
import { inputOf, isOp, MS_ATTENTION, MULTI_HEAD_ATTENTION, PatchedOp, patchedSpecOf } from '../graph/attention-ops';
import { attr, attrFloat, attrInt, attrInts, Graph } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { AttributeType, DataType, ModelProto, NodeProto } from '../io/onnx';
import { isPatchNode, namePrefix } from '../identity';
import { nodeKey } from '../rewrite/journal';
import { Exposer, Unexposable } from './expose';
import { attribute, constant, lastRows, node, PREFIX, versionedNodes } from './nodes';
import { VerifySite } from './sites';

/** Rows per attention site whose largest probability is read: the last ROW_SAMPLE rows. */
export const ROW_SAMPLE = 64;

/** What is read of each row: its largest probability, or its entropy −Σ p·ln p (nats; calibration's --match entropy). */
export type RowStatistic = 'max' | 'entropy';

/** Which rows are read: the last ROW_SAMPLE (verification), or all (calibration reads a curve off one causal run). */
type RowReading = { stat: RowStatistic; rows: 'last' | 'all' };

export interface RowMaxOutputs {
  /** Graph output per site index. */
  outputs: Map<number, string>;
  /** Per site index: why its probabilities cannot be read (`<site label>: <reason>`). */
  unseen: Map<number, string>;
  /** Reading all rows: per site index, an output holding the key count Tk of its probabilities ([1]). */
  keys: Map<number, string>;
}

export function addRowMaxOutputs(model: ModelProto, sites: readonly VerifySite[], stat: RowStatistic = 'max', rows: RowReading['rows'] = 'last'): RowMaxOutputs {
  const x = new Exposer(model);
  const reading: RowReading = { stat, rows };
  const result: RowMaxOutputs = { outputs: new Map(), unseen: new Map(), keys: new Map() };
  sites.forEach((site, index) => {
    const t = site.tensors;
    if (!t) return;
    const scope = x.scope(t.scope);
    if (!scope) return;
    // An expanded operator's output is written by its kernel (MultiHeadAttention) in the patched model, by the operator in the original.
    let key = site.record.expanded && site.fused ? nodeKey(site.fused.node) : t.consumer;
    let where = scope;
    const prompt = site.record.expanded ? promptKernel(x, scope, key) : undefined;
    if (prompt) ({ scope: where, key } = prompt);
    // An expanded ONNX Attention has its own Softmax in the patched model; the original has the operator.
    const softmax = t.softmax !== undefined ? softmaxNamed(scope.graph, scope.shapes, t.softmax) : undefined;
    const r = site.fused && !softmax ? fusedRowMax(x, where, key, site, reading) : softmaxRowMax(x, scope, softmax, site.record.layer, reading);
    if ('reason' in r) result.unseen.set(index, `${site.label}: ${r.reason}`);
    else {
      const out = x.expose(where.path, r.tensor, `L${site.record.layer}/row_max`, site.call);
      if (out instanceof Unexposable) result.unseen.set(index, `${site.label}: ${out.reason}`);
      else result.outputs.set(index, out);
      const keys = r.keys && !(out instanceof Unexposable) ? x.expose(where.path, r.keys, `L${site.record.layer}/keys`, site.call) : undefined;
      if (typeof keys === 'string') result.keys.set(index, keys);
    }
  });
  x.finish();
  return result;
}

/**
 * An expanded com.microsoft Attention over a stacked cache picks its form with an If: one row (decoding) in plain
 * ops, several (a prompt, every run of the sweep) on MultiHeadAttention in the else branch. That kernel, in that
 * branch's scope, gives the probabilities; the Exposer brings them out of the If (empty when the other branch runs).
 */
function promptKernel(x: Exposer, scope: Scope, key: string): { scope: Scope; key: string } | undefined {
  const op = scope.graph.nodes.find((n) => nodeKey(n) === key);
  if (op?.opType !== 'If') return undefined;
  const branch = x.scopes.find((s) => s.owner?.node === op && s.path.endsWith('.else_branch'));
  const kernel = branch?.graph.nodes.find((n) => isOp(MULTI_HEAD_ATTENTION, n));
  return branch && kernel ? { scope: branch, key: nodeKey(kernel) } : undefined;
}

/** The row maxima of a tensor (and, reading all rows, its key count), or why there are none. */
type Found = { tensor: string; keys?: string } | { reason: string };

function softmaxRowMax(x: Exposer, scope: Scope, softmax: { output: string } | undefined, layer: number, reading: RowReading): Found {
  if (!softmax) return { reason: 'its Softmax is not in the graph' };
  const rowMax = reduceRows(x, scope, softmax.output, layer, reading);
  orderBeforeValues(x, scope, softmax.output, rowMax, layer);
  return rowMax;
}

/** ReduceMax over keys of the last ROW_SAMPLE rows of `probs` (all rows where the opset and rank allow no Slice, or asked for). */
function reduceRows(x: Exposer, scope: Scope, probs: string, layer: number, reading: RowReading): { tensor: string; keys?: string } {
  const g = scope.graph;
  const sliced = reading.rows === 'last' ? lastRows(g, probs, scope.opset, scope.shapes.rank(probs), ROW_SAMPLE) : null;
  for (const n of sliced?.nodes ?? []) x.add(scope, n);
  const rows = sliced?.out ?? probs;
  const keys = reading.rows === 'all' ? keyCount(x, scope, probs, layer) : undefined;
  if (reading.stat === 'entropy') return { tensor: rowEntropy(x, scope, rows, layer), keys };
  const out = g.uniqueName(`${PREFIX}L${layer}/row_max_raw`);
  const tensor = addAll(x, scope, versionedNodes(g, 'ReduceMax', [rows], out, scope.opset, { keepdims: 0, axes: [-1] }));
  return { tensor, keys };
}

/** The last dim of `probs` ([1], int64): the keys its rows are over, which need not be the run's length (cross attention). */
function keyCount(x: Exposer, scope: Scope, probs: string, layer: number): string | undefined {
  if (scope.opset < 10) return undefined;
  const g = scope.graph;
  const shape = add(x, scope, node('Shape', [probs], g.uniqueName(`${PREFIX}L${layer}/probs_shape`)));
  return addAll(x, scope, versionedNodes(g, 'Slice', [shape], g.uniqueName(`${PREFIX}L${layer}/key_count`), scope.opset, { starts: [-1], ends: [2 ** 62], axes: [0] }));
}

/** −Σ p·ln p over keys, in float32; p = 0 adds 0 (p·ln max(p, 1e-30)). */
function rowEntropy(x: Exposer, scope: Scope, rows: string, layer: number): string {
  const g = scope.graph;
  const name = (base: string): string => g.uniqueName(`${PREFIX}L${layer}/${base}`);
  const p = add(x, scope, node('Cast', [rows], name('rows_f'), { to: DataType.FLOAT }));
  const tiny = add(x, scope, constant(g, `L${layer}/tiny`, DataType.FLOAT, [], [1e-30]));
  const logP = add(x, scope, node('Log', [add(x, scope, node('Max', [p, tiny], name('rows_clamped')))], name('log_p')));
  const pLogP = add(x, scope, node('Mul', [p, logP], name('p_log_p')));
  const sum = addAll(x, scope, versionedNodes(g, 'ReduceSum', [pLogP], name('sum_p_log_p'), scope.opset, { keepdims: 0, axes: [-1] }));
  return add(x, scope, node('Neg', [sum], name('row_entropy')));
}

function add(x: Exposer, scope: Scope, n: NodeProto): string {
  x.add(scope, n);
  return n.output[0];
}

/** Adds the nodes in order and returns the last one's output. */
function addAll(x: Exposer, scope: Scope, nodes: NodeProto[]): string {
  for (const n of nodes) x.add(scope, n);
  return nodes[nodes.length - 1].output[0];
}

/**
 * Makes the attention's value MatMul wait for every output read off the probabilities (the row statistic and,
 * reading all rows, the key count's Shape) by adding an exact zero computed from each to the values (v + (m − m),
 * with m finite whenever the probabilities are; k − k for the integer key count). Without this dependency
 * onnxruntime schedules those nodes after the whole graph and keeps every layer's attention matrix alive until
 * then: 12 GB instead of 3.5 GB for a 12-layer model at 4096 tokens. A Shape of the probabilities alone does it
 * too (calibration, before the key count was ordered: 3.2 GB instead of 1.2 GB for a 6-layer decoder at 4096).
 */
function orderBeforeValues(x: Exposer, scope: Scope, probs: string, read: { tensor: string; keys?: string }, layer: number): void {
  const g: Graph = scope.graph;
  const matmul = findValueMatMul(g, probs);
  if (!matmul) return;
  const name = (base: string): string => g.uniqueName(`${PREFIX}L${layer}/${base}`);
  const values = matmul.input[1];
  // The zeros are summed in float (the statistic is the probabilities' type, or float for entropy; the key count
  // is int64), then cast to the values' type.
  const float = (t: string, base: string): string => add(x, scope, node('Cast', [t], name(base), { to: DataType.FLOAT }));
  const m = float(add(x, scope, node('ReduceMax', [read.tensor], name('order_max'), { keepdims: 0 })), 'order_max_f');
  let zero = add(x, scope, node('Sub', [m, m], name('order_zero')));
  if (read.keys) zero = add(x, scope, node('Add', [zero, float(add(x, scope, node('Sub', [read.keys, read.keys], name('order_keys_zero'))), 'order_keys_zero_f')], name('order_zeros')));
  const valueType = scope.shapes.type(values) ?? scope.shapes.type(probs) ?? DataType.FLOAT;
  if (valueType !== DataType.FLOAT) zero = add(x, scope, node('Cast', [zero], name('order_zero_cast'), { to: valueType }));
  const dependent = add(x, scope, node('Add', [values, zero], name('values_after_row_max')));
  g.setInput(matmul, 1, dependent);
}

/**
 * A fused operator's attention, from the extra output its kernel offers (its spec's `probabilities`):
 * probabilities (GroupQueryAttention qk_output = 2, ONNX Attention qk_matmul_output_mode = 3) or masked logits
 * (MultiHeadAttention's qk, ONNX Attention modes 1 and 2), a Softmax of which gives the probabilities. An output
 * the node does not have yet is added, with the attribute that turns it on.
 */
function fusedRowMax(x: Exposer, scope: Scope, key: string, site: VerifySite, reading: RowReading): Found {
  const op = scope.graph.nodes.find((n) => nodeKey(n) === key);
  if (!op) return { reason: 'the operator is not in the graph' };
  const spec = patchedSpecOf(op);
  const qk = spec?.probabilities;
  if (spec && qk) {
    const position = spec.outputs[qk.output];
    let holds = qk.holds(qk.mode ? attrInt(op, qk.mode.attribute) ?? 0 : 0);
    if (!op.output[position]) {
      if (qk.mode) setInt(op, qk.mode.attribute, qk.mode.enable);
      holds = qk.holds(qk.mode?.enable ?? 0);
    }
    return typeof holds === 'string' ? readQk(x, scope, op, spec, position, holds, site.record.layer, reading) : holds;
  }
  if (spec === MS_ATTENTION) return attentionLogits(x, scope, op, site.record.layer, reading);
  const single = op.opType === 'Identity' && site.record.expanded ? singleRowSoftmax(scope.graph, op, site.record.layer) : undefined;
  if (single) return softmaxRowMax(x, scope, { output: single.output[0] }, site.record.layer, reading);
  if (op.opType === 'If' && site.record.expanded) return { reason: 'its expansion runs the kernel inside an If (one branch for decoding, one for a prompt), which the sweep does not read' };
  return { reason: `${op.opType} gives no attention probabilities or logits as an output` };
}

/**
 * An expanded operator whose query has one row by the graph's shapes (a decoder fed one token at a time) is plain
 * ops ending in an Identity, with no If: the Softmax among the site's own inserted nodes before it.
 */
function singleRowSoftmax(g: Graph, identity: NodeProto, layer: number): NodeProto | undefined {
  // Up through the patch's own nodes only; the first Softmax met is the site's, or none is.
  const found = g.query.first(`single-row-softmax:${layer}`, identity.input[0], (_t, n) => {
    if (!n || !isPatchNode(n)) return null;
    if (n.opType === 'Softmax') return n.name.startsWith(namePrefix(layer)) ? n : null;
    return undefined;
  });
  return found ?? undefined;
}

/** The row maxima of the kernel's output `at` (added to the node when absent), which holds `kind`. */
function readQk(x: Exposer, scope: Scope, op: NodeProto, spec: PatchedOp, at: number, kind: 'probs' | 'logits', layer: number, reading: RowReading): Found {
  let out = op.output[at];
  if (!out) {
    const type = fusedElementType(scope.shapes, spec, op);
    if (type === undefined) return { reason: 'the element type of its inputs is not known, so its qk output cannot be declared' };
    out = scope.graph.uniqueName(`${PREFIX}L${layer}/qk`);
    scope.graph.setOutput(op, at, out);
    // The kernel's schema cannot infer this output's type: it is the query's.
    scope.graph.proto.valueInfo.push({ name: out, type: { tensorType: { elemType: type } } });
  }
  const probs = kind === 'probs' ? out : add(x, scope, node('Softmax', [out], scope.graph.uniqueName(`${PREFIX}L${layer}/qk_probs`), { axis: -1 }));
  return reduceRows(x, scope, probs, layer, reading);
}

/**
 * com.microsoft Attention computes Q and K inside and gives neither out: its probabilities are recomputed here
 * from the same inputs (input · weights + bias, heads split, the cache's keys first, the scale, the causal mask
 * of unidirectional), where the node uses nothing else (no mask_index, attention_bias, rotary or shared cache).
 */
function attentionLogits(x: Exposer, scope: Scope, op: NodeProto, layer: number, reading: RowReading): Found {
  // The recomputation slices by computed widths (Slice takes them as inputs from opset 10) and builds positions by Range (11).
  if (scope.opset < 11) return { reason: `com.microsoft Attention in a graph of opset ${scope.opset}: the recomputation needs Slice by computed bounds and Range (opset 11), so its probabilities are not recomputed` };
  const mask = at(op, 'mask_index');
  const maskRank = mask ? scope.shapes.rank(mask) : undefined;
  if ((maskRank !== undefined && maskRank > 3) || (mask && maskRank === undefined) || at(op, 'past_sequence_length') || (attrInt(op, 'do_rotary') ?? 0) !== 0) {
    return { reason: 'com.microsoft Attention with a 4-D or unranked mask_index, rotary or a shared cache gives no probabilities to recompute' };
  }
  const heads = attrInt(op, 'num_heads');
  const sizes = attrInts(op, 'qkv_hidden_sizes');
  if (!heads) return { reason: 'com.microsoft Attention without num_heads' };
  const g = scope.graph;
  const name = (base: string): string => g.uniqueName(`${PREFIX}L${layer}/${base}`);
  const k64 = (base: string, v: number[]): string => add(x, scope, constant(g, `L${layer}/${base}`, DataType.INT64, [v.length], v));
  const n = (opType: string, inputs: string[], base: string, attrs: Record<string, number | number[]> = {}): string =>
    add(x, scope, node(opType, inputs, name(base), attrs));
  let qkv = n('MatMul', [at(op, 'input'), at(op, 'weights')], 'qkv');
  if (at(op, 'bias')) qkv = n('Add', [qkv, at(op, 'bias')], 'qkv_biased');
  // The recomputation's constants are float: an fp16 operator's tensors are cast to float first.
  const float = (t: string, base: string): string => (fusedElementType(scope.shapes, MS_ATTENTION, op) === DataType.FLOAT ? t : n('Cast', [t], base, { to: DataType.FLOAT }));
  qkv = float(qkv, 'qkv_f');
  // Widths of Q and K: qkv_hidden_sizes, else a third each of the weight's columns.
  const width = n('Slice', [n('Shape', [at(op, 'weights')], 'w_shape'), k64('last', [-1]), k64('end', [2 ** 62])], 'w_width');
  const third = n('Div', [width, k64('three', [3])], 'third');
  const qW = sizes ? k64('q_width', [sizes[0]]) : third;
  const kEnd = sizes ? k64('k_end', [sizes[0] + sizes[1]]) : n('Mul', [third, k64('two', [2])], 'k_end');
  const split = (from: string, to: string, base: string, perm: number[]): string => n('Transpose', [
    n('Reshape', [n('Slice', [qkv, from, to, k64(`${base}_axis`, [2])], `${base}_cols`), k64(`${base}_heads`, [0, 0, heads, -1])], `${base}_4d`)], base, { perm });
  const q = split(k64('zero', [0]), qW, 'q', [0, 2, 1, 3]);
  let k = split(qW, kEnd, 'k', [0, 2, 1, 3]);
  // Ops every opset ≥ 11 graph accepts (com.microsoft Attention is found in opset-11 decoders): a scalar Gather
  // instead of Squeeze, a comparison of positions instead of Trilu.
  const scalar = (base: string, v: number): string => add(x, scope, constant(g, `L${layer}/${base}`, DataType.INT64, [], [v]));
  const f = (base: string, v: number): string => add(x, scope, constant(g, `L${layer}/${base}`, DataType.FLOAT, [], [v]));
  if (at(op, 'past')) k = n('Concat', [n('Gather', [float(at(op, 'past'), 'past_f'), scalar('past_k', 0)], 'past_k_4d', { axis: 0 }), k], 'k_all', { axis: 2 });
  const kT = n('Transpose', [k], 'k_t', { perm: [0, 1, 3, 2] });
  const hd = n('Cast', [n('Slice', [n('Shape', [q], 'q_shape'), k64('hd_at', [3]), k64('hd_end', [4])], 'head_size')], 'head_size_f', { to: DataType.FLOAT });
  const scale = attrFloat(op, 'scale');
  const factor = scale ? f('scale', scale) : n('Reciprocal', [n('Sqrt', [hd], 'sqrt_hd')], 'scale');
  let logits = n('Mul', [n('MatMul', [q, kT], 'qk_raw'), factor], 'qk_scaled');
  if ((attrInt(op, 'unidirectional') ?? 0) === 1) {
    // Row i of S sees keys j ≤ Tk − S + i: −inf where j is beyond that.
    const dim = (t: string, axis: number, base: string): string => n('Gather', [n('Shape', [t], `${base}_shape`), scalar(`${base}_axis`, axis)], base, { axis: 0 });
    const S = dim(q, 2, 'rows'), T = dim(kT, 3, 'cols');
    const one = scalar('one', 1), zero = scalar('zero', 0);
    const position = n('Reshape', [n('Add', [n('Range', [zero, S, one], 'row_index'), n('Sub', [T, S], 'offset')], 'row_pos'), k64('column', [-1, 1])], 'row_pos_col');
    const future = n('Greater', [n('Range', [zero, T, one], 'key_pos'), position], 'future');
    logits = n('Add', [logits, n('Where', [future, f('neg_inf', -Infinity), f('zero_f', 0)], 'causal')], 'qk_masked');
  }
  // attention_bias [B|1, N, S, T] is added to the scaled logits (a positional prior goes there too).
  if (at(op, 'attention_bias')) logits = n('Add', [logits, float(at(op, 'attention_bias'), 'bias_f')], 'qk_biased');
  if (maskRank !== undefined) {
    // Hidden keys get mask_filter_value (−10000 unless set), as the kernel does.
    const keep = maskRank === 1 ? keptByPositions(n, scalar, k64, op, kT) : n('Cast', [at(op, 'mask_index')], 'mask_keep', { to: DataType.BOOL });
    const bias = n('Where', [keep, f('zero_keep', 0), f('mask_filter', attrFloat(op, 'mask_filter_value') ?? -10000)], 'mask_bias');
    // [B, T] → [B, 1, 1, T]; [B|1, S, T] → [B|1, 1, S, T].
    const shape = maskRank === 3
      ? n('Concat', [n('Slice', [n('Shape', [bias], 'mask_shape'), k64('m_at0', [0]), k64('m_end1', [1])], 'mask_items'), k64('one_head', [1]),
        n('Slice', [n('Shape', [bias], 'mask_shape_rows'), k64('m_at1', [1]), k64('m_end3', [3])], 'mask_rows_keys')], 'mask_4d_shape', { axis: 0 })
      : k64('mask_4d', [0, 1, 1, -1]);
    logits = n('Add', [logits, n('Reshape', [bias, shape], 'mask_bias_4d')], 'qk_padded');
  }
  return reduceRows(x, scope, n('Softmax', [logits], 'probs', { axis: -1 }), layer, reading);
}

/** com.microsoft Attention's input in a role ('' when absent), read by position from its spec. */
const at = (op: NodeProto, role: keyof typeof MS_ATTENTION.inputs): string => inputOf(MS_ATTENTION, op, role);

type Emit = (opType: string, inputs: string[], base: string, attrs?: Record<string, number | number[]>) => string;

/**
 * A 1-D mask_index as bool [B, T]: key j is kept when j < end_b and j ≥ start_b. [B] holds the ends; [2B] the ends
 * then the starts; [3B + 2] begins with the ends. The format is told at run time from the length, as the kernel does.
 */
function keptByPositions(n: Emit, scalar: (base: string, v: number) => string, k64: (base: string, v: number[]) => string, op: NodeProto, kT: string): string {
  const m = n('Cast', [at(op, 'mask_index')], 'mask_i64', { to: DataType.INT64 });
  const B = n('Reshape', [n('Gather', [n('Shape', [at(op, 'input')], 'batch_shape'), scalar('batch_axis', 0)], 'batch', { axis: 0 }), k64('one_dim', [1])], 'batch_1');
  const twoB = n('Add', [B, B], 'batch_2');
  const ends = n('Slice', [m, k64('start0', [0]), B], 'key_end');
  const padded = n('Concat', [m, n('Expand', [k64('zero1', [0]), B], 'zeros_b')], 'mask_padded', { axis: 0 });
  const starts = n('Where', [n('Equal', [n('Shape', [m], 'mask_len'), twoB], 'end_start'), n('Slice', [padded, B, twoB], 'key_start_raw'), scalar('no_start', 0)], 'key_start');
  const T = n('Gather', [n('Shape', [kT], 'kt_shape'), scalar('kt_axis', 3)], 'keys', { axis: 0 });
  const pos = n('Range', [scalar('pos0', 0), T, scalar('pos1', 1)], 'key_pos_all');
  const column = (t: string, base: string): string => n('Reshape', [t, k64(`${base}_col`, [-1, 1])], base);
  return n('And', [n('Less', [pos, column(ends, 'end_col')], 'before_end'), n('Not', [n('Less', [pos, column(starts, 'start_col')], 'before_start')], 'from_start')], 'mask_keep');
}

function setInt(op: NodeProto, name: string, value: number): void {
  const a = attr(op, name);
  if (a) {
    a.i = value;
    a.type = AttributeType.INT;
  } else op.attribute.push(attribute(name, value));
}
