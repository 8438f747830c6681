/**
 * Inference latency of original vs patched decoders on onnxruntime-node with default session options:
 * interleaved runs in one process (alternating which goes first), reporting the median of the per-pair
 * patched/original ratios and its interquartile spread.
 */
import * as fs from 'node:fs';
import * as ort from 'onnxruntime-node';
import { makeTensor } from '../src/graph/tensor';
import { encodeModel, readModel, serializeModel } from '../src/io/model-file';
import { DataType, ModelProto } from '../src/io/onnx';
import type { CacheSplit } from '../src/rewrite/ms-attention';
import { patchModel, PatchOptions } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { node } from '../src/verify/nodes';
import { buildDecoder, DecoderConfig, decoderFile } from './decoder';
import { fusedGpt2File } from './fused-gpt2';
import { BERT_BASE, bertFile } from './bert';

export interface LatencyCase {
  label: string;
  config: DecoderConfig;
  seq: number;
  past: number;
  pairs: number;
  /** The patch (default: SSMax with --train-len 1024). */
  patch?: PatchOptions;
  /**
   * `plain`: the decoder of plain ops (decoder.ts); `fused`: GPT-2 with com.microsoft Attention (fused-gpt2.ts);
   * `bert`: a BERT encoder of plain ops that onnxruntime fuses at session start (bert.ts).
   */
  model?: 'plain' | 'fused' | 'bert';
  /** Instead of a patch, the plain decoder with the least an exact prior must add (floorModel). */
  floor?: 'prior' | 'ssmax-prior';
}

export interface LatencyResult {
  label: string;
  originalMs: number;
  patchedMs: number;
  /** patched median / original median. */
  ratio: number;
  /** patched fastest / original fastest: the least disturbed runs. */
  ratioOfMins: number;
  /** Median and interquartile range of the per-pair ratios. */
  pairMedian: number;
  spread: [number, number];
}

function feeds(cfg: DecoderConfig, seq: number, past: number, model: LatencyCase['model']): Record<string, ort.Tensor> {
  const fused = model === 'fused';
  const hd = cfg.hidden / cfg.heads;
  const out: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from({ length: seq }, (_, i) => BigInt((i * 7919) % cfg.vocab)), [1, seq]),
  };
  if (model === 'bert') {
    out.attention_mask = new ort.Tensor('int64', new BigInt64Array(seq).fill(1n), [1, seq]);
    return out;
  }
  if (fused) {
    out.position_ids = new ort.Tensor('int64', BigInt64Array.from({ length: seq }, (_, i) => BigInt(past + i)), [1, seq]);
    out.attention_mask = new ort.Tensor('int32', new Int32Array(past + seq).fill(1), [1, past + seq]);
    for (let l = 0; l < cfg.layers; l++) {
      out[`past_${l}`] = new ort.Tensor('float32', Float32Array.from({ length: 2 * cfg.heads * past * hd }, (_, i) => Math.sin(i * 0.37 + l)), [2, 1, cfg.heads, past, hd]);
    }
    return out;
  }
  for (let l = 0; l < cfg.layers; l++) {
    for (const kind of ['key', 'value']) {
      const data = Float32Array.from({ length: cfg.heads * past * hd }, (_, i) => Math.sin(i * 0.37 + l));
      out[`past_${kind}_${l}`] = new ort.Tensor('float32', data, [1, cfg.heads, past, hd]);
    }
  }
  return out;
}

/** The feeds of a patch whose caches are split (--cache-layout split): each stacked past as its key and value halves. */
function splitFeeds(input: Record<string, ort.Tensor>, splits: readonly CacheSplit[]): Record<string, ort.Tensor> {
  const out = { ...input };
  for (const c of splits) {
    const t = input[c.past];
    const data = t.data as Float32Array, half = data.length / 2, dims = t.dims.slice(1);
    delete out[c.past];
    out[c.pastKey] = new ort.Tensor('float32', data.slice(0, half), dims);
    out[c.pastValue] = new ort.Tensor('float32', data.slice(half), dims);
  }
  return out;
}

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  const i = (s.length - 1) * q;
  return s[Math.floor(i)] + (s[Math.ceil(i)] - s[Math.floor(i)]) * (i - Math.floor(i));
};

async function timed(session: ort.InferenceSession, input: Record<string, ort.Tensor>): Promise<number> {
  const t = process.hrtime.bigint();
  await session.run(input);
  return Number(process.hrtime.bigint() - t) / 1e6;
}

