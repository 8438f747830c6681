/**
 * The patch must not cost onnxruntime its own graph fusions: the optimised graph of each patched fixture keeps
 * every fused op of the original (FusedMatMul from MatMul + 1/√d, LayerNormalization, Gelu variants), because the
 * factor multiplies the query, not the logits between the MatMul and its scale.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import * as ort from 'onnxruntime-node';
import { decodeModel, readModel, serializeModel } from '../src/io/model-file';

import { patchModel } from '../src/rewrite/patch';
import { TORCH } from './support/ref';
import { removeScratch, tmpdir } from './support/io';

after(removeScratch);

async function optimisedOps(bytes: Uint8Array, file: string): Promise<Record<string, number>> {
  const s = await ort.InferenceSession.create(bytes, { optimizedModelFilePath: file, logSeverityLevel: 3 });
  await s.release();
  const counts: Record<string, number> = {};
  for (const n of decodeModel(fs.readFileSync(file)).graph!.node) counts[n.opType] = (counts[n.opType] ?? 0) + 1;
  return counts;
}

const FUSED = /^(Fused|Bias|Fast|Quick|SkipLayer|LayerNorm|SimplifiedLayer|Attention|MultiHead|Gelu)/;

describe('onnxruntime fusions survive the patch', () => {
  const dir = tmpdir('ssmax-fusion-');
  for (const name of ['bert_encoder', 'encoder_3d', 'gpt2_decoder', 'gpt2_past', 'llama_gqa']) {
    it(name, async () => {
      const m = readModel(path.join(TORCH, `${name}.onnx`));
      const before = await optimisedOps(serializeModel(m), path.join(dir, `${name}.a.onnx`));
      const after = await optimisedOps(serializeModel(patchModel(m, { trainLen: 64 }).model), path.join(dir, `${name}.b.onnx`));
      const fused = Object.keys(before).filter((k) => FUSED.test(k));
      assert.ok(fused.includes('FusedMatMul'), `expected onnxruntime to fuse MatMul + scale in ${name}: ${JSON.stringify(before)}`);
      for (const op of fused) assert.equal(after[op], before[op], `${op}: ${before[op]} fused in the original, ${after[op] ?? 0} after patching`);
    });
  }
});
