/**
 * `ssmax-patch calibrate`: s of the slope preset chosen for N from the model's own attention. On a trained model
 * (the quality benchmark's RoPE model, plain ops) the s written makes the mean largest probability of the rows at
 * n ≈ N equal its value at n ≈ L, read here independently of calibration from the written model's Softmax
 * outputs; the same model with its attention fused into com.microsoft MultiHeadAttention gets the same s (per head
 * too: a head axis read wrongly would change them); a fused corpus model with random weights (uniform attention)
 * is read and refused with the reason; the calibrated patch passes verify --strict; bad input is one line, exit 2.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import Ajv2020 from 'ajv/dist/2020';
import { evalSet, TASK } from '../bench/quality-data';
import { qualityModel } from '../bench/quality';
import { calibrationModel } from '../src/calibrate/model';
import { gapOf, predictSlope, SlopeSearch } from '../src/calibrate/search';
import { CalibrateDocument } from '../src/cli/report';
import { findAttentionSoftmax } from '../src/detect/find-attention';
import { findValueMatMul } from '../src/detect/trace';
import { Graph } from '../src/graph/graph';
import { encodeModel, readModel } from '../src/io/model-file';
import { NodeProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { Exposer } from '../src/verify/expose';
import { Runner } from '../src/verify/run';
import { prepare } from '../src/verify/setup';
import { synthesize } from '../src/verify/inputs';
import { describeInputs } from '../src/analysis/signature';
import { buildDecoder } from '../bench/decoder';
import { makeHost } from '../src/verify/tensors';
import { cli, removeScratch, tmpdir } from './support/io';
import { CORPUS, corpusSkip } from './support/ref';
import { fuseQualityModel } from './support/quality-fused';

const L = TASK.trainLen;
const N = 8 * L;
const dir = tmpdir('ssmax-calibrate-');
after(removeScratch);

const rope = qualityModel('rope-s0');
const fused = path.join(dir, 'rope-fused.onnx');
fs.writeFileSync(fused, encodeModel(fuseQualityModel(readModel(rope))));

/** Token ids [2, N] of the benchmark's task, as a JSON tensor file. */
const tokens = evalSet(7, 'sparse', N, 2).tokens;
const tokenFile = path.join(dir, 'ids.json');
fs.writeFileSync(tokenFile, JSON.stringify({ dims: [2, N], data: Array.from(tokens, Number) }));

const schema = new Ajv2020({ allErrors: true, strictTypes: false }).compile(JSON.parse(fs.readFileSync(path.resolve(__dirname, '../../docs/report.schema.json'), 'utf8')));

function calibrate(model: string, name: string, ...extra: string[]): { code: number; doc: CalibrateDocument; out: string; stderr: string } {
  const out = path.join(dir, `${name}.onnx`);
  const r = cli(['calibrate', model, '--train-len', String(L), '-o', out, '--json', '--quiet', ...extra]);
  assert.ok(schema(JSON.parse(r.stdout)), `the report's schema: ${JSON.stringify(schema.errors)}`);
  return { code: r.code, doc: JSON.parse(r.stdout) as CalibrateDocument, out, stderr: r.stderr };
}

/** The mean largest probability of the rows 3X/4 < n ≤ X of every Softmax of a plain-op model, on `tokens`. */
async function meanMax(file: string, windows: number[]): Promise<number[]> {
  const model = readModel(file);
  const x = new Exposer(model);
  const outs = findAttentionSoftmax(model).sites.map((s) => x.expose('main', s.softmax.output[0], `test/L${s.layer}`) as string);
  x.finish();
  const runner = await Runner.fromModel(model, 'test');
  const result = await runner.run({ input_ids: makeHost('int64', [2, N], Array.from(tokens, Number)) }, outs);
  await runner.release();
  return windows.map((w) => {
    let sum = 0, count = 0;
    for (const o of outs) {
      const t = result[o];
      for (let r = 0; r < t.data.length / N; r++) {
        const n = (r % N) + 1;
        if (n <= Math.floor((3 * w) / 4) || n > w) continue;
        let max = 0;
        for (let j = r * N; j < (r + 1) * N; j++) max = Math.max(max, t.data[j]);
        sum += max;
        count++;
      }
    }
    return sum / count;
  });
}

