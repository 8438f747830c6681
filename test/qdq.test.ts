/**
 * Statically quantised (QDQ) exports: a QuantizeLinear/DequantizeLinear pair on every activation a MatMul reads and
 * on the Softmax output, as onnxruntime's static quantisation writes them. Detection must find the same sites with
 * the same n mode and heads as in the float model, the factor must go into the float domain (a float Mul, never
 * between a pair), and verification must pass: at n = L the factor is 1, so the patched QDQ model's outputs equal
 * the QDQ original's there, although the quantised probabilities differ from the float model's.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { findAttentionSoftmax } from '../src/detect/find-attention';
import { makeTensor } from '../src/graph/tensor';
import { cloneModel, readModel } from '../src/io/model-file';
import { DataType, ModelProto, NodeProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { verifyPatch } from '../src/verify/verify';
import { node } from './support/build';
import { TORCH } from './support/ref';

/** The model with a Q/DQ pair (uint8, zero point 128, scale 1/32) on the activations MatMuls read and on each Softmax output. */
function quantised(m: ModelProto): ModelProto {
  const out = cloneModel(m);
  const g = out.graph!;
  const constants = new Set([...g.initializer.map((t) => t.name), ...g.node.filter((n) => n.opType === 'Constant').flatMap((n) => n.output)]);
  g.initializer.push(makeTensor('qdq_scale', DataType.FLOAT, [], [1 / 32]));
  g.initializer.push({ ...makeTensor('qdq_zero', DataType.INT32, [], [0]), dataType: DataType.UINT8, int32Data: [128], rawData: undefined } as never);
  let k = 0;
  const pair = (name: string): { nodes: NodeProto[]; out: string } => {
    const q = `qdq_${k}_q`;
    const d = `qdq_${k++}_dq`;
    return { nodes: [node('QuantizeLinear', [name, 'qdq_scale', 'qdq_zero'], [q]), node('DequantizeLinear', [q, 'qdq_scale', 'qdq_zero'], [d])], out: d };
  };
  const nodes: NodeProto[] = [];
  for (const n of g.node) {
    if (n.opType === 'MatMul') {
      n.input = n.input.map((name) => {
        if (constants.has(name)) return name;
        const p = pair(name);
        nodes.push(...p.nodes);
        return p.out;
      });
    }
    nodes.push(n);
    if (n.opType === 'Softmax') {
      const p = pair(n.output[0]);
      for (const r of g.node) if (r !== n) r.input = r.input.map((x) => (x === n.output[0] ? p.out : x));
      nodes.push(...p.nodes);
    }
  }
  g.node = nodes;
  return out;
}

const sitesOf = (m: ModelProto): string[] => {
  const d = findAttentionSoftmax(m);
  return d.sites.map((s) => `L${s.layer} ${s.softmax.name} n=${s.mask.causal ? 'causal' : 'keys'} heads=${s.heads.heads ?? '?'}@${s.heads.axis ?? '?'}`);
};

describe('QDQ models', () => {
  for (const name of ['bert_encoder', 'gpt2_decoder', 'llama_gqa']) {
    const float = readModel(path.join(TORCH, `${name}.onnx`));
    const qdq = quantised(float);

    it(`${name}: the same sites, n and heads as the float model`, () => {
      const want = sitesOf(float);
      assert.ok(want.length > 0);
      assert.deepEqual(sitesOf(qdq), want);
      const a = patchModel(float, { trainLen: 64 }).report.sites.map((s) => `${s.node} ${s.n} ${s.heads} ${s.target}`);
      const b = patchModel(qdq, { trainLen: 64 }).report.sites.map((s) => `${s.node} ${s.n} ${s.heads} ${s.target}`);
      assert.deepEqual(b, a);
    });

    it(`${name}: the factor is applied in the float domain and verification passes`, async () => {
      const { model } = patchModel(qdq, { trainLen: 64 });
      const quantisers = new Set(model.graph!.node.filter((n) => n.opType === 'QuantizeLinear').flatMap((n) => n.output));
      const applied = model.graph!.node.filter((n) => n.name.startsWith('ssmax/') && n.opType === 'Mul');
      assert.ok(applied.length > 0);
      for (const n of applied) assert.ok(!n.input.some((i) => quantisers.has(i)), `${n.name} reads a quantised tensor`);
      const report = await verifyPatch(qdq, model, { trainLen: 64, checks: ['wiring', 'probe', 'retrofit', 'liveness'] });
      const verdicts = Object.fromEntries(report.checks.map((c) => [c.id, c.status]));
      assert.deepEqual(verdicts, { wiring: 'PASSED', probe: 'PASSED', retrofit: 'PASSED', liveness: 'PASSED', sharpness: 'SKIPPED' },
        report.checks.map((c) => `${c.id}: ${c.summary}`).join('\n'));
    });
  }
});
