/** onnxruntime's fused attention operators in its optimised graphs (issue 34): test/fused-count.test.ts, test/cache-layout.test.ts. */
import * as fs from 'node:fs';
import * as ort from 'onnxruntime-node';
import { decodeModel } from '../../src/io/model-file';
import { GraphProto } from '../../src/io/onnx';

/** onnxruntime's fused attention kernels (com.microsoft). */
export const FUSED = new Set(['Attention', 'MultiHeadAttention', 'GroupQueryAttention', 'DecoderMaskedMultiHeadAttention',
  'DecoderMaskedSelfAttention', 'PackedAttention', 'PackedMultiHeadAttention', 'SparseAttention']);

export function countFused(g: GraphProto): number {
  let count = 0;
  for (const n of g.node) {
    if (n.domain === 'com.microsoft' && FUSED.has(n.opType)) count++;
    for (const a of n.attribute) {
      if (a.g) count += countFused(a.g);
      for (const sub of a.graphs ?? []) count += countFused(sub);
    }
  }
  return count;
}

/** Fused attention operators in onnxruntime's optimised graph of `file`, or why it did not load. */
export async function optimisedCount(file: string, saved: string): Promise<number | string> {
  try {
    const s = await ort.InferenceSession.create(file, { optimizedModelFilePath: saved, logSeverityLevel: 4 });
    await s.release();
  } catch (e) {
    return `does not load: ${String((e as Error).message).split('\n')[0]}`;
  }
  return countFused(decodeModel(fs.readFileSync(saved)).graph!);
}

