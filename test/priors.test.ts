/**
 * Positional priors (BAM's generalized-Gaussian prior and ALiBi) against PyTorch references of the formula
 * (fixtures/torch/priors.ref.json, made by make_priors.py): alone and with SSMax, per-head and per-layer θ, with a
 * KV cache and padded batches; ALiBi against a hand-built ALiBi bias. Then what the journal promises: θ replaced in
 * place by an update, and revert giving back the original bytes.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { encodeModel, readModel, serializeModel } from '../src/io/model-file';
import { alibiSlopes, LayerTheta, priorValue, Theta } from '../src/policy/prior';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { Runner } from '../src/verify/run';
import { makeHost } from '../src/verify/tensors';
import { randoms } from './support/build';
import { cliError } from './support/io';
import { maxCaseDiff, RefCase, runCase, TORCH } from './support/ref';

interface PriorCase extends Omit<RefCase, 'patch'> { model: string; patch: RefPatch }
const ref = JSON.parse(fs.readFileSync(path.join(TORCH, 'priors.ref.json'), 'utf8')) as { theta: Record<string, number[][]>; cases: PriorCase[] };

/** The reference's patch: θ as the prior file spells it (theta_alpha, …), s as the s file does ({"s": …}). */
interface RefPatch extends Omit<PatchOptions, 'theta'> { sJson?: { s: number[] }; priorTheta?: Record<string, number[] | number[][]> }

function options(c: PriorCase): PatchOptions {
  const { sJson, priorTheta, ...rest } = c.patch;
  return { ...rest, ...(priorTheta ? { theta: thetaOf(priorTheta) } : {}), ...(sJson ? { s: sJson.s } : {}) };
}

const thetaOf = (json: Record<string, number[] | number[][]>): Theta => ({ alpha: json.theta_alpha, beta: json.theta_beta, mu: json.theta_mu });


const byName = (name: string): PriorCase => ref.cases.find((c) => c.name === name)!;

describe('positional priors against PyTorch references', () => {
  for (const c of ref.cases) {
    it(`${c.name}: ${JSON.stringify({ ...c.patch, priorTheta: c.patch.priorTheta ? '…' : undefined })}`, async () => {
      const { model, report } = patchModel(readModel(path.join(TORCH, c.model)), options(c));
      assert.ok(report.sites.every((s) => s.prior), 'every site carries the prior');
      const diff = maxCaseDiff(await runCase(model, c), c);
      assert.ok(diff <= 1e-4, `max abs error ${diff}`);
    });
  }

  it('the neutral prior (θ = 0) alone computes what the original computed', async () => {
    const c = byName('ggd_neutral_none_t17');
    const original = await runCase(readModel(path.join(TORCH, c.model)), c);
    const patched = await runCase(patchModel(readModel(path.join(TORCH, c.model)), options(c)).model, c);
    let diff = 0;
    for (let i = 0; i < original.logits.data.length; i++) diff = Math.max(diff, Math.abs(original.logits.data[i] - patched.logits.data[i]));
    assert.ok(diff <= 1e-5, `max abs difference ${diff}`);
  });

  it('the model\'s θ initializers, one value per head, are listed in the report and hold ALiBi\'s θα = ln m_h', () => {
    const { model, report } = patchModel(readModel(path.join(TORCH, 'gpt2_decoder.onnx')), { prior: 'alibi', trainLen: 16 });
    const g = new Graph(model.graph!);
    for (const site of report.sites) {
      assert.deepEqual(g.constValue(site.prior!.alpha)!.values, alibiSlopes(4).map((m) => Math.fround(Math.log(m))));
      assert.deepEqual(g.constValue(site.prior!.beta)!.values, [1, 1, 1, 1]);
      assert.deepEqual(g.constValue(site.prior!.mu)!.values, [0, 0, 0, 0]);
    }
    assert.deepEqual(readRecord(model)!.prior, { kind: 'alibi', from: 'defaults' });
  });

  it('models that carry their own ALiBi or T5 position bias get the prior added to it, and the report says so', () => {
    const notes = (name: string): string[] => patchModel(readModel(path.join(TORCH, `${name}.onnx`)), { prior: 'ggd', trainLen: 16 })
      .report.sites.flatMap((s) => s.notes ?? []);
    assert.equal(notes('t5_decoder').length, 2);
    assert.match(notes('bloom_alibi')[0], /adds its own position bias .*the prior adds to it/);
    assert.deepEqual(notes('gpt2_past'), [], 'a padding mask is not a position bias');
  });

  it('ALiBi slopes for head counts that are not powers of two follow the interleaving rule', () => {
    const fmt = (xs: number[]): string[] => xs.map((x) => x.toPrecision(6));
    assert.deepEqual(fmt(alibiSlopes(6)), fmt([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]));
  });
});

