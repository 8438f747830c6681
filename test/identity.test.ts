/**
 * The patch's own names (src/identity.ts) are how a patched model whose record another tool stripped is still
 * recognised, so what the patch builds and what identity.ts recognises must agree: on real patches, every node the
 * journal lists is named as the patch's, each factor's Mul as the apply node of its layer, each s and each function
 * input passing s as s, and no node of the original model as the patch's. A record without its journal (only
 * pre-release versions wrote one) is not read: the patch is found from those names, as when the record is gone.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { modelScopes } from '../src/graph/scopes';
import { parseModel, readModel, serializeModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { applyLayer, isApplyNode, isPatchNode, isScaleName, RECORD_KEY } from '../src/identity';
import { patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { Runner } from '../src/verify/run';
import { PREFIX as VERIFY_PREFIX } from '../src/verify/nodes';
import { verifyPatch } from '../src/verify/verify';
import { feedsOf, FIXTURES, loadRef, TORCH } from './support/ref';

const CASES: [string, Parameters<typeof patchModel>[1]][] = [
  ['torch/bert_encoder.onnx', { trainLen: 64 }],
  ['torch/attn_functions.onnx', { trainLen: 64, prior: 'ggd' }],
  ['ms_attention/gpt2_causal_past_fp16.onnx', { trainLen: 64 }],
  ['ms_attention/mask_1d_lengths.onnx', { trainLen: 64, n: 'mask' }],
  ['onnx_attention/softcap_fp16.onnx', { trainLen: 64 }],
];

describe('the names the patch gives are the names identity.ts recognises', () => {
  for (const [file, options] of CASES) {
    it(`${file}: every inserted node, factor and s, and none of the model's own nodes`, () => {
      const original = readModel(path.join(FIXTURES, file));
      for (const scope of modelScopes(original)) for (const n of scope.graph.nodes) assert.ok(!isPatchNode(n), `original node '${n.name}'`);
      const patched = patchModel(original, options).model;
      const record = readRecord(patched)!;
      const byPath = new Map(modelScopes(patched).map((s) => [s.path, s]));
      for (const e of record.journal.filter((x) => !x.opset)) {
        const graph = byPath.get(e.scope)!.graph;
        for (const name of e.nodes) assert.ok(isPatchNode(graph.nodes.find((n) => n.name === name)!), `inserted node '${name}'`);
        for (const name of e.initializers) assert.ok(isPatchNode({ name }), `inserted initializer '${name}'`);
      }
      // The inputs through which each call passes s: one per function body, none in graphs.
      for (const scope of byPath.values()) {
        const added = record.journal.filter((e) => e.scope === scope.path).flatMap((e) => e.inputs);
        assert.equal(added.filter((name) => isScaleName(name, 'input')).length, scope.kind === 'function' ? 1 : 0, scope.path);
      }
      const factors = record.sites.filter((r) => r.apply !== undefined);
      assert.ok(factors.length > 0);
      for (const r of factors) {
        assert.ok(isApplyNode({ name: r.apply! }), r.apply);
        // A call's factor is in the function body, named after the body's layer; every other one after its own.
        if (r.call === undefined) assert.equal(applyLayer(r.apply!), r.layer, r.apply);
        assert.ok(isScaleName(r.sInitializer!, 'constant'), r.sInitializer);
      }
    });
  }
});

describe('verification\'s names', () => {
  it('are never taken for the patch\'s', () => {
    for (const base of ['L0/apply', 'L0/s', 's', 'x/last_rows']) {
      const name = `${VERIFY_PREFIX}${base}`;
      assert.ok(!isPatchNode({ name }) && !isApplyNode({ name }) && applyLayer(name) === null && !isScaleName(name, 'input'), name);
    }
  });
});

describe('a record without its journal is not read', () => {
  const name = 'bert_encoder';
  const file = path.join(TORCH, `${name}.onnx`);
  const withoutJournal = (): ModelProto => {
    const m = patchModel(readModel(file), { s: 0.3 }).model;
    const entry = m.metadataProps.find((p) => p.key === RECORD_KEY)!;
    const record = JSON.parse(entry.value) as Record<string, unknown>;
    delete record.journal;
    entry.value = JSON.stringify(record);
    return parseModel(serializeModel(m), 'patched');
  };

  it('patching again is refused from the names; revert finds the factors from them and gives back the outputs', async () => {
    const m = withoutJournal();
    assert.equal(readRecord(m), null);
    assert.throws(() => patchModel(m, { s: 0.5 }), /already patched \(2 SSMax sites\)/);
    const { model, report } = revertModel(m);
    assert.equal(report.method, 'structure');
    assert.equal(report.hadRecord, true);
    assert.deepEqual(report.sites.map((s) => [s.layer, s.s]), [[0, 0.3], [1, 0.3]].map(([l, s]) => [l, Math.fround(s)]));
    assert.equal(model.metadataProps.some((p) => p.key === RECORD_KEY), false);
    assert.equal(model.graph!.node.length, readModel(file).graph!.node.length);
    const run = async (bytes: Uint8Array): Promise<Float32Array[]> => {
      const runner = await Runner.create(bytes, name);
      const out = await runner.run(feedsOf(loadRef(name).cases[0]));
      await runner.release();
      return Object.keys(out).sort().map((k) => out[k].data as Float32Array);
    };
    assert.deepEqual(await run(serializeModel(model)), await run(serializeModel(readModel(file))));
  });

  it('verification says the model has no record it can use', async () => {
    await assert.rejects(verifyPatch(readModel(file), withoutJournal()), /no ssmax-patch record .*with its sites and journal/);
  });
});
