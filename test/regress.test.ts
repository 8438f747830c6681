/**
 * Minimal models of the shapes real files broke the tool on (fixtures/regress/make_regress.py and the last models
 * of fixtures/ms_attention/make_ms_attention.py), each checked where it broke:
 *   - a mask computed from Shape(logits) (DistilBERT, GPT-2 Megatron, T5's position bias): patched on the logits,
 *     not refused as a cycle, and equal to the numpy SSMax reference;
 *   - EmbedLayerNormalization (int32 ids in, float out) before com.microsoft Attention, also in a subgraph: no
 *     internal error (ms-attention.test.ts holds them to the reference);
 *   - a model of contrib ops alone (no default-domain opset import): the import is added and revert removes it;
 *     verification's own nodes load in it too;
 *   - causal com.microsoft Attention with `present` and no past, at a fixed query length or in float16: the
 *     expansion loads in onnxruntime and passes onnx.checker;
 *   - two Constant nodes defining one name in a graph stored out of order: revert gives back the file's bytes;
 *   - a cycle the patch would make is a bug (CycleError), one in the input model an input error.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { modelScopes } from '../src/graph/scopes';
import { CycleError, topoSort } from '../src/graph/toposort';
import { validateGraph } from '../src/graph/validate';
import { readModel, serializeModel, writeModel } from '../src/io/model-file';
import { DataType, GraphProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { revertModel } from '../src/rewrite/revert';
import { verifyPatch } from '../src/verify/verify';
import { checkerVerdicts } from './support/corpus-net';
import { removeScratch, tmpdir } from './support/io';
import { FIXTURES, loadRef, TORCH } from './support/ref';
import { outputsOf, refError } from './support/refrun';

after(removeScratch);

const REGRESS = path.join(FIXTURES, 'regress');
const MS = path.join(FIXTURES, 'ms_attention');

describe('a mask computed from the shape of the logits', () => {
  const file = path.join(REGRESS, 'mask_from_logits_shape.onnx');
  for (const n of ['auto', 'padding', 'mask'] as const) {
    it(`--n ${n}: the factor on the logits, equal to the SSMax reference`, async () => {
      const { model, report } = patchModel(readModel(file), { s: 0.45, n });
      assert.equal(report.sites[0].target, 'logits');
      for (const c of loadRef('mask_from_logits_shape', REGRESS).cases) {
        const got = await outputsOf(c.patch ? model : readModel(file), c);
        assert.ok(refError(got, c) < 1e-5, `${c.name} ${JSON.stringify(c.patch)}: ${refError(got, c)}`);
      }
    });
  }

  it('T5 position bias from Shape(logits), --n mask: both layers patched, the first on its logits, and verified', async () => {
    const original = readModel(path.join(TORCH, 't5_decoder.onnx'));
    const { model, report } = patchModel(original, { trainLen: 16, n: 'mask' });
    assert.deepEqual(report.sites.map((s) => s.target), ['logits', 'query']);
    const r = await verifyPatch(original, model, { checks: ['wiring', 'probe'] });
    assert.equal(r.passed, true, r.checks.map((c) => `${c.status} ${c.name}: ${c.summary}`).join('\n'));
  });
});

describe('a cycle', () => {
  const cyclic = (): GraphProto => ({
    name: 'g', input: [{ name: 'x' }], output: [{ name: 'b' }], initializer: [], valueInfo: [],
    node: [
      { opType: 'Add', domain: '', name: 'a', input: ['x', 'b'], output: ['a'], attribute: [] },
      { opType: 'Relu', domain: '', name: 'b', input: ['a'], output: ['b'], attribute: [] },
    ],
  });

  it('made by an edit is a CycleError (an internal error), not an input error', () => {
    assert.throws(() => topoSort(cyclic()), (e) => e instanceof CycleError && !(e instanceof InputError) && /node 'a'/.test(e.message));
  });

  it('in a model as read is an input error', () => {
    assert.throws(() => validateGraph(cyclic()), (e) => e instanceof InputError && /graph has a cycle through node 'a'/.test(e.message));
  });
});

describe('element types behind ops the type table does not know', () => {
  it('EmbedLayerNormalization writes the word embedding\'s type; an unknown op writes an unknown type', () => {
    const scope = modelScopes(readModel(path.join(MS, 'embed_int32.onnx')))[0];
    assert.equal(scope.shapes.type('ids_i32'), DataType.INT32);
    assert.equal(scope.shapes.type('embedded'), DataType.FLOAT);
    const m = readModel(path.join(MS, 'embed_int32.onnx'));
    m.graph!.node.find((n) => n.opType === 'EmbedLayerNormalization')!.opType = 'SomethingNew';
    assert.equal(modelScopes(m)[0].shapes.type('embedded'), undefined);
  });

  for (const name of ['embed_int32', 'embed_int32_if']) {
    it(`${name}: patched without an internal error, in ${name.endsWith('_if') ? 'an If branch' : 'the main graph'}`, () => {
      const { report } = patchModel(readModel(path.join(MS, `${name}.onnx`)), { trainLen: 16 });
      assert.deepEqual(report.sites.map((s) => [s.kind, s.scope]), [['com.microsoft.Attention', name.endsWith('_if') ? 'main/If.then_branch' : 'main']]);
    });
  }
});

describe('a model of contrib ops alone (no default-domain opset import)', () => {
  const file = path.join(MS, 'contrib_only.onnx');

  it('gets the import for the inserted ops, and revert gives back the file\'s bytes', () => {
    const { model, report } = patchModel(readModel(file), { trainLen: 16 });
    assert.deepEqual(model.opsetImport.map((o) => [o.domain, Number(o.version)]), [['com.microsoft', 1], ['', 11]]);
    assert.match(report.notes.join('\n'), /a default-domain opset import \(11\) was added/);
    const back = revertModel(readModel(writePatched(model))).model;
    assert.ok(Buffer.from(serializeModel(back)).equals(fs.readFileSync(file)));
  });

  it('verifies, the sharpness check\'s nodes included', async () => {
    const original = readModel(file);
    const r = await verifyPatch(original, patchModel(original, { trainLen: 16 }).model, { lengths: [4, 16, 32] });
    assert.equal(r.passed, true, r.checks.map((c) => `${c.status} ${c.name}: ${c.summary}`).join('\n'));
    assert.notEqual(r.checks.find((c) => c.id === 'sharpness')!.status, 'FAILED');
  });
});

describe('com.microsoft Attention with present and no past', () => {
  for (const name of ['present_fixed_rows', 'present_rows_fp16']) {
    it(`${name}: the expansion passes onnx.checker where the original does`, (t) => {
      const patched = writePatched(patchModel(readModel(path.join(MS, `${name}.onnx`)), { trainLen: 16 }).model);
      const verdicts = checkerVerdicts([path.join(MS, `${name}.onnx`), patched]);
      if (!verdicts) {
        t.skip('python3-onnx is not installed');
        return;
      }
      assert.equal(verdicts[path.join(MS, `${name}.onnx`)], 'ok');
      assert.equal(verdicts[patched], 'ok');
    });
  }

  it('present_fixed_rows: at a fixed query length the expansion has no If (its other branch would not load)', () => {
    const { model } = patchModel(readModel(path.join(MS, 'present_fixed_rows.onnx')), { trainLen: 16 });
    assert.ok(!model.graph!.node.some((n) => n.opType === 'If'));
    const free = patchModel(readModel(path.join(MS, 'present_rows_fp16.onnx')), { trainLen: 16 }).model;
    const branch = free.graph!.node.find((n) => n.opType === 'If')!.attribute[0].g!;
    assert.equal(branch.output[0].type?.tensorType?.elemType, DataType.FLOAT16);
  });
});

describe('one name defined by two Constant nodes, nodes out of order', () => {
  const file = path.join(REGRESS, 'duplicate_constants.onnx');

  it('revert gives back the file\'s bytes', () => {
    const back = revertModel(readModel(writePatched(patchModel(readModel(file), { trainLen: 16 }).model))).model;
    assert.ok(Buffer.from(serializeModel(back)).equals(fs.readFileSync(file)));
  });

  it('the patch equals the SSMax reference', async () => {
    const { model } = patchModel(readModel(file), { s: 0.45 });
    for (const c of loadRef('duplicate_constants', REGRESS).cases) {
      const got = await outputsOf(c.patch ? model : readModel(file), c);
      assert.ok(refError(got, c) < 1e-5, `${c.name}: ${refError(got, c)}`);
    }
  });
});

function writePatched(model: Parameters<typeof writeModel>[1]): string {
  const out = path.join(tmpdir('ssmax-regress-'), 'patched.onnx');
  writeModel(out, model);
  return out;
}
