/**
 * Graphs onnxruntime runs, the tool runs: nodes stored out of topological order, and a name defined by several
 * initializers or Constant nodes (onnxruntime keeps the last Constant node, else the last initializer). Each is
 * patched with a note saying so; the patched model computes what the same model written cleanly computes once
 * patched, and revert gives back the input file byte for byte.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { makeTensor } from '../src/graph/tensor';
import { encodeModel, readModel } from '../src/io/model-file';
import { DataType, ModelProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { withUnitFactor } from '../src/verify/verify';
import { i64, maxDiff, runOnce } from './support/attention';
import { node } from './support/build';
import { assertOneLineError, cli, removeScratch, tmpdir } from './support/io';

after(removeScratch);

const SPEC = { layers: 2, d: 16, heads: 2, ff: 16, vocab: 30, tmax: 12 };
const ids = (seq: number) => ({ input_ids: i64([2, seq], Array.from({ length: 2 * seq }, (_, i) => (i * 7) % 30)) });

/**
 * The causal mask constant defined twice: the real one and a decoy (all ones: no mask), ordered so that
 * onnxruntime uses the real one: the last definition for tensors under 128 bytes (tmax 4: 64 bytes), the first
 * from 128 bytes on (tmax 12: 576 bytes). `decoyTmax` gives the decoy another size.
 */
function withDecoy(kind: 'initializers' | 'constant-node', tmax: number, decoyTmax = tmax): ModelProto {
  const m = smallTransformer({ ...SPEC, tmax });
  const g = m.graph!;
  const i = g.initializer.findIndex((t) => t.name === 'causal_tri');
  const real = g.initializer[i];
  const decoy = { ...makeTensor('causal_tri', DataType.INT32, [decoyTmax ** 2], new Array(decoyTmax ** 2).fill(1)), dims: [1, 1, decoyTmax, decoyTmax] };
  const realFirst = tmax * tmax * 4 >= 128;
  if (kind === 'initializers') g.initializer.splice(realFirst ? i + 1 : i, 0, decoy);
  else {
    // Constant nodes count after every initializer.
    const constant = (t: typeof real, name: string) => node('Constant', [], ['causal_tri'], { value: { ...t, name: '' } }, name);
    g.initializer[i] = realFirst ? real : decoy;
    g.node.unshift(constant(realFirst ? decoy : real, 'causal_tri_constant'));
  }
  return m;
}

async function same(a: ModelProto, b: ModelProto, seq = 9): Promise<number> {
  return maxDiff(await runOnce(a, ids(seq), 'logits'), await runOnce(b, ids(seq), 'logits'));
}

describe('what onnxruntime accepts', () => {
  it('nodes out of topological order: patched with a note, written sorted; revert restores the file exactly', async () => {
    const m = smallTransformer(SPEC);
    m.graph!.node.push(m.graph!.node.shift()!, m.graph!.node.shift()!);
    const dir = tmpdir('ssmax-accepts-');
    const input = path.join(dir, 'unsorted.onnx');
    fs.writeFileSync(input, encodeModel(m));
    const out = path.join(dir, 'out.onnx');
    const r = cli([input, '--train-len', '8', '-o', out]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /note: nodes out of topological order in the graph: node '.*' reads '.*' before node '.*' produces it: written sorted/);
    const clean = patchModel(smallTransformer(SPEC), { trainLen: 8 }).model;
    assert.ok(await same(readModel(out), clean) < 1e-6);
    assert.equal(cli([input, '--train-len', '8', '-o', path.join(dir, 'again.onnx'), '--sort-nodes']).code, 2, 'the flag of an older version is gone: unknown option');
    const back = path.join(dir, 'back.onnx');
    assert.equal(cli(['revert', out, '-o', back]).code, 0);
    assert.ok(fs.readFileSync(back).equals(fs.readFileSync(input)), 'revert did not give back the unsorted file');
  });

  for (const [kind, tmax] of [['initializers', 4], ['initializers', 12], ['constant-node', 4], ['constant-node', 12]] as const) {
    it(`a mask defined twice (${kind}, ${tmax * tmax * 4} bytes): the definition onnxruntime uses decides n; revert is exact`, async () => {
      const m = withDecoy(kind, tmax);
      const clean = smallTransformer({ ...SPEC, tmax });
      assert.ok(await same(m, clean, tmax) < 1e-6, 'test setup: onnxruntime does not use the definition the test expects');
      const { model: patched, report } = patchModel(m, { trainLen: 8 });
      assert.match(report.notes.join('\n'), /'causal_tri' is defined 2 times .* as onnxruntime reads it/);
      assert.deepEqual(report.sites.map((s) => s.n), ['causal', 'causal'], 'n must come from the triangular definition');
      assert.ok(await same(patched, patchModel(clean, { trainLen: 8 }).model, tmax) < 1e-6, 'the patched model differs from the clean one patched');
      assert.ok(await same(withUnitFactor(patched), m, tmax) < 1e-6, 'with factor 1 the patched model is not the original');
      const dir = tmpdir('ssmax-accepts-');
      const input = path.join(dir, 'dup.onnx');
      fs.writeFileSync(input, encodeModel(m));
      assert.equal(cli([input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')]).code, 0);
      assert.equal(cli(['revert', path.join(dir, 'out.onnx'), '-o', path.join(dir, 'back.onnx')]).code, 0);
      assert.ok(fs.readFileSync(path.join(dir, 'back.onnx')).equals(fs.readFileSync(input)));
    });
  }

  it('definitions that differ in value on both sides of the 128-byte threshold: refused, onnxruntime\'s choice is not defined', () => {
    const dir = tmpdir('ssmax-accepts-');
    const input = path.join(dir, 'dup.onnx');
    fs.writeFileSync(input, encodeModel(withDecoy('initializers', 12, 4)));
    assertOneLineError(cli([input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')]), 2, /'causal_tri' is defined 2 times with different values .* keep one definition/);
  });
});
