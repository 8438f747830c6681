/**
 * What a model's lengths allow (issue 24): a patch-time report and warning where every attention length is fixed,
 * a patch that changes nothing refused unless --allow-no-op, and verification that plans its runs from what the
 * model accepts (fixed tokens with a growing cache, DecoderMaskedMultiHeadAttention's one query token) and calls a
 * check that cannot apply by construction not applicable, so --strict passes a correct patch.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { readModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { makePlan } from '../src/verify/plan';
import { verifyPatch } from '../src/verify/verify';
import { convStack, framesOf, samplesFor } from '../src/analysis/waveform';
import { describeInputs } from '../src/analysis/signature';
import { DataType } from '../src/io/onnx';
import { f32 as f32Init, model, node, value } from './support/build';
import { assertOneLineError, cli, removeScratch, tmpdir } from './support/io';
import { CORPUS, corpusSkip, FIXTURES, TORCH } from './support/ref';
import { doubleN } from './support/tamper';

after(removeScratch);

const corpus = (name: string): string => path.join(CORPUS, name);
const absent = (name: string): false | string => corpusSkip(name);

/** The corpus model patched (with --train-len 64 unless other options are given) into a scratch folder. */
function patchedCopy(name: string, options = ['--train-len', '64']): string {
  const out = path.join(tmpdir('ssmax-reach-'), name);
  const r = cli([corpus(name), ...options, '-o', out]);
  assert.equal(r.code, 0, r.stderr);
  return out;
}

interface CheckLine { id: string; status: string; skip?: string; summary: string }
const checksOf = (stdout: string): CheckLine[] => (JSON.parse(stdout) as { checks: CheckLine[] }).checks;

/** `verify --strict` of the pair passes (exit 0); its checks. */
function strictChecks(original: string, patched: string): CheckLine[] {
  const r = cli(['verify', original, patched, '--strict', '--json']);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  return checksOf(r.stdout);
}

