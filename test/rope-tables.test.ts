/**
 * RoPE's rotary caches rescaled (`--rope` on RotaryEmbedding / GroupQueryAttention caches, detect/rope.ts's tables):
 * the frequencies are fitted to the tables and checked entry by entry; the patched model computes what the model
 * with its cache initializers replaced by tables of the rescaled frequencies (computed here from the known base,
 * another path) computes; the new caches have room for the rescaled context, which the original's cap forbids;
 * revert is exact; verify --strict passes, and a wrong table or a bypassed one fails.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { fitRotaryTables } from '../src/detect/rope';
import { ConstTensor, makeTensor } from '../src/graph/tensor';
import { readModel, serializeModel } from '../src/io/model-file';
import { DataType, ModelProto, toNumber } from '../src/io/onnx';
import { ropeFrequencies } from '../src/policy/rope';
import { cloneModel, patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { Feeds } from '../src/verify/inputs';
import { Runner } from '../src/verify/run';
import { makeHost } from '../src/verify/tensors';
import { verifyPatch, VerifyReport } from '../src/verify/verify';
import { cliError } from './support/io';
import { CORPUS, corpusSkip } from './support/ref';

/** Tables cos(p·θ_i), sin(p·θ_i) of P rows, column j holding θ[column[j]], rounded to the type's precision. */
function tables(theta: readonly number[], P: number, dataType: number = DataType.FLOAT, column = theta.map((_, i) => i)): [ConstTensor, ConstTensor] {
  const C = column.length;
  const round = (v: number): number => (dataType === DataType.FLOAT16 ? Math.round(v * 2048) / 2048 : Math.fround(v));
  const make = (f: (a: number) => number): ConstTensor => ({
    dims: [P, C], dataType, values: Array.from({ length: P * C }, (_, j) => round(f(Math.floor(j / C) * theta[column[j % C]]))),
  });
  return [make(Math.cos), make(Math.sin)];
}

const geometric = (base: number, K: number): number[] => Array.from({ length: K }, (_, i) => base ** (-i / K));

