/**
 * `revert` removes a patch and gives back the original: byte for byte for a model this tool patched, and
 * with equal outputs on onnxruntime (the torch fixtures' reference inputs). An existing patch is found from
 * the graph, not only from the metadata record: by node names, and by structure when names were changed.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { Graph } from '../src/graph/graph';
import { parseModel, readModel, serializeModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { encodeAs } from '../src/io/proto';
import { patchModel } from '../src/rewrite/patch';
import { RECORD_KEY } from '../src/identity';
import { revertModel } from '../src/rewrite/revert';
import { Outputs, Runner } from '../src/verify/run';
import { assertOneLineError, cli, cliError, removeScratch, tmpdir } from './support/io';
import { feedsOf, loadRef, TORCH } from './support/ref';

const MODELS = ['bert_encoder', 'encoder_3d', 'gpt2_decoder', 'gpt2_past', 'llama_gqa', 'classifier'];

async function outputs(bytes: Uint8Array, name: string): Promise<Outputs> {
  const runner = await Runner.create(bytes, name);
  const out = await runner.run(feedsOf(loadRef(name).cases[0]));
  await runner.release();
  return out;
}

function assertSame(a: Outputs, b: Outputs): void {
  assert.deepEqual(Object.keys(a).sort(), Object.keys(b).sort());
  for (const k of Object.keys(a)) assert.deepEqual(a[k].data, b[k].data, `output ${k} differs`);
}

/** A patched model as another tool might leave it: no metadata record, and every ssmax name replaced. */
function anonymised(patched: ModelProto): Uint8Array {
  const m = parseModel(serializeModel(patched), 'patched');
  m.metadataProps = m.metadataProps.filter((p) => p.key !== RECORD_KEY);
  const g = m.graph!;
  const rename = new Map<string, string>();
  const fresh = (n: string): string => {
    if (!n.startsWith('ssmax/')) return n;
    if (!rename.has(n)) rename.set(n, `t${rename.size}`);
    return rename.get(n)!;
  };
  for (const n of g.node) {
    n.name = fresh(n.name);
    n.input = n.input.map(fresh);
    n.output = n.output.map(fresh);
  }
  g.initializer = g.initializer.map((t) => ({ ...t, name: fresh(t.name) }));
  assert.ok(rename.size > 5);
  return serializeModel(m);
}

describe('revert', () => {
  after(removeScratch);
  for (const name of MODELS) {
    it(`${name}: revert of the patch is the original file, byte for byte, with equal outputs`, async () => {
      const file = path.join(TORCH, `${name}.onnx`);
      const original = fs.readFileSync(file);
      const patched = serializeModel(patchModel(readModel(file), { trainLen: 16 }).model);
      const { model, report } = revertModel(parseModel(patched, 'patched'));
      assert.equal(report.sites.length, loadRef(name).num_layers);
      assert.equal(report.hadRecord, true);
      const back = serializeModel(model);
      assert.ok(Buffer.from(back).equals(original), 'reverted bytes differ from the original');
      assertSame(await outputs(back, name), await outputs(original, name));
    });
  }

  it('the CLI writes the reverted model and reports each site', () => {
    const dir = tmpdir();
    const input = path.join(dir, 'gpt2.onnx');
    fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), input);
    assert.equal(cli([input, '--train-len', '64', '-o', path.join(dir, 'gpt2.ssmax.onnx')]).code, 0);
    const r = cli(['revert', path.join(dir, 'gpt2.ssmax.onnx')]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /reverted 2 SSMax site\(s\)/);
    assert.match(r.stdout, /L0 .* s=0\.2404 .*removed \d+ nodes/);
    assert.ok(fs.readFileSync(path.join(dir, 'gpt2.reverted.onnx')).equals(fs.readFileSync(input)));
    const json = JSON.parse(cli(['revert', path.join(dir, 'gpt2.ssmax.onnx'), '-o', path.join(dir, 'again.onnx'), '--json']).stdout);
    assert.equal(json.sites.length, 2);
  });

  it('IR 3 (every initializer also a graph input): the new inputs go too, and the revert is exact', () => {
    const m = smallTransformer({ layers: 2, d: 16, heads: 2, ff: 16, vocab: 20, tmax: 8 });
    m.irVersion = 3;
    for (const t of m.graph!.initializer) {
      m.graph!.input.push({ name: t.name, type: { tensorType: { elemType: t.dataType, shape: { dim: t.dims.map((d) => ({ dimValue: d })) } } } });
    }
    const original = encodeAs('ModelProto', m);
    const patched = serializeModel(patchModel(parseModel(original, 'ir3'), { s: 0.3 }).model);
    assert.ok(parseModel(patched, 'patched').graph!.input.length > m.graph!.input.length);
    assert.throws(() => patchModel(parseModel(patched, 'patched'), { s: 0.3 }), /already patched/);
    const back = serializeModel(revertModel(parseModel(patched, 'patched')).model);
    assert.ok(Buffer.from(back).equals(Buffer.from(original)));
  });

  it('a model without a patch: one line, exit 2, nothing written', () => {
    const dir = tmpdir();
    const input = path.join(dir, 'bert.onnx');
    fs.copyFileSync(path.join(TORCH, 'bert_encoder.onnx'), input);
    assertOneLineError(cli(['revert', input, '-o', path.join(dir, 'out.onnx')]), 2, /no SSMax patch in this model/);
    assert.deepEqual(fs.readdirSync(dir), ['bert.onnx']);
  });
});

