/**
 * com.microsoft Attention patched exactly by expanding it (rewrite/ms-attention.ts), checked against a numpy
 * reference of the operator's documented semantics with SSMax (fixtures/ms_attention/make_ms_attention.py, no
 * onnxruntime involved): causal GPT-2 form with a stacked cache (prompt, a chunk after a cache, one decoded token,
 * left-padded batches), every mask_index format, a shared past/present buffer, attention_bias with
 * qkv_hidden_sizes, float16. Each model: the original on onnxruntime equals the reference (where the CPU kernel
 * runs it: not the 4-D mask nor the shared buffer); the patched model with its factor at 1 equals the original
 * and the reference; patched with scalar and per-head s it equals the SSMax reference.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { readModel } from '../src/io/model-file';
import { ModelProto } from '../src/io/onnx';
import { parseScaleJson } from '../src/policy/scale';
import { patchModel } from '../src/rewrite/patch';
import { withUnitFactor } from '../src/verify/verify';
import { Runner } from '../src/verify/run';
import { Outputs } from '../src/verify/run';
import { decode, FIXTURES, feedsOf, loadRef, RefCase } from './support/ref';

const DIR = path.join(FIXTURES, 'ms_attention');
const MODELS = fs.readdirSync(DIR).filter((f) => f.endsWith('.onnx')).map((f) => f.replace(/\.onnx$/, '')).sort();
/** What onnxruntime's CPU kernel does not run: the original is checked through the reference only. */
const CPU_CANNOT = new Set(['mask_4d_megatron', 'share_buffer']);

async function outputsOf(m: ModelProto, c: RefCase): Promise<Outputs> {
  const runner = await Runner.fromModel(m, 'test');
  try {
    return await runner.run(feedsOf(c));
  } finally {
    await runner.release();
  }
}

/** Largest |got − want| over the case's expected outputs. */
function error(got: Outputs, c: RefCase): number {
  let worst = 0;
  for (const [name, t] of Object.entries(c.outputs)) {
    const want = decode(t);
    const a = got[name].data;
    const b = want.type === 'float16' ? Float32Array.from(want.data as Uint16Array, (h) => decodeHalf(h)) : (want.data as Float32Array);
    assert.equal(a.length, b.length, `${name}: ${a.length} values, expected ${b.length}`);
    for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  }
  return worst;
}

function decodeHalf(h: number): number {
  const exp = (h >> 10) & 0x1f, frac = h & 0x3ff, sign = h & 0x8000 ? -1 : 1;
  return exp === 0 ? sign * 2 ** -14 * (frac / 1024) : sign * 2 ** (exp - 15) * (1 + frac / 1024);
}

const scaleOf = (s: number | number[]) => (Array.isArray(s) ? { scale: parseScaleJson({ s }, 'test') } : { s });

describe('com.microsoft Attention expanded, against the numpy reference of the operator', () => {
  for (const name of MODELS) {
    it(name, async () => {
      const original = readModel(path.join(DIR, `${name}.onnx`));
      const ref = loadRef(name, DIR);
      const tol = /fp16/.test(name) ? 2e-3 : 1e-4;
      const errors: string[] = [];
      for (const c of ref.cases) {
        const label = `${c.name}${c.patch ? ` s=${JSON.stringify(c.patch.s)}` : ''}`;
        if (!c.patch) {
          const unit = withUnitFactor(patchModel(original, { s: 0.45 }).model);
          const e = error(await outputsOf(unit, c), c);
          assert.ok(e < tol, `${label}: the expansion with factor 1 is ${e} from the operator's reference`);
          if (!CPU_CANNOT.has(name)) {
            const plain = await outputsOf(original, c);
            assert.ok(error(plain, c) < tol, `${label}: onnxruntime's kernel is ${error(plain, c)} from the reference: the reference is wrong`);
            const parity = await outputsOf(unit, c);
            const d = Math.max(...Object.keys(c.outputs).map((o) => maxAbs(parity[o].data, plain[o].data)));
            assert.ok(d < tol, `${label}: factor-1 parity with the original node: ${d}`);
          }
          errors.push(`${label} factor 1: ${e.toExponential(1)}`);
          continue;
        }
        const { model, report } = patchModel(original, scaleOf(c.patch.s as number | number[]));
        assert.equal(report.sites[0].kind, 'com.microsoft.Attention');
        assert.match(report.sites[0].expanded ?? '', /expanded into its definition/);
        const e = error(await outputsOf(model, c), c);
        assert.ok(e < tol, `${label}: patched output is ${e} from the SSMax reference (n ${report.sites[0].n}: ${report.sites[0].nReason})`);
        errors.push(`${label}: ${e.toExponential(1)}`);
      }
      process.stdout.write(`# ${name}: max abs error vs reference: ${errors.join('; ')}\n`);
    });
  }
});

describe('the reference catches a wrong n', () => {
  it('gpt2_causal_past patched with n = Tk (the query columns of the weights) misses the SSMax reference', async () => {
    const original = readModel(path.join(DIR, 'gpt2_causal_past.onnx'));
    const { model, report } = patchModel(original, { s: 0.45, n: 'keys' });
    assert.equal(report.sites[0].expanded, undefined);
    for (const c of loadRef('gpt2_causal_past', DIR).cases.filter((k) => k.patch?.s === 0.45 && !/decode/.test(k.name))) {
      assert.ok(error(await outputsOf(model, c), c) > 1e-3, `${c.name}: n = Tk passes the per-row reference: the test is too weak`);
    }
  });
});

function maxAbs(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}
