/**
 * The resolved-options step and the patch journal: the library checks its options before touching the model,
 * --update-s replaces s through the record (and says what it would ignore), and a patch renamed by another tool
 * after patching is still updated and reverted from its structure.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { parseModel, readModel, serializeModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { NOption } from '../src/policy/n-mode';
import { scaleFromTrainLen } from '../src/policy/scale';
import { patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { cliError } from './support/io';
import { TORCH } from './support/ref';

const model = (name: string): ModelProto => readModel(path.join(TORCH, `${name}.onnx`));

describe('options are resolved before the model is touched', () => {
  const m = model('gpt2_decoder');
  const cases: [string, object, RegExp, RegExp][] = [
    ['an unknown n mode', { n: 'bogus' as NOption, s: 0.3 }, /option n must be one of auto, keys, causal, padding, causal-padding, mask; got 'bogus'/, /--n must be/],
    ['an empty layer list', { s: 0.3, layers: [] }, /option layers must list layer indices/, /--layers must list layer indices/],
    ['layers as the command line\'s text', { s: 0.3, layers: '1e0' }, /option layers must be a list of layer indices or \{ every: k \}, got "1e0"/, /--layers must be/],
    ['a layer that is no integer', { s: 0.3, layers: [1.5] }, /option layers must list layer indices/, /--layers must list/],
    ['force that is not a list of names', { s: 0.3, force: 'x' as unknown as string[] }, /option force must be a list of node names/, /--force-site must be/],
    ['an update that would ignore --layers and --n', { s: 0.3, updateS: true, layers: [0], n: 'keys' }, /option updateS replaces s in place .*option layers, option n would be ignored/, /--update-s replaces s .*--layers, --n would be ignored/],
  ];
  for (const [what, options, api, cli] of cases) {
    it(`${what}: the library names its option, the CLI the flag`, () => {
      assert.throws(() => patchModel(m, options), (e: Error) => api.test(e.message) && cliError(cli)(e));
    });
  }
});

describe('--update-s through the record', () => {
  const once = patchModel(model('llama_gqa'), { trainLen: 64 }).model;

  it('replaces every site\'s s initializer in place and records the new s and train length', () => {
    const { model: twice, report } = patchModel(once, { trainLen: 128, updateS: true });
    assert.equal(report.updated, true);
    const record = readRecord(twice)!;
    assert.equal(record.trainLen, 128);
    const g = new Graph(twice.graph!);
    assert.equal(report.sites.length, record.sites.length);
    for (const site of record.sites) {
      assert.equal(site.s, scaleFromTrainLen(128));
      assert.deepEqual(g.constValue(site.sInitializer!)!.values, [Math.fround(scaleFromTrainLen(128))]);
    }
    assert.equal(twice.graph!.node.length, once.graph!.node.length, 'no node added');
    // The journal still undoes the whole patch.
    assert.ok(Buffer.from(serializeModel(revertModel(twice).model)).equals(Buffer.from(serializeModel(model('llama_gqa')))));
  });

  it('keeps the preset: another one is refused, none means the recorded one', () => {
    const qwen = patchModel(model('llama_gqa'), { preset: 'qwen-logn', trainLen: 64 }).model;
    assert.throws(() => patchModel(qwen, { preset: 'ssmax', s: 0.3, updateS: true }), /patched with the qwen-logn preset/);
    const { report } = patchModel(qwen, { trainLen: 256, updateS: true });
    assert.equal(report.preset, 'qwen-logn');
    assert.equal(readRecord(patchModel(qwen, { trainLen: 256, updateS: true }).model)!.trainLen, 256);
  });

  it('a model without a patch: updateS is refused', () => {
    assert.throws(() => patchModel(model('llama_gqa'), { s: 0.3, updateS: true }), /no SSMax patch to update/);
  });
});

describe('renamed by another tool after patching, the record kept', () => {
  const original = model('bert_encoder');
  const patched = patchModel(original, { s: 0.3 }).model;
  const renamed = (): ModelProto => {
    const m = parseModel(serializeModel(patched), 'renamed');
    const fresh = (n: string): string => (n.startsWith('ssmax/') ? n.replace(/^ssmax\//, 'other/') : n);
    for (const n of m.graph!.node) {
      n.name = fresh(n.name);
      n.input = n.input.map(fresh);
      n.output = n.output.map(fresh);
    }
    m.graph!.initializer = m.graph!.initializer.map((t) => ({ ...t, name: fresh(t.name) }));
    return m;
  };

  it('--update-s falls back to the structure and changes every s', () => {
    const { model: m, report } = patchModel(renamed(), { s: 0.5, updateS: true });
    assert.equal(report.sites.length, 2);
    const g = new Graph(m.graph!);
    for (const s of report.sites) {
      assert.match(s.sInitializer, /^other\//);
      assert.deepEqual(g.constValue(s.sInitializer)?.values, [0.5]);
    }
  });

  it('revert says the journal could not be replayed and reverts from the structure', () => {
    const { model: m, report } = revertModel(renamed());
    assert.equal(report.method, 'structure');
    assert.match(report.note!, /no longer reads|not in the model/);
    assert.equal(m.graph!.node.length, original.graph!.node.length);
  });
});

describe('revert replays exactly what was done', () => {
  it('t5_decoder: the 2 patched sites, not the model\'s own position-bias scaling', () => {
    const patched = patchModel(model('t5_decoder'), { trainLen: 16 }).model;
    const { report } = revertModel(patched);
    assert.equal(report.method, 'journal');
    assert.equal(report.sites.length, 2);
    assert.ok(report.sites.every((s) => s.removedNodes > 0));
  });
});