describe('patch time: fixed lengths', () => {
  const fixed = 'burn_attention_3d.onnx';
  it('warns with the n the model runs, the factor there and what to do; the JSON report has it', { skip: absent(fixed) }, () => {
    const r = cli([corpus(fixed), '--train-len', '64', '--dry-run', '--json']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /warning: every attention length of this model is fixed \(the model's inputs have no dynamic axis but the batch\): n = 2 at every site, where the factor s·ln n is 0\.167: the patched model differs from the original at every length it can run \(never n = L = 64\).*give --train-len 2/);
    const report = JSON.parse(r.stdout) as { lengths?: { kind: string; effect: string; sites: { n: number[] }[] }; warnings: { code: string }[] };
    assert.equal(report.lengths?.kind, 'fixed');
    assert.equal(report.lengths?.effect, 'changed');
    assert.deepEqual(report.lengths?.sites.map((s) => s.n), [[2, 2]]);
    assert.ok(report.warnings.some((w) => w.code === 'fixed-lengths'));
  });

  it('refuses a patch that can change no output (qwen-logn below L), writes nothing; --allow-no-op writes it with a warning', { skip: absent(fixed) }, () => {
    const dir = tmpdir('ssmax-reach-');
    const out = path.join(dir, 'p.onnx');
    const r = cli([corpus(fixed), '--train-len', '64', '--preset', 'qwen-logn', '-o', out]);
    assertOneLineError(r, 2, /^ssmax-patch: the patch can never change any output: .*n = 1 … 2 at every site, and the factor max\(1, ln n \/ ln L\) is 1 at every n the model can run; re-export the model with dynamic axes, or give --allow-no-op/);
    assert.ok(!fs.existsSync(out));
    const forced = cli([corpus(fixed), '--train-len', '64', '--preset', 'qwen-logn', '--allow-no-op', '-o', out]);
    assert.equal(forced.code, 0, forced.stderr);
    assert.match(forced.stderr, /warning: written anyway \(--allow-no-op\): the patch can never change any output/);
    assert.ok(fs.existsSync(out));
  });

  it('says nothing on a model with a dynamic sequence', () => {
    const r = cli([path.join(TORCH, 'gpt2_past.onnx'), '--train-len', '64', '--dry-run', '--json']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { lengths?: unknown }).lengths, undefined);
    assert.doesNotMatch(r.stderr, /fixed/);
  });
});

describe('plan: fixed tokens beyond the lengths asked for', () => {
  const base = { trainLen: 28, batch: 2, limit: null, seqFree: false, pastFree: true, pinned: {}, canPad: false, fixedSeq: 1500 };
  it('grows the cache on top of the fixed tokens by L, 4L and 16L', () => {
    const plan = makePlan(base);
    assert.deepEqual(plan.sweep, [1500, 1528, 1612, 1948]);
    assert.deepEqual(plan.runs.filter((r) => r.kind === 'sweep').map((r) => [r.seq, r.past]), [[1500, 0], [1500, 28], [1500, 112], [1500, 448]]);
  });
  it('names the lengths asked for that every run exceeds', () => {
    const plan = makePlan({ ...base, lengths: [16, 64, 1600, 2000] });
    assert.deepEqual(plan.sweep, [1600, 2000]);
    assert.ok(plan.notes.includes('lengths 16, 64 not run: every run has at least 1500 keys (the fixed 1500 tokens)'), plan.notes.join('\n'));
  });
});

describe('verify --strict on what the model accepts', () => {
  it('a --dim the model cannot honour is a one-line error (a model fixed at 2 tokens has no sequence to set)', { skip: absent('burn_attention_3d.onnx') }, () => {
    const original = corpus('burn_attention_3d.onnx');
    const out = patchedCopy('burn_attention_3d.onnx');
    assertOneLineError(cli(['verify', original, out, '--dim', 'seq=128']), 2,
      /^ssmax-patch: --dim seq=128: no input of this model has a dim 'seq' or an axis sized by the sequence \(inputs: .*\)/);
    assert.equal(cli(['verify', original, out, '--strict']).code, 0);
  });

  it('Whisper decoder self-attention with past (1500 fixed tokens), --s 0.3: liveness beyond L passes, strict exit 0', { skip: absent('ort_whisper_decoder_with_past_self_mha_fused.onnx') }, () => {
    const name = 'ort_whisper_decoder_with_past_self_mha_fused.onnx';
    const live = strictChecks(corpus(name), patchedCopy(name, ['--s', '0.3'])).find((c) => c.id === 'liveness')!;
    assert.equal(live.status, 'PASSED');
    assert.match(live.summary, /differ from the original's at .*1948 \(> L = 28/);
  });

  it('DecoderMaskedMultiHeadAttention (cross attention over 10 keys): one query token, one beam; strict exit 0 without --dim, the checks it cannot see not applicable', { skip: absent('ort_dmmha_cross_attn.onnx') }, () => {
    const name = 'ort_dmmha_cross_attn.onnx';
    const checks = strictChecks(corpus(name), patchedCopy(name));
    assert.deepEqual(checks.map((c) => [c.id, c.status, c.skip ?? '']), [
      ['wiring', 'PASSED', ''], ['probe', 'PASSED', ''], ['retrofit', 'SKIPPED', 'not applicable'], ['liveness', 'SKIPPED', 'not applicable'], ['sharpness', 'SKIPPED', 'not applicable'],
    ]);
    assert.match(checks[3].summary, /^no attention row of this model can see more than 10 keys \(every attention site's key count is a constant of the graph\), never beyond L = 64/);
  });
});

describe('cross attention over a cache behind 1,500 fixed tokens', () => {
  const name = 'ort_whisper_decoder_with_past_cross_mha_fused.onnx';
  it('retrofit parity runs a cache of L keys, which is what the cross attention sees: PASSED, outputs compared', { skip: absent(name) }, () => {
    // Before: its only retrofit run had an empty cache (n = 0), reported as not applicable although a run could reach n = L.
    const retrofit = strictChecks(corpus(name), patchedCopy(name)).find((c) => c.id === 'retrofit')!;
    assert.equal(retrofit.status, 'PASSED', retrofit.summary);
    assert.match(retrofit.summary, /every output equals the original's in 1 run\(s\); worst batch=1 seq=1500 past=64/);
  });
});

describe('MultiHeadAttention running DecoderMaskedMultiHeadAttention\'s kernel (a cache indirection)', () => {
  const name = 'ort_dmmha_inside_mha_self_attn.onnx';
  it('runs one query token over a shared buffer of past + 1 with at least one cached token and one beam; strict exit 0', { skip: absent(name) }, () => {
    const out = patchedCopy(name);
    // Before: num_beams sized by position (0), max_sequence_length as the sequence (no room for the cache), then an
    // empty cache, on which onnxruntime's CPU kernel corrupts its heap (the process died with SIGSEGV).
    const checks = strictChecks(corpus(name), out);
    assert.deepEqual(checks.map((c) => [c.id, c.status]), [['wiring', 'PASSED'], ['probe', 'PASSED'], ['retrofit', 'PASSED'], ['liveness', 'PASSED'], ['sharpness', 'PASSED']]);
    assert.match(checks[1].summary, /\(batch=2 seq=1 past=1; /);
    assert.match(checks[2].summary, /batch=1 seq=1 past=63/);
  });
});

describe('an original this runtime cannot run', () => {
  const name = 'ort_gpt2_megatron_opt.onnx';
  it('is named a missing kernel feature, without a --dim or --input that cannot help (a 4-D mask on the CPU Attention kernel)', { skip: absent(name) }, () => {
    const out = patchedCopy(name);
    const r = cli(['verify', corpus(name), out, '--strict']);
    assertOneLineError(r, 2, /4D mask in attention cpu kernel is not supported; this runtime \(onnxruntime-\w+ [\d.]+\) does not implement what the model asks, whatever its inputs/);
    assert.doesNotMatch(r.stderr, /--dim/);
  });
});

describe('an original this runtime cannot load, with inputs it cannot synthesise', () => {
  const name = 'ort_packed_attention_fp32.onnx';
  it('names the kernel onnxruntime lacks (RestorePadding on CPU), not the lengths input a file would not help with', { skip: absent(name) }, () => {
    const out = patchedCopy(name);
    const r = cli(['verify', corpus(name), out, '--strict']);
    assertOneLineError(r, 2, /^ssmax-patch: onnxruntime cannot load the original model: Could not find an implementation for RestorePadding/);
  });
});

describe('an original that fails on the synthesised inputs', () => {
  const name = 'ort_microbench_attention_fp32.onnx';
  it('is reported in the model\'s own words, not in those of a node verification added to read its probabilities', { skip: absent(name) }, () => {
    const out = patchedCopy(name);
    // Its weights are inputs with unnamed dims: a hidden size of 4 for 12 heads, which the kernel refuses.
    const r = cli(['verify', corpus(name), out]);
    assertOneLineError(r, 2, /running Attention node\. .*hidden_size should be divisible by num_heads/);
    assert.doesNotMatch(r.stderr, /ssmax_verify\//);
  });
});

describe('rows the original computes as NaN', () => {
  // onnxruntime's Megatron fusion test: logits (qk / mask) · mask − mask, so a padding 0 in 'mask' makes the
  // original's row NaN (0/0): it attends to no number of keys, and the probe cannot hold the patch to one.
  const name = 'ort_self_attention_megatron_basic_test.onnx';
  it('are left out of the probe and said so; the rest of the row holds the patch to n; strict exit 0', { skip: absent(name) }, () => {
    const out = patchedCopy(name);
    const checks = strictChecks(corpus(name), out);
    const probe = checks.find((c) => c.id === 'probe')!;
    assert.equal(probe.status, 'PASSED');
    assert.match(probe.summary, /; 24 row\(s\) not probed: the original's logits there hold NaN or \+Inf/);
    assert.match(checks.find((c) => c.id === 'liveness')!.summary, /outputs finite wherever the original's are in \d+ run\(s\) \(the original's own outputs hold NaN or Inf in 1: batch=2 seq=12 padded\)/);
  });

  it('a patch with n doubled still fails the probe on the rows that are numbers', { skip: absent(name) }, async () => {
    const original = readModel(corpus(name));
    const patched = patchModel(original, { trainLen: 64 }).model;
    assert.ok(doubleN(patched) > 0);
    const r = await verifyPatch(original, patched, { strict: true });
    const probe = r.checks.find((c) => c.id === 'probe')!;
    assert.equal(probe.status, 'FAILED', probe.summary);
    assert.match(probe.summary, /matches n doubled/);
  });
});

describe('audio: a waveform sized in frames of the attention', () => {
  const file = path.join(FIXTURES, 'audio', 'wav2vec2_tiny.onnx');
  it('the conv stack (10/5, 3/2, 3/2, 2/2) is read from the graph; its samples make exactly the frames asked for on onnxruntime', async () => {
    const graph = new Graph(readModel(file).graph!);
    const stack = convStack(graph, 'waveforms');
    assert.deepEqual(stack.map((s) => [s.kernel, s.stride]), [[10, 5], [3, 2], [3, 2], [2, 2]]);
    assert.equal(samplesFor(stack, 1), 60);
    assert.equal(samplesFor(stack, 12), 60 + 11 * 40);
    const ort = await import('onnxruntime-node');
    const session = await ort.InferenceSession.create(file);
    for (const frames of [7, 64]) {
      const samples = samplesFor(stack, frames);
      const out = await session.run({ waveforms: new ort.Tensor('float32', new Float32Array(samples).fill(0.5), [1, samples]) });
      assert.deepEqual(out.features.dims, [1, frames, 16]);
    }
    await session.release();
  });

  it('verify --strict passes a correct patch without --dim: runs in frames, beyond L', () => {
    const dir = tmpdir('ssmax-reach-');
    const out = path.join(dir, 'w.onnx');
    assert.equal(cli([file, '--train-len', '64', '--n', 'keys', '-o', out]).code, 0);
    const r = cli(['verify', file, out, '--strict', '--json']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    const report = JSON.parse(r.stdout) as { sweep: number[]; inputs: { sized?: string[] }[]; checks: CheckLine[] };
    assert.deepEqual(report.sweep, [16, 32, 64, 128, 256, 512, 1024]);
    assert.deepEqual(report.inputs[0].sized, ["dim 1 'samples': a waveform: 4 strided convolution(s) make one frame of 60 samples and one more every 40; runs are sized in frames"]);
    assert.match(report.checks.find((c) => c.id === 'liveness')!.summary, /^outputs differ from the original's at 128, 256, 512, 1024/);
  });
});

describe('an image whose width sets the tokens (a text recogniser)', () => {
  /** x [B, 3, 8, W] → Conv(kernel [kh, 3], strides [1, 2], width pads 1 + 1) → [B, 4, 8 − kh + 1, ⌊(W − 1) / 2⌋ + 1]. */
  const conv = (kh: number): Graph => new Graph(model({
    nodes: [node('Conv', ['x', 'w'], ['y'], { kernel_shape: [kh, 3], strides: [1, 2], pads: [0, 1, 0, 1] })],
    inputs: [value('x', DataType.FLOAT, ['B', 3, 8, 'W'])], outputs: [value('y', DataType.FLOAT, [])],
    initializers: [f32Init('w', [4, 3, kh, 3], Array.from({ length: 4 * 3 * kh * 3 }, () => 0.1))],
  }).graph!);

  it('W is sized from the tokens where the stack takes the height down to one row; not where rows remain', () => {
    const width = (kh: number) => describeInputs(conv(kh))[0].dims[3];
    const rule = width(8);
    assert.ok(!('value' in rule) && rule.rule?.frames, JSON.stringify(rule));
    assert.match(rule.rule!.why, /^an image width: 1 convolution\(s\) and pool\(s\) make one token of 1 columns and one more every 2/);
    assert.equal(framesOf(rule.rule!.frames!, samplesFor(rule.rule!.frames!, 30)), 30);
    const rows = width(4);
    assert.ok(!('value' in rows) && !rows.rule?.frames, 'a stack that leaves 5 rows must not size W in tokens');
  });

  const ocr = 'ocr_ch_PP-OCRv4_rec_infer.onnx';
  it('PaddleOCR v4: verify --strict sweeps the width and passes every check (retrofit, liveness, sharpness run)', { skip: absent(ocr) }, () => {
    const out = patchedCopy(ocr);
    const checks = strictChecks(corpus(ocr), out);
    assert.deepEqual(checks.map((c) => [c.id, c.status]), ['wiring', 'probe', 'retrofit', 'liveness', 'sharpness'].map((id) => [id, 'PASSED']));
  });
});
