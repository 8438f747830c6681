/**
 * Outputs for attention sharpness: the largest probability of each of the last ROW_SAMPLE rows of every site's
 * attention, in the original and the patched model alike. A plain-op site is read at its Softmax, in whichever
 * graph holds it (expose.ts); a fused operator where its kernel can give its probabilities or logits as an extra
 * output (com.microsoft MultiHeadAttention `qk`, GroupQueryAttention `qk_output`, ONNX Attention
 * `qk_matmul_output_mode`). Reducing only a slice keeps the extra work and memory small at long lengths.
 */
import { findValueMatMul } from '../detect/trace';
import { attr, attrInt, Graph, nodeLabel } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { AttributeType, DataType, ModelProto, NodeProto } from '../io/onnx';
import { nodeKey } from '../rewrite/journal';
import { Exposer, Unexposable } from './expose';
import { attribute, constant, node, PREFIX } from './nodes';
import { VerifySite } from './sites';

/** Rows per attention site whose largest probability is read: the last ROW_SAMPLE rows. */
export const ROW_SAMPLE = 64;

export interface RowMaxOutputs {
  /** Graph output per site index. */
  outputs: Map<number, string>;
  /** Sites whose probabilities cannot be read, with the reason. */
  unseen: string[];
}

export function addRowMaxOutputs(model: ModelProto, sites: VerifySite[]): RowMaxOutputs {
  const x = new Exposer(model);
  const result: RowMaxOutputs = { outputs: new Map(), unseen: [] };
  sites.forEach((site, index) => {
    const t = site.tensors;
    if (!t) return;
    const scope = x.scope(t.scope);
    if (!scope) return;
    const r = site.fused ? fusedRowMax(x, scope, t.consumer, site) : softmaxRowMax(x, scope, t.softmax, site);
    if ('reason' in r) result.unseen.push(`${site.label}: ${r.reason}`);
    else {
      const out = x.expose(t.scope, r.tensor, `L${site.record.layer}/row_max`, site.call);
      if (out instanceof Unexposable) result.unseen.push(`${site.label}: ${out.reason}`);
      else result.outputs.set(index, out);
    }
  });
  x.finish();
  return result;
}

/** The row maxima of a tensor, or why there are none. */
type Found = { tensor: string } | { reason: string };

function softmaxRowMax(x: Exposer, scope: Scope, label: string | undefined, site: VerifySite): Found {
  const softmax = label ? scope.graph.nodes.find((n) => n.opType === 'Softmax' && nodeLabel(n) === label) : undefined;
  if (!softmax) return { reason: 'its Softmax is not in the graph' };
  const rowMax = reduceRows(x, scope, softmax.output[0], site.record.layer);
  orderBeforeValues(x, scope, softmax.output[0], rowMax, site.record.layer);
  return { tensor: rowMax };
}

/** ReduceMax over keys of the last ROW_SAMPLE rows of `probs` (all rows where the opset and rank allow no Slice). */
function reduceRows(x: Exposer, scope: Scope, probs: string, layer: number): string {
  const g = scope.graph;
  const rank = scope.shapes.rank(probs);
  let rows = probs;
  if (scope.opset >= 10 && (scope.opset >= 11 || rank !== undefined)) {
    const k = (base: string, v: number[]): string => add(x, scope, constant(g, `L${layer}/${base}`, DataType.INT64, [1], v));
    const axis = scope.opset >= 11 ? -2 : rank! - 2;
    rows = add(x, scope, node('Slice', [probs, k('rows_start', [-ROW_SAMPLE]), k('rows_end', [2 ** 62]), k('rows_axis', [axis])], g.uniqueName(`${PREFIX}L${layer}/last_rows`)));
  } else if (rank !== undefined) {
    rows = add(x, scope, node('Slice', [probs], g.uniqueName(`${PREFIX}L${layer}/last_rows`), { starts: [-ROW_SAMPLE], ends: [2 ** 62], axes: [rank - 2] }));
  }
  const out = g.uniqueName(`${PREFIX}L${layer}/row_max_raw`);
  return scope.opset >= 18
    ? add(x, scope, node('ReduceMax', [rows, add(x, scope, constant(g, `L${layer}/last_axis`, DataType.INT64, [1], [-1]))], out, { keepdims: 0 }))
    : add(x, scope, node('ReduceMax', [rows], out, { keepdims: 0, axes: [-1] }));
}

