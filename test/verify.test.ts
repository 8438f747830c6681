/** Each verification check passes on a correct patch and fails on a patch broken in the way it guards against. */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { makeTensor } from '../src/graph/tensor';
import { readModel } from '../src/io/model-file';
import { DataType, ModelProto, toNumber } from '../src/io/onnx';
import { cloneModel, patchModel } from '../src/rewrite/patch';
import { verifyPatch, VerifyReport, withUnitFactor } from '../src/verify/verify';
import { compareOutputs } from '../src/verify/compare';
import type { Outputs } from '../src/verify/run';
import { parityCheck } from '../src/verify/checks/common';
import { RunResult } from '../src/verify/report';
import { sharpnessSvg } from '../src/verify/plot';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import { TORCH } from './support/ref';
import { removeScratch, tmpdir } from './support/io';

after(removeScratch);

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
    // The scale changed in place (same initializer, same shape): a pair of models, wired differently.
    const wrong = makeTensor(div.input[1], DataType.FLOAT, scale.dims, scale.values.map((v) => v * 1.1));
    const at = broken.graph!.initializer.findIndex((t) => t.name === div.input[1]);
    if (at >= 0) broken.graph!.initializer[at] = wrong;
    else g.producer.get(div.input[1])!.attribute[0] = { ...g.producer.get(div.input[1])!.attribute[0], t: { ...wrong, name: '' } };
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

  it('attention sharpness fails when the patched model fades like the original (factor forced to 1)', async () => {
    const llama = readModel(path.join(TORCH, 'llama_gqa.onnx'));
    const dead = withUnitFactor(patchModel(llama, { trainLen: 64 }).model);
    const r = await verifyPatch(llama, dead, { checks: ['sharpness'], lengths: [16, 64, 256] });
    const c = r.checks.find((k) => k.id === 'sharpness')!;
    assert.equal(c.status, 'FAILED', c.summary);
    assert.match(c.summary, /the patched model fades like the original/);
    assert.equal(r.sharpness!.kept, 0);
  });

  it('retrofit parity holds for one new token after L − 1 cached ones (causal n with a KV cache)', async () => {
    const gpt2 = readModel(path.join(TORCH, 'gpt2_past.onnx'));
    const r = await verifyPatch(gpt2, patchModel(gpt2, { trainLen: 64 }).model, { checks: ['retrofit'] });
    const c = r.checks.find((k) => k.id === 'retrofit')!;
    assert.equal(c.status, 'PASSED', c.summary);
    assert.deepEqual(c.runs.map((x) => x.run), ['batch=1 seq=1 past=63']);
  });
});

describe('pinned lengths', () => {
  it('--dim seq=N fixes the sequence length of every run; retrofit parity still runs when N = L', async () => {
    const r = await verifyPatch(original, patched, { dims: { seq: L } });
    assert.ok(r.runs.every((x) => x.seq === L), JSON.stringify(r.runs.map((x) => x.id)));
    assert.deepEqual(r.sweep, []);
    const retrofit = r.checks.find((c) => c.id === 'retrofit')!;
    assert.equal(retrofit.status, 'PASSED', retrofit.summary);
    assert.equal(r.checks.find((c) => c.id === 'sharpness')!.status, 'SKIPPED');
  });
});

