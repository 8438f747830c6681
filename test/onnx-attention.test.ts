/**
 * ONNX Attention (opset 23/24) against its own function body: the onnx backend-test models in
 * ../shared/corpus come in pairs, the fused node and `*_expanded` (the body in plain ops). Both are patched
 * by the tool and run on onnxruntime at several lengths, including KV-cache decoding: the fused operator's
 * factor on Q must give what the plain-op factor on the logits gives. Skipped when the corpus is absent.
 */
import assert from 'node:assert/strict';
import { CORPUS, corpusSkip } from './support/ref';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import * as ort from 'onnxruntime-node';
import { encodeModel, readModel } from '../src/io/model-file';
import { DataType, ModelProto, ValueInfoProto } from '../src/io/onnx';
import { NOption } from '../src/policy/n-mode';
import { patchModel } from '../src/rewrite/patch';
import { randoms } from './support/build';


interface Lengths { S: number; L: number; P: number; nonpad?: number[] }

/** Pairs checked, and the lengths each is run at (beyond its declared ones). */
const PAIRS: Record<string, Lengths[]> = {
  onnxnode_attention_4d: [{ S: 4, L: 6, P: 0 }, { S: 9, L: 13, P: 0 }],
  onnxnode_attention_3d: [{ S: 4, L: 6, P: 0 }, { S: 7, L: 2, P: 0 }],
  onnxnode_attention_4d_gqa: [{ S: 4, L: 6, P: 0 }, { S: 10, L: 10, P: 0 }],
  onnxnode_attention_4d_attn_mask: [{ S: 4, L: 6, P: 0 }, { S: 8, L: 12, P: 0 }],
  onnxnode_attention_4d_attn_mask_bool: [{ S: 4, L: 6, P: 0 }, { S: 8, L: 12, P: 0 }],
  // Causal without a cache: the plain-op path aligns the causal n bottom-right (Tk − Tq + i + 1), the operator
  // top-left (i + 1); they agree when S = L, the self-attention case.
  onnxnode_attention_4d_causal: [{ S: 6, L: 6, P: 0 }, { S: 11, L: 11, P: 0 }],
  onnxnode_attention_4d_with_past_and_present: [{ S: 4, L: 4, P: 5 }, { S: 1, L: 1, P: 9 }],
  onnxnode_attention_4d_with_qk_matmul_softmax: [{ S: 4, L: 6, P: 0 }, { S: 3, L: 9, P: 0 }],
  onnxnode_attention_4d_fp16: [{ S: 4, L: 6, P: 0 }, { S: 9, L: 9, P: 0 }],
  // The plain-op path sees the key buffer's length, not nonpad_kv_seqlen: equal when the buffer is full.
  onnxnode_attention_4d_gqa_causal_nonpad_decode: [{ S: 1, L: 8, P: 0, nonpad: [8, 8] }, { S: 1, L: 13, P: 0, nonpad: [13, 13] }],
};


/** Makes the sequence axes of the graph inputs and outputs symbolic, so the model runs at any length. */
function dynamic(m: ModelProto): ModelProto {
  const g = m.graph!;
  const seqAxes = (v: ValueInfoProto): number[] => {
    const rank = v.type?.tensorType?.shape?.dim.length ?? 0;
    if (/^(Q|K|V|Y)$/.test(v.name)) return rank === 4 ? [2] : [1];
    if (/past|present/.test(v.name)) return [2];
    if (/mask|qk_matmul/.test(v.name)) return [rank - 2, rank - 1];
    return [];
  };
  for (const v of [...g.input, ...g.output]) {
    const dims = v.type?.tensorType?.shape?.dim ?? [];
    for (const a of seqAxes(v)) if (dims[a]) dims[a] = { dimParam: `${v.name}_${a}` };
  }
  g.valueInfo = [];
  return m;
}

function fp16(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000, exp = ((u >>> 23) & 0xff) - 112, mant = (u >>> 13) & 0x3ff;
  return exp <= 0 ? sign : exp >= 31 ? sign | 0x7c00 : sign | (exp << 10) | mant;
}

function fromFp16(h: number): number {
  const exp = (h >> 10) & 0x1f, frac = h & 0x3ff, sign = h & 0x8000 ? -1 : 1;
  return exp === 0 ? sign * 2 ** -14 * (frac / 1024) : sign * 2 ** (exp - 15) * (1 + frac / 1024);
}