describe('calibrate on a trained plain-op model', () => {
  const given = calibrate(rope, 'given', '--input', `input_ids=${tokenFile}`);

  it('writes the slope patch whose rows at n ≈ N are as sharp as at n ≈ L, with its report and plot', async () => {
    assert.equal(given.code, 0, given.stderr);
    const r = given.doc.calibration!;
    assert.equal(r.tokens, 'given');
    assert.equal(r.batch, 2);
    assert.equal(r.targetLen, N);
    assert.equal(typeof r.s, 'number');
    assert.ok((r.s as number) > 0.1 && (r.s as number) < 1, `s = ${String(r.s)}`);
    assert.equal(readModel(given.out).graph!.initializer.some((t) => t.name.startsWith('ssmax/')), true);
    const [atL, atN] = await meanMax(given.out, [L, N]);
    const [origL, origN] = await meanMax(rope, [L, N]);
    assert.equal(atL, origL, 'the slope changes nothing up to L');
    assert.ok(origN < 0.6 * origL, `the original fades: ${origN} vs ${origL}`);
    assert.ok(Math.abs(atN - atL) / atL < 0.01, `at N ${atN}, at L ${atL}`);
    assert.ok(fs.readFileSync(given.out.replace(/\.onnx$/, '.calibration.svg'), 'utf8').includes('calibrated slope'));
    const report = JSON.parse(fs.readFileSync(given.out.replace(/\.onnx$/, '.calibration.json'), 'utf8')) as CalibrateDocument;
    assert.deepEqual(report.calibration!.s, r.s);
  });

  it('the calibrated patch passes verify --strict', () => {
    const v = cli(['verify', rope, given.out, '--strict']);
    assert.equal(v.code, 0, v.stdout + v.stderr);
  });

  it('matching entropy sets the mean entropy at n ≈ N to its value at n ≈ L', () => {
    const r = calibrate(rope, 'entropy', '--match', 'entropy');
    assert.equal(r.code, 0, r.stderr);
    const g = r.doc.calibration!.groups[0];
    assert.equal(r.doc.calibration!.tokens, 'synthesised');
    assert.ok(g.beforeAtN > 1.3 * g.target, `entropy grows in the original: ${g.beforeAtN} vs ${g.target}`);
    assert.ok(Math.abs(g.afterAtN - g.target) / g.target < 0.01);
  });
});

describe('calibrate on a fused operator', () => {
  it('MultiHeadAttention of the same model gets the same s, one for the model and one per head', () => {
    for (const per of [[], ['--per', 'head']]) {
      const plain = calibrate(rope, `plain${per.length}`, ...per);
      const ms = calibrate(fused, `fused${per.length}`, ...per);
      assert.equal(ms.code, 0, ms.stderr);
      assert.match(ms.doc.sites.map((s) => s.rule).join(), /fused\/ms-multihead/);
      const flat = (d: CalibrateDocument): number[] => [d.calibration!.s].flat(2);
      if (per.length) assert.equal(new Set(flat(plain.doc).map((v) => v.toFixed(2))).size > 4, true, 'heads differ');
      flat(ms.doc).forEach((v, i) => assert.ok(Math.abs(v - flat(plain.doc)[i]) < 1e-3 * v, `${v} vs ${flat(plain.doc)[i]}`));
      assert.equal(cli(['verify', fused, ms.out, '--strict']).code, 0);
    }
  });

  it('a decoder whose fixed tokens outnumber N (Whisper\'s 1,500, causal) is read in one run of them alone, not in a run of negative cache', { skip: corpusSkip('ort_whisper_decoder_with_past_self_mha_fused.onnx') }, () => {
    // Before: past = N − 1500 < 0, an internal error (Invalid typed array length).
    const r = calibrate(path.join(CORPUS, 'ort_whisper_decoder_with_past_self_mha_fused.onnx'), 'whisper');
    assert.equal(r.code, 1, r.stderr);
    assert.equal(r.doc.error?.code, 'calibrate-failed');
    const c = r.doc.calibration!;
    assert.equal(c.runs, 1);
    assert.ok(c.curve.every((p) => Number.isFinite(p.before)), JSON.stringify(c.curve));
    assert.match(c.notes.join(), /about uniform/);
  });

  it('a corpus model (com.microsoft Attention, random weights) is read and refused: its attention is uniform', { skip: corpusSkip('ort_gpt2_attention_add_opt.onnx') }, () => {
    const r = calibrate(path.join(CORPUS, 'ort_gpt2_attention_add_opt.onnx'), 'corpus');
    assert.equal(r.code, 1);
    assert.equal(r.doc.error?.code, 'calibrate-failed');
    const c = r.doc.calibration!;
    assert.deepEqual(c.unseen, []);
    assert.equal(c.groups[0].state, 'out of reach');
    assert.match(c.notes.join(), /about uniform/);
    assert.equal(fs.existsSync(r.out), false, 'no model written');
    assert.equal(fs.existsSync(r.out.replace(/\.onnx$/, '.calibration.json')), true);
  });
});