describe('Polygraphy-style statistics', () => {
  it('report max/mean abs error, max rel error, and the smallest atol and rtol that pass', () => {
    const out = (data: number[]): { y: { dims: number[]; data: Float64Array } } => ({ y: { dims: [4], data: Float64Array.from(data) } });
    const [s] = compareOutputs(out([1.1, 2, 0.001, -4.4]), out([1, 2, 0, -4]), { atol: 0.01, rtol: 0.05 });
    assert.ok(Math.abs(s.maxAbs - 0.4) < 1e-12 && Math.abs(s.meanAbs - 0.501 / 4) < 1e-12);
    assert.equal(s.maxRel, Infinity, '0.001 against an expected 0');
    assert.equal(s.mismatches, 2, 'elements 0 and 3 exceed both tolerances; element 2 is within atol');
    assert.ok(Math.abs(s.neededAtol - 0.4) < 1e-12, 'with rtol 0.05: the largest error among elements outside rtol');
    assert.ok(Math.abs(s.neededRtol - 0.1) < 1e-12, 'with atol 0.01: the largest relative error among elements outside atol');
    assert.equal(s.passed, false);
    const [ok] = compareOutputs(out([1.1, 2, 0.001, -4.4]), out([1, 2, 0, -4]), { atol: s.neededAtol, rtol: 0.05 });
    assert.equal(ok.passed, true);
    const [nan] = compareOutputs(out([1, NaN, 0, 0]), out([1, 2, 0, 0]));
    assert.equal(nan.newNonFinite, 1);
  });

  it('a passing output is described by its error on the output\'s scale (max |a − e| / max |e|), not by a relative error that values near 0 inflate', () => {
    const out = (data: number[]): { y: { dims: number[]; data: Float64Array } } => ({ y: { dims: [3], data: Float64Array.from(data) } });
    const run = (actual: number[], expected: number[]): RunResult => {
      const outputs = compareOutputs(out(actual), out(expected), { atol: 1e-2, rtol: 1e-2 });
      return { run: 'batch=1 seq=4', length: { batch: 1, seq: 4, past: 0 }, padded: false, outputs, passed: outputs.every((o) => o.passed) };
    };
    const tol = { atol: 1e-2, rtol: 1e-2 };
    // fp16-like: 2e-4 off an expected 0 (relative error Infinity) and 2e-3 off 8: 2.5e-4 of the scale 8.
    const near0 = run([2e-4, 8.002, -3], [0, 8, -3]);
    assert.equal(near0.outputs[0].maxRel, Infinity);
    const passed = parityCheck('wiring', 'c', [near0], tol, 'equal');
    assert.equal(passed.status, 'PASSED');
    assert.match(passed.summary, /y: max abs 2\.0e-3 \(2\.5e-4 of its largest \|value\| 8\.0e\+0\), mean abs 7\.3e-4$/);
    assert.doesNotMatch(passed.summary, /max rel|Infinity/);
    // A failing output keeps the relative error: it says which rtol would pass.
    const failed = parityCheck('wiring', 'c', [run([1, 8, -3], [0, 8, -3])], tol, 'equal');
    assert.equal(failed.status, 'FAILED');
    assert.match(failed.summary, /max abs 1\.0e\+0 \(1\.3e-1 of its largest \|value\| 8\.0e\+0\), mean abs 3\.3e-1, max rel Infinity; 1 of 3 elements outside/);
    // The worst of two outputs is the worse on its own scale: 2e-3 off 0.5 (4e-3 of it), not 1e-4 off an expected 0
    // in an output of scale 800 (relative error Infinity, 1.3e-7 of its scale).
    const two = (a: Record<string, number[]>, e: Record<string, number[]>): RunResult => {
      const wrap = (m: Record<string, number[]>): Outputs => Object.fromEntries(Object.entries(m)
        .map(([k, v]) => [k, { dims: [v.length], data: Float64Array.from(v) }]));
      const outputs = compareOutputs(wrap(a), wrap(e), tol);
      return { run: 'r', length: { batch: 1, seq: 4, past: 0 }, padded: false, outputs, passed: true };
    };
    const worst = parityCheck('wiring', 'c', [two({ big: [800, 1e-4], small: [0.502] }, { big: [800, 0], small: [0.5] })], tol, 'equal');
    assert.match(worst.summary, /worst r small: max abs 2\.0e-3 \(4\.0e-3 of its largest/);
  });

  it('a run where the original is NaN everywhere is not a parity pass: two NaNs agree without anything compared', () => {
    const out = (data: number[]): { y: { dims: number[]; data: Float64Array } } => ({ y: { dims: [2], data: Float64Array.from(data) } });
    const run = (actual: number[], expected: number[]): RunResult => {
      const outputs = compareOutputs(out(actual), out(expected));
      return { run: 'batch=1 seq=4', length: { batch: 1, seq: 4, past: 0 }, padded: false, outputs, passed: outputs.every((o) => o.passed) };
    };
    const tol = { atol: 1e-5, rtol: 1e-5 };
    const blind = parityCheck('wiring', 'c', [run([NaN, NaN], [NaN, NaN])], tol, 'equal');
    assert.equal(blind.status, 'SKIPPED');
    assert.equal(blind.skip, 'not checked', 'counts against --strict');
    assert.match(blind.summary, /original's y is NaN or Inf everywhere/);
    assert.equal(parityCheck('wiring', 'c', [run([NaN, 1], [NaN, 1])], tol, 'equal').status, 'PASSED', 'one NaN the patch keeps: the rest compared');
    assert.equal(run([NaN, 1], [NaN, 1]).outputs[0].expectedNonFinite, 1);
  });
});

describe('sharpness plot', () => {
  const curve = {
    trainLen: 64, rows: 64, originalFall: 0.8, patchedFall: 0.05, kept: 0.75,
    points: [16, 64, 256, 1024].map((length, i) => ({ length, original: 0.6 / (1 + i), patched: 0.5 - 0.01 * i, originalLayers: [], patchedLayers: [] })),
  };
  it('draws two curves on a log-scale x axis with axes, labels and a legend', () => {
    const svg = sharpnessSvg(curve, { title: 'a <title> & more' });
    assert.match(svg, /a &lt;title&gt; &amp; more/);
    const xs = [...svg.matchAll(/<circle cx="([\d.]+)"/g)].map((m) => Number(m[1])).slice(0, 4);
    const gaps = xs.slice(1).map((x, i) => x - xs[i]);
    assert.ok(gaps.every((g) => Math.abs(g - gaps[0]) < 0.2), `equal gaps for ×4 steps on a log axis: ${gaps}`);
    for (const label of ['mean max attention probability', 'context length n (tokens, log scale)', 'original (softmax)', 'patched (SSMax)']) assert.ok(svg.includes(label), label);
  });

  const rsvg = spawnSync('rsvg-convert', ['--version']).status === 0;
  it('renders to PNG with rsvg-convert', { skip: rsvg ? false : 'rsvg-convert not installed (apt-get install librsvg2-bin)' }, () => {
    const dir = tmpdir('ssmax-plot-');
    fs.writeFileSync(path.join(dir, 'p.svg'), sharpnessSvg(curve, { title: 'render' }));
    const r = spawnSync('rsvg-convert', [path.join(dir, 'p.svg'), '-o', path.join(dir, 'p.png')], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const png = fs.readFileSync(path.join(dir, 'p.png'));
    assert.equal(png.subarray(1, 4).toString(), 'PNG');
    assert.equal(png.readUInt32BE(16), 760, 'width');
    assert.equal(png.readUInt32BE(20), 460, 'height');
  });
});

describe('the report committed under docs/', () => {
  it('is what verify computes for the llama_gqa fixture today', async () => {
    const committed = JSON.parse(fs.readFileSync(path.resolve(__dirname, '../../docs/verify-llama_gqa.json'), 'utf8'));
    const llama = readModel(path.join(TORCH, 'llama_gqa.onnx'));
    const r = await verifyPatch(llama, patchModel(llama, { trainLen: 64 }).model);
    assert.deepEqual(committed.checks.map((c: { status: string }) => c.status), r.checks.map((c) => c.status));
    assert.deepEqual(committed.sweep, r.sweep);
    committed.sharpness.points.forEach((p: { original: number; patched: number }, i: number) => {
      assert.ok(Math.abs(p.original - r.sharpness!.points[i].original) < 1e-5 && Math.abs(p.patched - r.sharpness!.points[i].patched) < 1e-5);
    });
  });
});