export async function measureLatency(c: LatencyCase): Promise<LatencyResult> {
  const file = c.model === 'fused' ? fusedGpt2File(c.config) : c.model === 'bert' ? bertFile(c.config) : decoderFile(c.config);
  const original = fs.readFileSync(file);
  const patch = c.floor ? undefined : patchModel(readModel(file), c.patch ?? { trainLen: 1024 }).model;
  const patched = patch ? serializeModel(patch) : encodeModel(floorModel(c.config, c.floor === 'ssmax-prior'));
  // Default session options (graph optimisations, threads); only warnings are silenced.
  const a = await ort.InferenceSession.create(original, { logSeverityLevel: 3 });
  const b = await ort.InferenceSession.create(patched, { logSeverityLevel: 3 });
  const input = feeds(c.config, c.seq, c.past, c.model);
  const inputB = patch ? splitFeeds(input, readRecord(patch)?.cacheLayout ?? []) : input;
  for (let i = 0; i < 2; i++) {
    await a.run(input);
    await b.run(inputB);
  }
  const ta: number[] = [], tb: number[] = [], ratios: number[] = [];
  for (let i = 0; i < c.pairs; i++) {
    const first = i % 2 === 0;
    const x = first ? await timed(a, input) : 0;
    const y = await timed(b, inputB);
    const x2 = first ? x : await timed(a, input);
    ta.push(x2);
    tb.push(y);
    ratios.push(y / x2);
  }
  await a.release();
  await b.release();
  return {
    label: c.label, originalMs: quantile(ta, 0.5), patchedMs: quantile(tb, 0.5), ratio: quantile(tb, 0.5) / quantile(ta, 0.5),
    ratioOfMins: Math.min(...tb) / Math.min(...ta), pairMedian: quantile(ratios, 0.5), spread: [quantile(ratios, 0.25), quantile(ratios, 0.75)],
  };
}

export const WIDE: DecoderConfig = { layers: 12, heads: 12, hidden: 768, vocab: 8192 };
export const ATTENTION_HEAVY: DecoderConfig = { layers: 4, heads: 4, hidden: 256, vocab: 8192 };

export const LATENCY_CASES: LatencyCase[] = [
  { label: '12L×768, seq 128', config: WIDE, seq: 128, past: 0, pairs: 60 },
  { label: '12L×768, seq 512', config: WIDE, seq: 512, past: 0, pairs: 16 },
  { label: '12L×768, decode 1 token, KV cache 2048', config: WIDE, seq: 1, past: 2048, pairs: 120 },
  { label: '4L×256, seq 1024', config: ATTENTION_HEAVY, seq: 1024, past: 0, pairs: 60 },
  { label: '4L×256, seq 2048', config: ATTENTION_HEAVY, seq: 2048, past: 0, pairs: 16 },
  { label: '4L×256, seq 4096', config: ATTENTION_HEAVY, seq: 4096, past: 0, pairs: 8 },
  // GPT-2 as onnxruntime's optimizer fuses it: the causal com.microsoft Attention nodes are expanded by the patch.
  { label: 'GPT-2 fused Attention 12L×768, prompt 512', config: WIDE, seq: 512, past: 0, pairs: 16, model: 'fused' },
  { label: 'GPT-2 fused Attention 12L×768, decode 1 token, KV cache 1024', config: WIDE, seq: 1, past: 1024, pairs: 120, model: 'fused' },
  // The same with its caches split into key and value halves (--cache-layout split, an interface change): MultiHeadAttention.
  { label: 'GPT-2 fused Attention 12L×768, --cache-layout split, prompt 512', config: WIDE, seq: 512, past: 0, pairs: 16, model: 'fused', patch: { trainLen: 1024, cacheLayout: 'split' } },
  { label: 'GPT-2 fused Attention 12L×768, --cache-layout split, decode 1 token, KV cache 1024', config: WIDE, seq: 1, past: 1024, pairs: 120, model: 'fused',
    patch: { trainLen: 1024, cacheLayout: 'split' } },
  // BERT-base in plain ops, which onnxruntime fuses into com.microsoft Attention: the patch writes MultiHeadAttention.
  { label: 'BERT-base encoder 12L×768 (fused at session start), seq 128', config: BERT_BASE, seq: 128, past: 0, pairs: 40, model: 'bert' },
  { label: 'BERT-base encoder 12L×768 (fused at session start), seq 512', config: BERT_BASE, seq: 512, past: 0, pairs: 16, model: 'bert' },
  { label: 'BERT-base encoder 12L×768, --fused-attention off, seq 128', config: BERT_BASE, seq: 128, past: 0, pairs: 40, model: 'bert', patch: { trainLen: 1024, fusedAttention: 'off' } },
  { label: 'BERT-base encoder 12L×768, --fused-attention off, seq 512', config: BERT_BASE, seq: 512, past: 0, pairs: 16, model: 'bert', patch: { trainLen: 1024, fusedAttention: 'off' } },
];

/**
 * θ that differs per layer and head, as after fine-tuning. With the neutral θ = 0 in every layer onnxruntime shares
 * the equal θ initializers and merges the layers' identical prior computations, which a real model never allows.
 */
