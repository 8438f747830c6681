/**
 * Models below opset 11, where the ops the patch inserts (Range, Slice with inputs) do not exist: the opset import
 * is raised to 11 when every node means the same there (said in a note, undone by revert), else the patch is
 * refused with exit 2 and what to do, never an internal error.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { DataType, ModelProto, NodeProto, toNumber } from '../src/io/onnx';
import { encodeModel, readModel, serializeModel } from '../src/io/model-file';
import { onnxruntime } from '../src/onnxruntime';
import { TORCH } from './support/ref';
import { patchModel } from '../src/rewrite/patch';
import { revertModel } from '../src/rewrite/revert';
import { f32, floats, maxDiff, runOnce } from './support/attention';
import { attentionNodes, f32 as f32Init, i64 as i64Init, model, node, value } from './support/build';
import { modelScopes } from '../src/graph/scopes';
import { verifyPatch } from '../src/verify/verify';
import { assertOneLineError, cli, removeScratch, tmpdir } from './support/io';

after(removeScratch);

const N = 2, D = 8, IN = 6;

/** x → Relu → causal com.microsoft Attention (with a stacked cache) at `opset`; `extra` nodes before it. */
function fused(opset: number, extra: NodeProto[] = []): ModelProto {
  const attention: NodeProto = { ...node('Attention', ['x_act', 'w', 'b', '', 'past'], ['out', 'present'], { num_heads: N, unidirectional: 1 }, 'Attention'), domain: 'com.microsoft' };
  const m = model({
    nodes: [...extra, node('Relu', ['x'], ['x_act']), attention],
    inputs: [value('x', DataType.FLOAT, ['B', 'S', IN]), value('past', DataType.FLOAT, [2, 'B', N, 'P', D / N])],
    outputs: [value('out', DataType.FLOAT, []), value('present', DataType.FLOAT, [])],
    initializers: [f32Init('w', [IN, 3 * D], Array.from(floats(IN * 3 * D, 3, 0.6))), f32Init('b', [3 * D], Array.from(floats(3 * D, 4, 0.3)))],
    opset,
  });
  m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
  return m;
}

const feeds = { x: f32([2, 3, IN], floats(2 * 3 * IN, 5, 1.5)), past: f32([2, 2, N, 4, D / N], floats(2 * 2 * N * 4 * (D / N), 6, 1.5)) };

describe('fused attention below opset 11', () => {
  for (const opset of [9, 10]) {
    it(`opset ${opset}: raised to 11 with a note; the result is the opset-11 model's, and revert restores the opset`, async () => {
      const m = fused(opset);
      const { model: patched, report } = patchModel(m, { s: 0.5 });
      assert.match(report.notes.join('\n'), new RegExp(`default opset import was raised from ${opset} to 11`));
      assert.equal(toNumber(patched.opsetImport.find((o) => o.domain === '')!.version), 11);
      const same = patchModel(fused(11), { s: 0.5 }).model;
      assert.ok(maxDiff(await runOnce(patched, feeds, 'out'), await runOnce(same, feeds, 'out')) < 1e-6);
      const back = revertModel(patched).model;
      assert.ok(Buffer.from(serializeModel(back)).equals(Buffer.from(serializeModel(m))), 'revert did not restore the model');
    });
  }

  it('a node that opset 11 reads differently (Slice with attributes at opset 9): exit 2 and what to do', () => {
    const slice = node('Slice', ['x'], ['x_sliced'], { starts: [0], ends: [1], axes: [0] }, 'attr_slice');
    const m = fused(9, [slice]);
    m.graph!.output.push(value('x_sliced', DataType.FLOAT, []));
    assert.throws(() => patchModel(m, { s: 0.5 }), /raising it would change what its Slice node\(s\) mean .*onnx\.version_converter/);
    const dir = tmpdir('ssmax-opset-');
    const input = path.join(dir, 'old.onnx');
    fs.writeFileSync(input, encodeModel(m));
    assertOneLineError(cli([input, '--s', '0.5', '-o', path.join(dir, 'out.onnx')]), 2, /needs opset ≥ 11; the model imports opset 9/);
    assert.equal(fs.existsSync(path.join(dir, 'out.onnx')), false);
  });
});

describe('plain-op attention below opset 11', () => {
  it('causal n needs Range: the opset is raised the same way', () => {
    // Causal mask from a triangular constant, opset 10.
    const t = 4;
    const tri = Array.from({ length: t * t }, (_, k) => (k % t <= Math.floor(k / t) ? 0 : -10000));
    const m = model({
      nodes: [node('Transpose', ['k'], ['kt'], { perm: [0, 2, 1] }), node('MatMul', ['q', 'kt'], ['qk']), node('Add', ['qk', 'mask'], ['masked']),
        node('Softmax', ['masked'], ['p'], { axis: 2 }), node('MatMul', ['p', 'v'], ['y'])],
      inputs: ['q', 'k', 'v'].map((n) => value(n, DataType.FLOAT, [2, t, 4])), outputs: [value('y', DataType.FLOAT, [])],
      initializers: [f32Init('mask', [t, t], tri), i64Init('unused', [0])], opset: 10,
    });
    const { model: patched, report } = patchModel(m, { s: 0.5 });
    assert.equal(report.sites[0].n, 'causal');
    assert.equal(toNumber(patched.opsetImport[0].version), 11);
  });
});

describe('a model importing the default domain twice', () => {
  it('21 then 17: read as onnxruntime reads it (the last, 17); verify\'s own sharpness nodes load in its form', async () => {
    const H = 4;
    const m = model({
      nodes: attentionNodes('q', 'k', 'v', 'out', 'a'),
      inputs: ['q', 'k', 'v'].map((x) => value(x, DataType.FLOAT, ['B', N, 'S', H])), outputs: [value('out', DataType.FLOAT, ['B', N, 'S', H])],
      initializers: [f32Init('sqrt_d', [], [2])], opset: 21,
    });
    m.opsetImport.push({ domain: '', version: 17 });
    assert.equal(modelScopes(m)[0].opset, 17);
    const { model: patched } = patchModel(m, { trainLen: 8 });
    const report = await verifyPatch(m, patched, { checks: ['wiring', 'sharpness'] });
    const sharpness = report.checks.find((c) => c.id === 'sharpness')!;
    assert.ok(sharpness.status === 'PASSED' || sharpness.status === 'FAILED', `sharpness ${sharpness.status}: ${sharpness.summary}`);
    assert.equal(report.checks.find((c) => c.id === 'wiring')!.status, 'PASSED');
  });
});

describe('an opset import without a domain field', () => {
  it('is the default domain: no second default import is added, and the patch loads (a spread copy of a decoded import has none)', async () => {
    // fairseq_decoder at opset 14 uses Unsqueeze with axes as an input: a second default import (11) in force would
    // make its own nodes invalid, which is what the patch did when it missed this import.
    const m = readModel(path.join(TORCH, 'fairseq_decoder.onnx'));
    m.opsetImport = m.opsetImport.map((o) => ({ ...o }));
    assert.equal(m.opsetImport[0].domain, undefined);
    const { model: patched, report } = patchModel(m, { trainLen: 16 });
    assert.deepEqual(report.notes.filter((n) => /opset import/.test(n)), []);
    assert.equal(patched.opsetImport.filter((o) => !o.domain || o.domain === 'ai.onnx').length, 1);
    const { ort } = onnxruntime();
    const session = await ort.InferenceSession.create(serializeModel(patched), { logSeverityLevel: 4 });
    await session.release();
  });
});