describe('priors through the journal', () => {
  const file = path.join(TORCH, 'gpt2_decoder.onnx');

  it('an update replaces θ in place: a neutral retrofit fine-tuned to other θ computes the reference', async () => {
    const c = byName('ggd_none_t17');
    const neutral = patchModel(readModel(file), { prior: 'ggd', preset: 'none' }).model;
    const { model } = patchModel(neutral, { prior: 'ggd', theta: thetaOf(ref.theta), updateS: true });
    assert.equal(model.graph!.node.length, neutral.graph!.node.length);
    assert.ok(maxCaseDiff(await runCase(model, c), c) <= 1e-4);
  });

  it('revert removes the prior and the factor exactly', () => {
    const patched = patchModel(readModel(file), { prior: 'ggd', theta: thetaOf(ref.theta), trainLen: 16 }).model;
    const back = serializeModel(revertModel(patched).model);
    assert.ok(Buffer.from(back).equals(fs.readFileSync(file)));
  });

  it('refuses what it cannot do, naming the option', () => {
    const m = readModel(file);
    // @ts-expect-error a prior the types do not know: refused at run time too, for JavaScript callers
    assert.throws(() => patchModel(m, { prior: 'gauss', s: 0.3 }), cliError(/--prior must be ggd or alibi, got 'gauss'/));
    assert.throws(() => patchModel(m, { preset: 'none' }), cliError(/--preset none adds no factor: give --prior, --window or --rope too/));
    assert.throws(() => patchModel(m, { preset: 'none', prior: 'ggd', s: 0.3 }), cliError(/--preset none has no s/));
    assert.throws(() => patchModel(m, { prior: 'ggd', theta: { alpha: [1, 2, 3] }, s: 0.3 }), /theta_alpha gives 3 heads for layer 0, the model has 4/);
    // @ts-expect-error a θ the types do not know
    assert.throws(() => patchModel(m, { prior: 'ggd', theta: { gamma: 1 }, s: 0.3 }), /unknown θ 'gamma'/);
    assert.throws(() => patchModel(m, { theta: { alpha: 1 }, s: 0.3 }), cliError(/given without --prior/));
  });
});

describe('the prior tensor B, laid out by blocks of keys', () => {
  // Each (Tq, past) picks another block size K (the largest of 64 … 8 dividing Tk, at most Tq and 2·√Tk, else 1).
  const runs: [number, number, number][] = [[256, 0, 32], [225, 0, 25], [40, 24, 16], [20, 28, 12], [8, 56, 8], [5, 95, 1], [1, 100, 1], [7, 0, 1], [67, 0, 1]];
  const theta: LayerTheta = { alpha: [-0.5, 0, 0.3, -1], beta: [0.8, 1.3, 0, 2], mu: [0, 0.2, -0.2, 0.4] };
  const { model } = patchModel(readModel(path.join(TORCH, 'gpt2_past.onnx')), { preset: 'none', prior: 'ggd', theta });
  const nodes = new Graph(model.graph!).nodes;
  const prior = nodes.find((n) => /L0\/prior$/.test(n.name))!.output[0];
  const size = nodes.find((n) => n.opType === 'ReduceMax' && /\/block$/.test(n.name))!.output[0];
  model.graph!.output.push({ name: prior, type: { tensorType: { elemType: 1 } } }, { name: size, type: { tensorType: { elemType: 7 } } });

  for (const [tq, past, block] of runs) {
    it(`Tq = ${tq} after ${past} cached (K = ${block}): B[h, i, j] = prior(θ_h, j − (past + i)) at every head, row and key`, async () => {
      const runner = await Runner.create(encodeModel(model), 'prior layout');
      const past4 = (seed: number) => makeHost('float32', [1, 4, past, 8], randoms(4 * past * 8, seed));
      const feeds = {
        input_ids: makeHost('int64', [1, tq], Array.from({ length: tq }, (_, i) => i % 50)),
        attention_mask: makeHost('int64', [1, past + tq], new Array(past + tq).fill(1)),
        past_key_0: past4(1), past_value_0: past4(2), past_key_1: past4(3), past_value_1: past4(4),
      };
      const out = await runner.run(feeds, [prior, size]);
      await runner.release();
      assert.equal(Number(out[size].data[0]), block);
      const b = out[prior];
      const tk = past + tq;
      assert.deepEqual(b.dims, [4, tq, tk]);
      let worst = 0;
      for (let h = 0; h < 4; h++) for (let i = 0; i < tq; i++) for (let j = 0; j < tk; j++) {
        const want = priorValue(theta, h, j - (past + i));
        worst = Math.max(worst, Math.abs(b.data[(h * tq + i) * tk + j] - want) / Math.max(1, Math.abs(want)));
      }
      assert.ok(worst < 1e-5, `max relative error ${worst}`);
    });
  }
});
