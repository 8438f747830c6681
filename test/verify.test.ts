/** Each verification check passes on a correct patch and fails on a patch broken in the way it guards against. */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { makeTensor } from '../src/graph/tensor';
import { readModel } from '../src/io/model-file';
import { DataType, ModelProto, toNumber } from '../src/io/onnx';
import { cloneModel, patchModel } from '../src/rewrite/patch';
import { verifyPatch, VerifyReport, withUnitFactor } from '../src/verify/verify';
import { TORCH } from './support/ref';

const L = 32;
const original = readModel(path.join(TORCH, 'bert_encoder.onnx'));
const patched = patchModel(original, { trainLen: L, n: 'keys' }).model;

function status(r: VerifyReport, name: RegExp): string {
  const c = r.checks.find((k) => name.test(k.name));
  assert.ok(c, `no check ${name}`);
  return c.status;
}

/** A copy of `m` with every s initializer set to `value`. */
function withS(m: ModelProto, value: number): ModelProto {
  const copy = cloneModel(m);
  const g = copy.graph!;
  g.initializer = g.initializer.map((t) => (/^ssmax\/L\d+\/s$/.test(t.name) ? makeTensor(t.name, DataType.FLOAT, t.dims.map(toNumber), [value]) : t));
  return copy;
}

describe('verifyPatch', () => {
  it('passes all five checks on a correct retrofit patch', async () => {
    const r = await verifyPatch(original, patched, { lengths: [8, L, 4 * L] });
    assert.equal(r.passed, true, JSON.stringify(r.checks.map((c) => [c.name, c.status, c.summary])));
    assert.deepEqual(r.checks.map((c) => c.status), ['PASSED', 'PASSED', 'PASSED', 'PASSED', 'PASSED']);
  });

  it('retrofit parity fails when s is not 1/ln L at n = L', async () => {
    // The record still says s = 1/ln L; the graph's s is off by 30 %: the outputs at n = L must show it.
    const r2 = await verifyPatch(original, withS(patched, 1.3 / Math.log(L)), { lengths: [L] });
    assert.equal(status(r2, /retrofit/), 'FAILED');
    assert.equal(r2.passed, false);
  });

  it('wiring parity fails when the patch changed anything besides the factor', async () => {
    const broken = cloneModel(patched);
    const g = new Graph(broken.graph!);
    const div = g.nodes.find((n) => n.opType === 'Div' && g.constValue(n.input[1])?.values[0] !== undefined)!;
    const scale = g.constValue(div.input[1])!;
    broken.graph!.initializer.push(makeTensor('wrong_scale', DataType.FLOAT, scale.dims, scale.values.map((v) => v * 1.1)));
    div.input[1] = 'wrong_scale';
    const r = await verifyPatch(original, broken, { lengths: [8] });
    assert.equal(status(r, /wiring/), 'FAILED');
  });

  it('liveness fails when the factor does nothing', async () => {
    const r = await verifyPatch(original, withUnitFactor(patched), { lengths: [8, 4 * L] });
    assert.equal(status(r, /liveness/), 'FAILED');
  });

  it('liveness fails when the factor overflows the logits into NaN', async () => {
    const r = await verifyPatch(original, withS(patched, 1e38), { lengths: [8] });
    const live = r.checks.find((c) => c.id === 'liveness')!;
    assert.equal(live.status, 'FAILED');
    assert.match(live.summary, /NaN\/Inf values where the original's are finite/);
  });
});
