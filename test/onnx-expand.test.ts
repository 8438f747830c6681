/**
 * ONNX Attention expanded where the factor cannot go on Q (rewrite/onnx-attention.ts): softcap, and a
 * qk_matmul_output that shows the logits before the mask. Checked against a numpy reference of the operator with
 * SSMax (fixtures/onnx_attention/make_onnx_attention.py): the original on onnxruntime equals the reference (so
 * the reference is the operator onnxruntime runs), the expansion with its factor at 1 equals both, and patched
 * with scalar and per-head s it equals the SSMax reference; causal with a cache (prompt, chunk, decode), grouped
 * queries with a short bool mask, a fully masked row, nonpad_kv_seqlen over a static cache, float16.
 */
import { describe, it } from 'node:test';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { FIXTURES } from './support/ref';
import { checkFixture } from './support/refrun';

const DIR = path.join(FIXTURES, 'onnx_attention');
const MODELS = fs.readdirSync(DIR).filter((f) => f.endsWith('.onnx')).map((f) => f.replace(/\.onnx$/, '')).sort();

describe('ONNX Attention expanded, against the numpy reference of the operator', () => {
  for (const name of MODELS) {
    it(name, async () => {
      process.stdout.write(`# ${await checkFixture(DIR, name, 'Attention', { tol: /fp16/.test(name) ? 2e-3 : 1e-4 })}\n`);
    });
  }
});