describe('an existing patch is found from the graph', () => {
  after(removeScratch);
  const file = path.join(TORCH, 'bert_encoder.onnx');
  const patched = patchModel(readModel(file), { s: 0.3 }).model;

  it('without the metadata record: patching again is refused; --update-s changes s', () => {
    const m = parseModel(serializeModel(patched), 'patched');
    m.metadataProps = m.metadataProps.filter((p) => p.key !== RECORD_KEY);
    assert.throws(() => patchModel(m, { s: 0.5 }), (e: Error) => /already patched \(2 SSMax sites\).*option updateS/.test(e.message) && cliError(/already patched.*--update-s/)(e));
    const { model, report } = patchModel(m, { s: 0.5, updateS: true });
    assert.equal(report.updated, true);
    const g = new Graph(model.graph!);
    for (const s of report.sites) assert.deepEqual(g.constValue(s.sInitializer)?.values, [0.5]);
  });

  it('with every ssmax name changed too: refused, --update-s finds the s initializers, revert restores the outputs', async () => {
    const bytes = anonymised(patched);
    const m = parseModel(bytes, 'anonymised');
    assert.ok(!m.graph!.node.some((n) => n.name.startsWith('ssmax/')));
    assert.throws(() => patchModel(m, { s: 0.5 }), /already patched/);
    const { model, report } = patchModel(m, { s: 0.5, updateS: true });
    const g = new Graph(model.graph!);
    assert.equal(report.sites.length, 2);
    for (const s of report.sites) {
      assert.match(s.sInitializer, /^t\d+$/);
      assert.deepEqual(g.constValue(s.sInitializer)?.values, [0.5]);
    }
    const reverted = revertModel(m);
    assert.equal(reverted.report.sites.length, 2);
    assert.equal(reverted.report.hadRecord, false);
    const back = serializeModel(reverted.model);
    assert.equal(parseModel(back, 'back').graph!.node.length, readModel(file).graph!.node.length);
    assertSame(await outputs(back, 'bert_encoder'), await outputs(fs.readFileSync(file), 'bert_encoder'));
  });

  it('the CLI refuses a second patch of an anonymised patched model', () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'p.onnx'), anonymised(patched));
    assertOneLineError(cli([path.join(dir, 'p.onnx'), '--s', '0.3', '-o', path.join(dir, 'twice.onnx')]), 2, /already patched.*--update-s/);
    assert.deepEqual(fs.readdirSync(dir), ['p.onnx']);
  });
});