describe('calibrate over a KV cache', () => {
  // A decoder with a cache (random weights whose attention is not uniform), L = 1024: N = 8192 is beyond a whole
  // prompt's default longest length (4096), so each length is 4 query tokens over a synthesised cache.
  const decoder = buildDecoder({ layers: 2, heads: 4, hidden: 64, vocab: 64 });
  const file = path.join(dir, 'decoder-cache.onnx');
  fs.writeFileSync(file, encodeModel(decoder));
  const [cacheL, cacheN] = [1024, 8192];

  /** The mean largest probability of a model's Softmax rows in one run of 4 tokens over `keys` − 4 cached, read from the Softmax outputs. */
  async function rowMax(model: string, keys: number): Promise<number> {
    const m = readModel(model);
    const x = new Exposer(m);
    const outs = findAttentionSoftmax(m).sites.map((site) => x.expose('main', site.softmax.output[0], `test/L${site.layer}`) as string);
    x.finish();
    const g = new Graph(m.graph!);
    const shape = { batch: 1, seq: 4, past: keys - 4 };
    // The inputs calibration synthesised for that run (its seed: 1 + seq + past).
    const feeds = synthesize(g, describeInputs(g), shape, { seed: 1 + keys });
    const runner = await Runner.fromModel(m, 'test');
    const result = await runner.run(feeds, outs);
    await runner.release();
    let sum = 0, count = 0;
    for (const o of outs) {
      const t = result[o];
      for (let r = 0; r < t.data.length / keys; r++) {
        let max = 0;
        for (let j = r * keys; j < (r + 1) * keys; j++) max = Math.max(max, t.data[j]);
        sum += max;
        count++;
      }
    }
    return sum / count;
  }

  it('reads rows at n ≈ N over a cache, one run per length, and writes the s that makes them as sharp as at n ≈ L', async () => {
    const out = path.join(dir, 'decoder-cache.slope.onnx');
    const r = cli(['calibrate', file, '--train-len', String(cacheL), '-o', out, '--json', '--quiet']);
    assert.equal(r.code, 0, r.stderr);
    const c = (JSON.parse(r.stdout) as CalibrateDocument).calibration!;
    assert.equal(c.targetLen, cacheN);
    assert.match(c.notes.join('\n'), /N = 8192 is beyond a whole prompt \(the default longest length 4096; --max-len N runs longer\): the model takes a KV cache, so each length is 4 query token\(s\) after a synthesised cache of the rest/);
    assert.deepEqual(c.curve.map((p) => p.length), [256, 512, 1024, 2048, 4096, 8192]);
    assert.equal(c.rows, 'runs at each length: a few query tokens over a synthesised cache of the rest');
    // Read independently from the written model's Softmax outputs on the same inputs: the target at L is the
    // original's, the original fades by N, and the calibrated model at N is back at the target.
    const [target, fadedAtN, calibratedAtN] = [await rowMax(file, cacheL), await rowMax(file, cacheN), await rowMax(out, cacheN)];
    assert.ok(fadedAtN < 0.8 * target, `the original fades: ${fadedAtN} against ${target} at L`);
    assert.ok(Math.abs(calibratedAtN - target) < 0.02 * target, `at N ${calibratedAtN}, target ${target}`);
    assert.ok(Math.abs(c.groups[0].afterAtN - calibratedAtN) < 1e-3 * target, `the report's ${c.groups[0].afterAtN}, read ${calibratedAtN}`);
  });
});

