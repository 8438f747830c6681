/**
 * A trained quality-benchmark model (fixtures/quality) with its attention fused into com.microsoft
 * MultiHeadAttention, so calibration can be tested on a fused operator whose attention is not uniform (the
 * corpus's fused models have random weights). In each layer the plain ops
 *   MatMul(q_rot, Transpose(k_rot)) → Mul(1/√d) → Add(causal mask) → Softmax → MatMul(v) → Transpose → Reshape
 * become MultiHeadAttention(query = q_rot as [B, S, N·H], key = k_rot and value = v as [B, N, S, H],
 * unidirectional = 1), whose default scale is the same 1/√d; nodes left unread are removed.
 */
import { ModelProto, NodeProto } from '../../src/io/onnx';
import { i64, node } from './build';

export function fuseQualityModel(m: ModelProto): ModelProto {
  const g = m.graph!;
  const producer = (t: string): NodeProto => g.node.find((n) => n.output.includes(t))!;
  const readers = (t: string): NodeProto[] => g.node.filter((n) => n.input.includes(t));
  for (const softmax of g.node.filter((n) => n.opType === 'Softmax')) {
    const layer = softmax.name.split('/')[1];
    const qk = producer(producer(producer(softmax.input[0]).input[0]).input[0]);
    const kRot = producer(qk.input[1]).input[0];
    const valueMatMul = readers(softmax.output[0])[0];
    const reshape = readers(readers(valueMatMul.output[0])[0].output[0])[0];
    const [q3, shape] = [`fused/${layer}/q`, `fused/${layer}/q_shape`];
    g.initializer.push(i64(shape, [0, 0, -1]));
    const added = [
      node('Transpose', [qk.input[0]], [`fused/${layer}/q_bsnh`], { perm: [0, 2, 1, 3] }, `fused/${layer}/Transpose`),
      node('Reshape', [`fused/${layer}/q_bsnh`, shape], [q3], {}, `fused/${layer}/Reshape`),
      { ...node('MultiHeadAttention', [q3, kRot, valueMatMul.input[1]], [reshape.output[0]], { num_heads: 4, unidirectional: 1 }, `fused/${layer}/MultiHeadAttention`), domain: 'com.microsoft' },
    ];
    g.node.splice(g.node.indexOf(reshape), 1, ...added);
  }
  m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
  removeUnread(m);
  return m;
}

function removeUnread(m: ModelProto): void {
  const g = m.graph!;
  for (;;) {
    const read = new Set([...g.node.flatMap((n) => n.input), ...g.output.map((o) => o.name)]);
    const kept = g.node.filter((n) => n.output.some((o) => read.has(o)));
    if (kept.length === g.node.length) break;
    g.node = kept;
  }
  const read = new Set(g.node.flatMap((n) => n.input));
  g.initializer = g.initializer.filter((t) => read.has(t.name));
}