function trainedTheta(cfg: DecoderConfig): PatchOptions['theta'] {
  const per = (f: (l: number, h: number) => number): number[][] =>
    Array.from({ length: cfg.layers }, (_, l) => Array.from({ length: cfg.heads }, (_, h) => f(l, h)));
  return {
    alpha: per((l, h) => -1 - 0.01 * (l * cfg.heads + h)), beta: per((l, h) => 0.5 + 0.01 * (l + h)), mu: per((l, h) => 0.001 * (l - h)),
  };
}

/** The same cases with a positional prior (BAM's GGD, θ differing per layer and head) added to SSMax: the prior's cost. */
LATENCY_CASES.push(...LATENCY_CASES.filter((c) => c.model === undefined || c.model === 'plain').map((c) => ({
  ...c, label: `${c.label}, + ggd prior`, patch: { trainLen: 1024, prior: 'ggd' as const, theta: trainedTheta(c.config) },
})));

/**
 * The least an exact prior can add at a layer, to set the patched model's cost against: a [1, H, Tq, Tk] tensor
 * written by an Expand (the cheapest op that writes one; a prior must write its B, which differs per layer) and added
 * to the scores before the mask; with `rowFactor`, multiplied first by one value per row, as SSMax's causal factor
 * multiplies B. Each layer expands its own values, so onnxruntime cannot share one tensor across layers.
 */
function floorModel(cfg: DecoderConfig, rowFactor: boolean): ModelProto {
  const model = buildDecoder(cfg);
  const g = model.graph;
  if (!g) throw new Error('the decoder has no graph');
  g.initializer.push(makeTensor('floor_one', DataType.INT64, [1], [1]), makeTensor('floor_rows', DataType.INT64, [1], [-2]),
    makeTensor('floor_keys', DataType.INT64, [1], [-1]));
  for (let l = 0; l < cfg.layers; l++) {
    const p = `l${l}_floor_`;
    const at = g.node.findIndex((n) => n.output[0] === `l${l}_masked`);
    const scores = g.node[at].input[0];
    const values = Array.from({ length: cfg.heads }, (_, h) => 0.01 * (l * cfg.heads + h + 1));
    g.initializer.push(makeTensor(`${p}value`, DataType.FLOAT, [1, cfg.heads, 1, 1], values));
    const added = [node('Shape', [scores], `${p}shape`), node('Expand', [`${p}value`, `${p}shape`], `${p}bias`)];
    let bias = `${p}bias`;
    if (rowFactor) {
      g.initializer.push(makeTensor(`${p}row_value`, DataType.FLOAT, [1, 1], [1 + 0.01 * l]));
      added.push(node('Slice', [`${p}shape`, 'floor_rows', 'floor_keys'], `${p}tq`), node('Concat', [`${p}tq`, 'floor_one'], `${p}row_shape`, { axis: 0 }));
      added.push(node('Expand', [`${p}row_value`, `${p}row_shape`], `${p}row`), node('Mul', [bias, `${p}row`], `${p}scaled`));
      bias = `${p}scaled`;
    }
    added.push(node('Add', [scores, bias], `${p}added`));
    g.node[at].input[0] = `${p}added`;
    g.node.splice(at, 0, ...added);
  }
  return model;
}

/** At 4096 tokens, the least any exact layout of the prior can cost (see floorModel), measured like the patches. */
LATENCY_CASES.push(
  { label: '4L×256, seq 4096, floor of a prior (Expand + Add)', config: ATTENTION_HEAVY, seq: 4096, past: 0, pairs: 16, floor: 'prior' },
  { label: '4L×256, seq 4096, floor of SSMax + prior (Expand + Mul by rows + Add)', config: ATTENTION_HEAVY, seq: 4096, past: 0, pairs: 16, floor: 'ssmax-prior' },
);

export async function latencyTable(filter?: RegExp): Promise<string> {
  const rows = [
    '| case | original (ms, median) | patched (ms, median) | patched/original (medians) | (fastest runs) | per-pair ratio, median (p25–p75) |',
    '|---|---|---|---|---|---|',
  ];
  for (const c of LATENCY_CASES.filter((k) => !filter || filter.test(k.label))) {
    const r = await measureLatency(c);
    rows.push(`| ${r.label} | ${r.originalMs.toFixed(2)} | ${r.patchedMs.toFixed(2)} | ${r.ratio.toFixed(3)} | ${r.ratioOfMins.toFixed(3)} | ${r.pairMedian.toFixed(3)} (${r.spread[0].toFixed(3)}–${r.spread[1].toFixed(3)}) |`);
    process.stderr.write(`${rows[rows.length - 1]}\n`);
  }
  return rows.join('\n');
}
