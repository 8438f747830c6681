/**
 * Attention in plain loops, the independent reference for fused operators and tiny graphs: logits
 * z = scale·q·k (+ bias), SSMax factor c on the content term before the mask, softmax over visible keys.
 */
import { ModelProto } from '../../src/io/onnx';
import { encodeModel } from '../../src/io/model-file';
import { Feeds, HostTensor } from '../../src/verify/inputs';
import { Runner } from '../../src/verify/run';
import { randoms } from './build';

export interface AttentionSpec {
  B: number; N: number; Nkv: number; S: number; T: number; H: number;
  /** Accessors in [batch, head, row, dim] order; kv heads are shared by N/Nkv query heads. */
  q(b: number, n: number, i: number, d: number): number;
  k(b: number, m: number, j: number, d: number): number;
  v(b: number, m: number, j: number, d: number): number;
  scale: number;
  visible(b: number, n: number, i: number, j: number): boolean;
  /** Additive bias on the logits after the factor (masks, position biases). */
  bias?(b: number, n: number, i: number, j: number): number;
  /** The SSMax factor of row i; 1 for plain attention. */
  factor(b: number, n: number, i: number): number;
}

/** Output [B, N, S, H]. Rows without a visible key are zeros. */
export function attention(p: AttentionSpec): Float64Array {
  const out = new Float64Array(p.B * p.N * p.S * p.H);
  const group = p.N / p.Nkv;
  for (let b = 0; b < p.B; b++) for (let n = 0; n < p.N; n++) for (let i = 0; i < p.S; i++) {
    const m = Math.floor(n / group);
    const c = p.factor(b, n, i);
    const logits: number[] = [];
    for (let j = 0; j < p.T; j++) {
      if (!p.visible(b, n, i, j)) { logits.push(-Infinity); continue; }
      let z = 0;
      for (let d = 0; d < p.H; d++) z += p.q(b, n, i, d) * p.k(b, m, j, d);
      logits.push(c * p.scale * z + (p.bias ? p.bias(b, n, i, j) : 0));
    }
    const max = Math.max(...logits);
    if (max === -Infinity) continue;
    const e = logits.map((l) => Math.exp(l - max));
    const sum = e.reduce((a, x) => a + x, 0);
    for (let d = 0; d < p.H; d++) {
      let acc = 0;
      for (let j = 0; j < p.T; j++) if (e[j] > 0) acc += (e[j] / sum) * p.v(b, m, j, d);
      out[((b * p.N + n) * p.S + i) * p.H + d] = acc;
    }
  }
  return out;
}

/** [B,N,S,H] → [B,S,N·H], the layout of the com.microsoft operators' output. */
export function toBsd(x: Float64Array, B: number, N: number, S: number, H: number): Float64Array {
  const out = new Float64Array(x.length);
  for (let b = 0; b < B; b++) for (let n = 0; n < N; n++) for (let i = 0; i < S; i++) for (let d = 0; d < H; d++) {
    out[((b * S + i) * N + n) * H + d] = x[((b * N + n) * S + i) * H + d];
  }
  return out;
}

/** Accessor for a [B,S,N·H] tensor in [b,n,i,d] order. */
export function bsd(data: Float32Array, S: number, N: number, H: number): (b: number, n: number, i: number, d: number) => number {
  return (b, n, i, d) => data[((b * S + i) * N + n) * H + d];
}

/** Accessor for a [B,N,S,H] tensor. */
export function bnsd(data: Float32Array, N: number, S: number, H: number): (b: number, n: number, i: number, d: number) => number {
  return (b, n, i, d) => data[((b * N + n) * S + i) * H + d];
}

export const floats = (count: number, seed: number, amp = 1): Float32Array => Float32Array.from(randoms(count, seed, amp));

export const f32 = (dims: number[], data: Float32Array): HostTensor => ({ type: 'float32', dims, data });
export const i32 = (dims: number[], values: number[]): HostTensor => ({ type: 'int32', dims, data: Int32Array.from(values) });
export const i64 = (dims: number[], values: number[]): HostTensor => ({ type: 'int64', dims, data: BigInt64Array.from(values.map(BigInt)) });

/** Runs a model once on onnxruntime and returns one output. */
export async function runOnce(m: ModelProto, feeds: Feeds, output: string): Promise<Float32Array | Float64Array> {
  const runner = await Runner.create(encodeModel(m), 'test');
  try {
    const out = await runner.run(feeds);
    return out[output].data;
  } finally {
    await runner.release();
  }
}

export function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/** s·ln n with per-head s. */
export const ssmaxFactor = (s: number[] | number, n: number, head: number): number =>
  (Array.isArray(s) ? s[head] : s) * Math.log(n);