describe('calibrate: bad input', () => {
  const cases: [string, string[], RegExp][] = [
    ['no --train-len', ['calibrate', rope], /--train-len is required/],
    ['N not beyond L', ['calibrate', rope, '--train-len', '64', '--max-len', '64'], /--max-len: expected an integer ≥ 65/],
    ['too few tokens', ['calibrate', rope, '--train-len', '64', '--max-len', '1024', '--input', `input_ids=${tokenFile}`], /T ≥ N = 1024/],
    ['an unknown statistic', ['calibrate', rope, '--train-len', '64', '--match', 'mean'], /--match must be max-prob, entropy or loss, got 'mean'/],
    ['an existing output', ['calibrate', rope, '--train-len', '64', '-o', rope], /overwrite|already exists/],
  ];
  for (const [what, args, message] of cases) {
    it(what, () => {
      const r = cli([...args, '--quiet']);
      assert.equal(r.code, 2, r.stderr);
      assert.match(r.stderr, message);
      assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    });
  }
});

/** The nodes `node` depends on, itself included. */
function ancestors(g: Graph, node: NodeProto): Set<NodeProto> {
  const seen = new Set<NodeProto>();
  const stack = [node];
  while (stack.length) {
    const n = stack.pop()!;
    if (seen.has(n)) continue;
    seen.add(n);
    for (const t of n.input) {
      const p = g.producer.get(t);
      if (p) stack.push(p);
    }
  }
  return seen;
}

describe('the calibration model', () => {
  // onnxruntime runs a node no later node needs at the end of the graph, keeping its input alive till then: a
  // Shape of the probabilities read after the values' MatMul kept every layer's attention matrix (3.2 GB
  // instead of 1.2 GB for a 6-layer decoder at 4096 tokens).
  it("reads each site's probabilities (row statistic and key count) before its values MatMul, so no matrix outlives its layer", () => {
    const original = readModel(rope);
    const { model: patched } = patchModel(original, { preset: 'slope', trainLen: L });
    const setup = prepare(original, patched, { trainLen: L, checks: ['sharpness'] });
    for (const stat of ['max', 'entropy'] as const) {
      const cm = calibrationModel(patched, setup.sites, stat);
      assert.equal(cm.keys.size, setup.sites.length, 'every site has its key count');
      const g = new Graph(cm.model.graph!);
      const softmaxes = g.proto.node.filter((n) => n.opType === 'Softmax');
      assert.equal(softmaxes.length, setup.sites.length);
      for (const softmax of softmaxes) {
        const probs = softmax.output[0];
        const matmul = findValueMatMul(g, probs);
        assert.ok(matmul, `${softmax.name}: its values MatMul`);
        const before = ancestors(g, matmul);
        const readers = g.consumersOf(probs);
        assert.ok(readers.some((n) => n.opType === 'Shape'), `${softmax.name}: the key count reads the probabilities' shape`);
        for (const n of readers) assert.ok(before.has(n), `${stat}: ${n.opType} '${n.name}' reads ${probs} after its values MatMul`);
      }
    }
  });

  // onnxruntime runs every node of a session whatever the outputs fetched: statistics the loss never reads took a
  // quarter of each run of calibrate --match loss.
  it('for the loss (no statistic): the slope patch with s as an input, and nothing more', () => {
    const original = readModel(rope);
    const { model: patched } = patchModel(original, { preset: 'slope', trainLen: L });
    const setup = prepare(original, patched, { trainLen: L, checks: ['sharpness'] });
    const cm = calibrationModel(patched, setup.sites, null);
    assert.deepEqual(cm.model.graph!.node.map((n) => n.name), patched.graph!.node.map((n) => n.name));
    assert.deepEqual(cm.model.graph!.output.map((v) => v.name), patched.graph!.output.map((v) => v.name));
    assert.equal(cm.scales.size, setup.sites.length, 'every site takes its s from an input');
    assert.equal(cm.outputs.size + cm.keys.size, 0);
  });
});