describe('fitting RoPE frequencies to rotary caches', () => {
  it('recovers θ = base^(−2i/d) from fp32 and fp16 tables, at 2k–128k rows', () => {
    const cases: [number, number, number, number][] = [
      [10000, 8, 2048, DataType.FLOAT16], [500000, 64, 131072, DataType.FLOAT], [1e6, 32, 8192, DataType.FLOAT16],
    ];
    for (const [base, K, P, type] of cases) {
      const want = geometric(base, K);
      const fit = fitRotaryTables(...tables(want, P, type));
      assert.ok(typeof fit !== 'string', `base ${base}, ${P} rows: ${fit}`);
      const worst = Math.max(...fit.theta.map((t, i) => Math.abs(t / want[i] - 1)));
      assert.ok(worst < (type === DataType.FLOAT16 ? 1e-4 : 1e-7), `base ${base}: relative error ${worst}`);
    }
  });

  it('reads the columns as written: K frequencies, repeated as halves (rotate-half), or in pairs (interleaved)', () => {
    const want = geometric(10000, 4);
    for (const column of [[0, 1, 2, 3], [0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 1, 1, 2, 2, 3, 3]]) {
      const fit = fitRotaryTables(...tables(want, 512, DataType.FLOAT, column));
      assert.ok(typeof fit !== 'string', fit as string);
      assert.deepEqual(fit.column, column);
      assert.ok(fit.theta.every((t, i) => Math.abs(t / want[i] - 1) < 1e-6), String(fit.theta));
    }
  });

  it('refuses tables it cannot reproduce, naming why', () => {
    // Llama 3's rescaled frequencies: the low ones divided by 8 (not a geometric series).
    const llama3 = geometric(500000, 16).map((t, i) => (i >= 10 ? t / 8 : t));
    assert.match(String(fitRotaryTables(...tables(llama3, 4096))), /not a geometric series .* already rescaled/);
    const [cos, sin] = tables(geometric(10000, 8), 2048);
    const noisy = { ...cos, values: cos.values.map((v, j) => (j === 5000 ? v + 0.05 : v)) };
    assert.match(String(fitRotaryTables(noisy, sin)), /are not cos and sin of position × frequencies \(row 625, column 0/);
    assert.match(String(fitRotaryTables({ ...cos, dims: [2048 * 8] }, sin)), /are not two \[positions, K\] tables/);
  });
});

const folder = 'genai_tiny-random-LlamaForCausalLM-fp16';
const file = path.join(CORPUS, folder, 'model.onnx');
const explain = (r: VerifyReport): string => r.checks.map((c) => `${c.status} ${c.id}: ${c.summary}`).join('\n');

/** One decode step at `position` over a cache of `position` zeros (the genai Llama's inputs). */
function step(position: number): Feeds {
  const past = makeHost('float16', [1, 1, position, 16], new Array(position * 16).fill(0));
  return {
    input_ids: makeHost('int64', [1, 1], [7]), attention_mask: makeHost('int64', [1, position + 1], new Array(position + 1).fill(1)),
    position_ids: makeHost('int64', [1, 1], [position]),
    'past_key_values.0.key': past, 'past_key_values.0.value': past, 'past_key_values.1.key': past, 'past_key_values.1.value': past,
  };
}

/** A prompt of 40 tokens at positions 0…39 (no cache). */
const prompt: Feeds = (() => {
  const past = makeHost('float16', [1, 1, 0, 16], []);
  return {
    input_ids: makeHost('int64', [1, 40], Array.from({ length: 40 }, (_, i) => (i * 17) % 97)), attention_mask: makeHost('int64', [1, 40], new Array(40).fill(1)),
    position_ids: makeHost('int64', [1, 40], Array.from({ length: 40 }, (_, i) => i)),
    'past_key_values.0.key': past, 'past_key_values.0.value': past, 'past_key_values.1.key': past, 'past_key_values.1.value': past,
  };
})();

const maxDiff = (a: readonly number[], b: readonly number[]): number => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

/** An output of one run: `present.0.key` holds the rotated keys, which the caches set directly (this random model's logits barely move). */
async function logits(model: ModelProto, feeds: Feeds, output = 'logits'): Promise<number[]> {
  const r = await Runner.fromModel(model, 'rope-tables');
  try {
    return Array.from((await r.run(feeds))[output].data);
  } finally {
    await r.release();
  }
}

/** The model with its caches replaced in place by fp16 tables of YaRN's frequencies for base 10000 (d = 16) times its factor. */
function editedTables(original: ModelProto, scale: number, L: number): ModelProto {
  const m = cloneModel(original);
  const next = ropeFrequencies({ method: 'yarn', scale, trainLen: L }, geometric(10000, 8));
  const [cos, sin] = tables(next.theta, 2048, DataType.FLOAT16);
  for (const [name, t] of [['cos_cache', cos], ['sin_cache', sin]] as const) {
    const k = m.graph!.initializer.findIndex((x) => x.name === name);
    m.graph!.initializer[k] = makeTensor(name, DataType.FLOAT16, t.dims, t.values.map((v) => Math.fround(v * next.mscale)));
  }
  return m;
}

describe(`RoPE caches of a genai RotaryEmbedding model (corpus ${folder})`, { skip: corpusSkip(folder) }, () => {
  it('YaRN: the rotated keys equal the model with its caches edited in place; revert is exact', async () => {
    const original = readModel(file);
    const { model, report } = patchModel(original, { trainLen: 64, rope: 'yarn', ropeScale: 4 });
    const site = report.rope!.sites[0];
    const { cos, rows, newRows } = site.table ?? {};
    assert.deepEqual({ cos, rows, newRows }, { cos: 'cos_cache', rows: 2048, newRows: 2048 });
    assert.match(report.notes.join('\n'), /RoPE rescaled: YaRN ×4 \(L = 64\) at the rotary caches 'cos_cache', 'sin_cache', recomputed/);
    const keys = (m: ModelProto): Promise<number[]> => logits(m, prompt, 'present.0.key');
    const [ours, theirs, before] = [await keys(model), await keys(editedTables(original, 4, 64)), await keys(original)];
    const worst = maxDiff(ours, theirs);
    assert.ok(worst <= 2e-3, `max abs difference ${worst}`);
    assert.ok(maxDiff(ours, before) > 10 * worst, `the rescaling changes the outputs: ${maxDiff(ours, before)} against ${worst}`);
    assert.ok(Buffer.from(serializeModel(revertModel(model).model)).equals(Buffer.from(serializeModel(original))));
  });

  it('the new caches have room for the rescaled context: a step at position 5000 runs, where the original is capped at 2048', async () => {
    const original = readModel(file);
    const { model, report } = patchModel(original, { trainLen: 2048, rope: 'ntk', ropeScale: 4 });
    assert.equal(report.rope!.sites[0].table?.newRows, 8192);
    assert.equal(report.lengths, undefined, 'no warning of a cap below L');
    const out = await logits(model, step(5000));
    assert.ok(out.length > 0 && out.every(Number.isFinite));
    await assert.rejects(logits(original, step(5000)), /out of range|position_ids/);
  });

  it('verify --strict passes; a shifted position table fails wiring parity, a cache read again fails the probe', async () => {
    const original = readModel(file);
    const { model } = patchModel(original, { trainLen: 64, rope: 'yarn', ropeScale: 4 });
    const ok = await verifyPatch(original, model, { strict: true });
    assert.equal(ok.passed, true, explain(ok));
    assert.match(ok.checks.find((c) => c.id === 'probe')!.summary, /RoPE frequencies = YaRN ×4 \(L = 64\)'s and cos, sin × \(0\.1 ln s \+ 1\) at 1 cache pair\(s\) recomputed/);
    const record = readRecord(model)!.rope!.sites[0];
    const shifted = cloneModel(model);
    const positions = shifted.graph!.initializer.findIndex((t) => t.name.includes('rope_positions'));
    const p = shifted.graph!.initializer[positions];
    shifted.graph!.initializer[positions] = makeTensor(p.name, p.dataType, p.dims.map(toNumber), Array.from({ length: toNumber(p.dims[0]) }, (_, i) => i + 1));
    const bypassed = cloneModel(model);
    const rotary = bypassed.graph!.node.find((n) => n.opType === 'RotaryEmbedding')!;
    rotary.input[2] = record.table!.cos;
    for (const [what, m, check, message] of [['positions + 1', shifted, 'wiring', /max abs/], ['the original cos cache read', bypassed, 'probe', /still reads the original cache 'cos_cache'/]] as const) {
      const r = await verifyPatch(original, m, { strict: true });
      const c = r.checks.find((x) => x.id === check)!;
      assert.equal(c.status, 'FAILED', `${what}: ${explain(r)}`);
      assert.match(c.summary, message, what);
    }
  });

  it('refuses caches fed at run time (corpus tract_gqa_prefill_rope: GroupQueryAttention with do_rotary), naming the input', { skip: corpusSkip('tract_gqa_prefill_rope.onnx') }, () => {
    const m = readModel(path.join(CORPUS, 'tract_gqa_prefill_rope.onnx'));
    assert.throws(() => patchModel(m, { trainLen: 64, rope: 'ntk' }), cliError(/--rope ntk: .*\(GroupQueryAttention\) reads its rotary cache 'cos_cache' as a model input: --rope recomputes constant caches only/));
  });
});
