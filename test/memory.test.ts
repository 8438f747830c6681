/**
 * Memory planned before it is spent (issue 33): each run's peak is estimated from the model (weights, the
 * attention's heads × rows × keys, inputs and outputs); lengths whose run would pass the budget are not run, and the
 * cap says what the longest would need and the flag that allows it.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { Graph } from '../src/graph/graph';
import { parseModel, readModel, writeModel } from '../src/io/model-file';
import { encodeModel } from '../src/io/model-file';
import { detectAttention } from '../src/detect/find-attention';
import { modelScopes } from '../src/graph/scopes';
import { attentionMatrices, estimatePeak, memoryLimit, MemoryModel, parseSize, weightBytes } from '../src/verify/memory';
import { describeInputs, RunShape } from '../src/analysis/signature';
import { cli, removeScratch, tmpdir } from './support/io';
import { CORPUS, corpusSkip } from './support/ref';

after(removeScratch);

const MB = 2 ** 20;
const spec = { layers: 2, d: 32, heads: 4, ff: 32, vocab: 50, tmax: 4096 };
const decoder = smallTransformer(spec);

function memoryModel(): MemoryModel {
  const g = new Graph(decoder.graph!);
  const matrices = attentionMatrices(detectAttention(decoder, modelScopes(decoder)));
  return { weights: weightBytes(g), matrices, specs: describeInputs(g), outputs: decoder.graph!.output, fixed: new Map() };
}

describe('memory estimate', () => {
  it('weights, (2·heads + 1)·rows·keys float32 attention, inputs and outputs at the run\'s sizes, the process', () => {
    const m = memoryModel();
    // float32 weights and int64 shape constants; the largest, the causal mask of [tmax, tmax] floats (64 MB).
    const weights = decoder.graph!.initializer.reduce((n, t) => n + t.dims.reduce((a: number, b) => a * Number(b), 1) * (t.dataType === 7 ? 8 : 4), 0);
    assert.ok(weights > 4096 * 4096 * 4);
    assert.equal(m.weights, weights);
    const run: RunShape = { batch: 1, seq: 1000, past: 0 };
    const e = estimatePeak(m, run)!;
    assert.equal(e.attention, 9 * 1000 * 1000 * 4);
    // int64 ids [1, 1000] in, float32 logits [1, 1000, 50] out.
    assert.equal(e.io, 1000 * 8 + 1000 * 50 * 4);
    assert.equal(e.total, 200 * MB + weights + e.attention + e.io);
    assert.equal(m.matrices, 2 * spec.heads + 1, 'a Softmax in plain ops: its input and output per head, and a mask');
    assert.equal(estimatePeak({ ...m, matrices: undefined }, run), null, 'no heads known: no estimate, no cap');
  });

  it('caps at the longest length whose run fits, saying what the longest wanted needs and the flag', () => {
    const m = memoryModel();
    const shape = (t: number): RunShape => ({ batch: 1, seq: t, past: 0 });
    const budget = { bytes: 300 * MB, why: 'a test' };
    const limit = memoryLimit(m, 4096, shape, budget)!;
    assert.ok(estimatePeak(m, shape(limit.length))!.total <= budget.bytes);
    assert.ok(estimatePeak(m, shape(limit.length + 1))!.total > budget.bytes);
    const need = estimatePeak(m, shape(4096))!.total;
    assert.match(limit.reason, new RegExp(`^a run of 4096 tokens would need about ${(need / 2 ** 30).toFixed(1)} GB \\(weights 0\\.1 GB, attention 0\\.6 GB, inputs and outputs 0\\.0 GB\\), over the memory budget 0\\.3 GB \\(a test\\); \u2060maxMemory\u20611G\u2060 runs it$`));
    assert.equal(memoryLimit(m, limit.length, shape, budget), null, 'a plan that fits is not capped');
  });

  it('reads sizes as bytes or with K, M, G, T', () => {
    assert.deepEqual(['3G', '512M', '1.5g', '2048', '64KiB', '1T'].map(parseSize), [3 * 2 ** 30, 512 * MB, 1.5 * 2 ** 30, 2048, 64 * 1024, 2 ** 40]);
    for (const bad of ['', 'G', '-1G', '3 GB of RAM', '0']) assert.equal(parseSize(bad), null, bad);
  });
});

describe('--max-memory', () => {
  const dir = tmpdir('ssmax-memory-');
  const input = path.join(dir, 'decoder.onnx');
  writeModel(input, parseModel(encodeModel(decoder), 'decoder.onnx'));

  it('lengths whose run would pass the budget are not run; the note names the need and --max-memory; each run reports its estimate', () => {
    const r = cli([input, '--train-len', '256', '--verify', '--max-len', '4096', '--max-memory', '400M', '--dry-run', '--json']);
    assert.equal(r.code, 0, r.stderr);
    const v = JSON.parse(r.stdout).verification;
    const note = v.notes.find((n: string) => n.startsWith('lengths 2048, 4096 not run'));
    assert.match(note ?? v.notes.join('\n'), /^lengths 2048, 4096 not run: capped at \d+ \(a run of 4096 tokens would need about 0\.\d GB \(weights 0\.1 GB, attention 0\.\d GB, inputs and outputs 0\.0 GB\), over the memory budget 0\.4 GB \(given with --max-memory\); --max-memory 1G runs it\)$/);
    assert.deepEqual(v.sweep, [64, 128, 256, 512, 1024]);
    for (const run of v.runs) {
      assert.ok(run.estimatedPeakBytes > 200 * MB && run.estimatedPeakBytes <= 400 * MB, `${run.id}: ${run.estimatedPeakBytes}`);
    }
    // Without the flag the default budget (half the free memory) lets this small model run the whole plan.
    const all = JSON.parse(cli([input, '--train-len', '256', '--verify', '--max-len', '4096', '--dry-run', '--json', '--checks', 'wiring']).stdout).verification;
    assert.deepEqual(all.sweep, [64, 128, 256, 512, 1024, 2048, 4096]);
  });

  it('a fused operator counts its qk output where sharpness reads it; --max-memory alone sets the longest length (corpus Whisper decoder, 1500 fixed queries)',
    { skip: corpusSkip('ort_whisper_decoder_with_past_self_mha_fused.onnx') }, () => {
      const whisper = path.join(CORPUS, 'ort_whisper_decoder_with_past_self_mha_fused.onnx');
      const fused = detectAttention(readModel(whisper), modelScopes(readModel(whisper)));
      assert.deepEqual([attentionMatrices(fused), attentionMatrices(fused, true)], [5, 10]);
      const plan = (...extra: string[]): { sweep: number[]; notes: string[] } => {
        const r = cli([whisper, '--train-len', '32768', '--verify', '--dry-run', '--json', ...extra]);
        assert.equal(r.code, 0, r.stderr);
        return JSON.parse(r.stdout).verification;
      };
      // 3.0 GB allows [10 · 1500 · T] float32 matrices to about 49 000 keys: run there, beyond L, not at 2L = 65536.
      const v = plan('--max-memory', '3G');
      assert.deepEqual(v.sweep.slice(0, 3), [8192, 16384, 32768]);
      assert.ok(v.sweep.length === 4 && v.sweep[3] > 45000 && v.sweep[3] < 52000, String(v.sweep));
      assert.ok(v.notes.some((n) => n === `length ${v.sweep[3]}, the longest the cap allows, run beyond L instead`), v.notes.join('\n'));
      assert.ok(v.notes.some((n) => /over the memory budget 3\.0 GB \(given with --max-memory\)/.test(n)), v.notes.join('\n'));
      assert.deepEqual(plan().sweep, [8192, 16384], 'without it, the default cap on one attention matrix (22369 keys)');
    });

  it('a size that is not one is a usage error naming the flag', () => {
    const r = cli([input, '--train-len', '256', '--verify', '--max-memory', 'lots', '--dry-run']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /^ssmax-patch: --max-memory: 'lots' is not a size \(bytes, or a number with K, M, G or T: 3G, 512M\)/);
  });
});