function add(x: Exposer, scope: Scope, n: NodeProto): string {
  x.add(scope, n);
  return n.output[0];
}

/**
 * Makes the attention's value MatMul wait for the row maximum by adding an exact zero computed from it to the
 * values (v + (m − m), with m finite whenever the probabilities are). Without this dependency onnxruntime
 * schedules the extra reductions after the whole graph and keeps every layer's attention matrix alive until
 * then: 12 GB instead of 3.5 GB for a 12-layer model at 4096 tokens.
 */
function orderBeforeValues(x: Exposer, scope: Scope, probs: string, rowMax: string, layer: number): void {
  const g: Graph = scope.graph;
  const matmul = findValueMatMul(g, probs);
  if (!matmul) return;
  const values = matmul.input[1];
  const m = add(x, scope, node('ReduceMax', [rowMax], g.uniqueName(`${PREFIX}L${layer}/order_max`), { keepdims: 0 }));
  let zero = add(x, scope, node('Sub', [m, m], g.uniqueName(`${PREFIX}L${layer}/order_zero`)));
  const valueType = scope.shapes.type(values);
  if (valueType !== undefined && valueType !== scope.shapes.type(probs)) {
    zero = add(x, scope, node('Cast', [zero], g.uniqueName(`${PREFIX}L${layer}/order_zero_cast`), { to: valueType }));
  }
  const dependent = add(x, scope, node('Add', [values, zero], g.uniqueName(`${PREFIX}L${layer}/values_after_row_max`)));
  g.setInput(matmul, 1, dependent);
}

/**
 * A fused operator's attention, from the extra output its kernel offers: probabilities (GroupQueryAttention
 * qk_output = 2, ONNX Attention qk_matmul_output_mode = 3) or masked logits (MultiHeadAttention's qk, ONNX
 * Attention modes 1 and 2), a Softmax of which gives the probabilities.
 */
function fusedRowMax(x: Exposer, scope: Scope, key: string, site: VerifySite): Found {
  const op = scope.graph.nodes.find((n) => nodeKey(n) === key);
  if (!op) return { reason: 'the operator is not in the graph' };
  const layer = site.record.layer;
  const qk = (kind: 'probs' | 'logits'): Found => {
    let out = op.output[3];
    if (!out) {
      while (op.output.length < 3) op.output.push('');
      out = scope.graph.uniqueName(`${PREFIX}L${layer}/qk`);
      op.output[3] = out;
      scope.graph.producer.set(out, op);
    }
    const probs = kind === 'probs' ? out : add(x, scope, node('Softmax', [out], scope.graph.uniqueName(`${PREFIX}L${layer}/qk_probs`), { axis: -1 }));
    return { tensor: reduceRows(x, scope, probs, layer) };
  };
  const ms = op.domain === 'com.microsoft';
  if (ms && op.opType === 'MultiHeadAttention') return qk('logits');
  if (ms && op.opType === 'GroupQueryAttention') {
    const mode = attrInt(op, 'qk_output') ?? 0;
    if (op.output[3] && mode !== 2) return mode === 1 ? qk('logits') : { reason: 'its qk output is in a mode that holds no probabilities' };
    setInt(op, 'qk_output', 2);
    return qk('probs');
  }
  if (!ms && op.opType === 'Attention') {
    const mode = attrInt(op, 'qk_matmul_output_mode') ?? 0;
    if (op.output[3]) return mode === 3 ? qk('probs') : mode === 0 ? { reason: 'its qk output holds the logits before the mask' } : qk('logits');
    setInt(op, 'qk_matmul_output_mode', 3);
    return qk('probs');
  }
  return { reason: `${op.opType} gives no attention probabilities or logits as an output` };
}

function setInt(op: NodeProto, name: string, value: number): void {
  const a = attr(op, name);
  if (a) {
    a.i = value;
    a.type = AttributeType.INT;
  } else op.attribute.push(attribute(name, value));
}