/** Inputs for the given lengths, shaped from the declared (static) non-sequence dims. */
function feeds(m: ModelProto, len: Lengths, seed: number): Record<string, ort.Tensor> {
  const out: Record<string, ort.Tensor> = {};
  for (const v of m.graph!.input) {
    const t = v.type!.tensorType!;
    const dims = t.shape!.dim.map((d) => Number(d.dimValue ?? 0));
    const rank = dims.length;
    if (/^Q$/.test(v.name)) dims[rank === 4 ? 2 : 1] = len.S;
    if (/^(K|V)$/.test(v.name)) dims[rank === 4 ? 2 : 1] = len.L;
    if (/past/.test(v.name)) dims[2] = len.P;
    if (/mask/.test(v.name)) { dims[rank - 2] = len.S; dims[rank - 1] = len.P + len.L; }
    const count = dims.reduce((a, b) => a * b, 1);
    if (v.name === 'nonpad_kv_seqlen') {
      out[v.name] = new ort.Tensor('int64', BigInt64Array.from(len.nonpad!.map(BigInt)), dims);
      continue;
    }
    const r = randoms(count, seed++, 1.5);
    if (t.elemType === DataType.BOOL) {
      const cols = dims[rank - 1];
      // Keep the diagonal visible so no row is fully masked.
      out[v.name] = new ort.Tensor('bool', Uint8Array.from(r, (x, i) => (x > -0.6 || i % cols === Math.floor(i / cols) % cols ? 1 : 0)), dims);
    } else if (t.elemType === DataType.FLOAT16) {
      out[v.name] = new ort.Tensor('float16', Uint16Array.from(r, fp16), dims);
    } else {
      out[v.name] = new ort.Tensor('float32', Float32Array.from(r, (x) => (/mask/.test(v.name) ? x - 1 : x)), dims);
    }
  }
  return out;
}

async function run(m: ModelProto, inputs: Record<string, ort.Tensor>): Promise<Float64Array> {
  const session = await ort.InferenceSession.create(encodeModel(m), { logSeverityLevel: 3 });
  try {
    const y = (await session.run(inputs)).Y;
    return y.type === 'float16' ? Float64Array.from(y.data as Uint16Array, fromFp16) : Float64Array.from(y.data as Float32Array);
  } finally {
    await session.release();
  }
}

function maxDiff(a: Float64Array, b: Float64Array): number {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

describe('ONNX Attention patched = its expanded function body patched', { skip: corpusSkip('onnxnode_attention_4d.onnx') }, () => {
  for (const [name, lengths] of Object.entries(PAIRS)) {
    it(name, async () => {
      const fused = dynamic(readModel(path.join(CORPUS, `${name}.onnx`)));
      const expanded = dynamic(readModel(path.join(CORPUS, `${name}_expanded.onnx`)));
      const tol = /fp16/.test(name) ? 3e-3 : 2e-5;
      const a = patchModel(fused, { s: 0.7 });
      // The fused operator takes n from shapes; on the expanded body auto would count n from attn_mask (which the
      // kernel cannot): compare the same n mode.
      const b = patchModel(expanded, { s: 0.7, n: a.report.sites[0].n as NOption });
      assert.equal(a.report.sites[0].kind, 'Attention');
      assert.equal(b.report.sites[0].kind, 'Softmax');
      assert.equal(a.report.sites[0].n, b.report.sites[0].n, `${a.report.sites[0].nReason} vs ${b.report.sites[0].nReason}`);
      for (const [k, len] of lengths.entries()) {
        const x = feeds(fused, len, 10 * k + 1);
        const plain = await run(fused, x);
        assert.ok(maxDiff(plain, await run(expanded, x)) < tol, 'the unpatched pair already differs');
        const got = await run(a.model, x);
        const want = await run(b.model, x);
        const d = maxDiff(got, want);
        assert.ok(d < tol, `S=${len.S} L=${len.L} P=${len.P}: patched fused vs patched expanded differ by ${d}`);
        assert.ok(maxDiff(got, plain) > 1e-3, `S=${len.S} L=${len.L} P=${len.P}: the factor changed nothing`);
      }
    });
  }

  it('softcap: the fused node is expanded with the factor after the cap, which equals the corpus\'s expanded body patched', async () => {
    const fused = dynamic(readModel(path.join(CORPUS, 'onnxnode_attention_4d_softcap.onnx')));
    const expanded = dynamic(readModel(path.join(CORPUS, 'onnxnode_attention_4d_softcap_expanded.onnx')));
    const a = patchModel(fused, { s: 0.7 });
    assert.match(a.report.sites[0].expanded ?? '', /softcap=2/);
    const b = patchModel(expanded, { s: 0.7, n: a.report.sites[0].n as NOption });
    for (const [k, len] of [{ S: 6, L: 6, P: 0 }, { S: 3, L: 9, P: 0 }].entries()) {
      const x = feeds(fused, len, 3 + k);
      const got = await run(a.model, x);
      assert.ok(maxDiff(got, await run(b.model, x)) < 2e-5);
      assert.ok(maxDiff(got, await run(fused, x)) > 1e-3, 'the factor changed nothing');
    }
  });
});