describe('the slope search', () => {
  it('brackets and narrows to the root of a monotone f', () => {
    const f = (s: number): number => 1 + Math.tanh(3 * (s - 0.7));
    const x = new SlopeSearch(1, f(0), (v) => v, 0.25, 4);
    for (let k = 0; k < 12 && x.state === 'searching'; k++) {
      const s = x.next();
      x.observe(s, f(s));
    }
    assert.equal(x.state, 'found');
    assert.ok(Math.abs(x.result(0.25) - 0.7) < 0.005, `${x.result(0.25)}`);
  });

  it('reads a statistic as the gap of one key over n − 1 equal others, for the largest probability and for entropy', () => {
    const n = 512;
    for (const x of [0.5, 2, 5, 9]) {
      const z = Math.exp(x) + n - 1, p = Math.exp(x) / z;
      const entropy = -p * Math.log(p) - (n - 1) * (1 / z) * Math.log(1 / z);
      assert.ok(Math.abs(gapOf('max-prob', p, n) - x) < 1e-9, `max-prob at gap ${x}`);
      assert.ok(Math.abs(gapOf('entropy', entropy, n) - x) < 1e-9, `entropy at gap ${x}: ${gapOf('entropy', entropy, n)}`);
    }
    // Sharper attention, a larger gap, for either statistic.
    assert.ok(gapOf('entropy', 2, n) > gapOf('entropy', 3, n));
    assert.ok(gapOf('max-prob', 0.3, n) > gapOf('max-prob', 0.2, n));
  });

  // The two shapes calibration meets (bench/calibrate.ts, fixtures/quality): on random weights the largest
  // probability's gap is linear in s (the probability convex), on trained models the probability itself is
  // about linear. A search that only interpolates one way takes 5-8 runs on the other.
  for (const [shape, at] of [
    ['gap linear in s (random weights)', (s: number): number => { const z = Math.exp(0.77 + 0.78 * s); return z / (z + 2047); }],
    ['statistic linear in s (trained)', (s: number): number => 0.0788 + 0.33 * s],
  ] as const) {
    it(`finds s within 3 runs where the ${shape}`, () => {
      const target = at(1.66), gap = (v: number): number => gapOf('max-prob', v, 2048);
      const first = predictSlope(gap(target), gap(at(0)), 512, 2048, 1 / Math.log(512), 16 / Math.log(512));
      const x = new SlopeSearch(target, at(0), gap, first, 16 / Math.log(512));
      let runs = 0;
      for (; runs < 10 && x.state === 'searching'; runs++) {
        const s = x.next();
        x.observe(s, at(s));
      }
      assert.equal(x.state, 'found');
      assert.ok(runs <= 3, `${runs} runs: ${x.points.map((p) => p.s.toFixed(3)).join(', ')}`);
      assert.ok(Math.abs(x.result(0) - 1.66) < 0.02, `${x.result(0)}`);
    });
  }

  it('gives up beyond the largest s, and takes s = 0 where nothing fades', () => {
    const flat = new SlopeSearch(1, 0.5, (v) => v, 0.25, 2);
    for (let k = 0; k < 10 && flat.state === 'searching'; k++) flat.observe(flat.next(), 0.5);
    assert.equal(flat.state, 'out of reach');
    assert.equal(flat.result(0.25), 0.25);
    assert.equal(new SlopeSearch(1, 1.1, (v) => v, 0.25, 2).result(0.25), 0);
  });
});
