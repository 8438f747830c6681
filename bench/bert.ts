/**
 * A BERT encoder in plain ops, written the way onnxruntime's session-time AttentionFusion matches it (opset 12, as
 * older PyTorch exports of BERT were): LayerNormalization feeding the Q, K and V MatMul + Add and the residual Add;
 * heads by Reshape [0, 0, N, H] and Transpose (K as 0,2,3,1); MatMul → Div(√H) → Add(mask) → Softmax → MatMul; the
 * mask as (1 − Cast(Unsqueeze(Unsqueeze(attention_mask)))) · −10000. onnxruntime fuses each layer's attention into
 * com.microsoft Attention, so the benchmark and the tests measure a patch against a fused original.
 */
import { makeTensor } from '../src/graph/tensor';
import { DataType, ModelProto, NodeProto, TensorProto } from '../src/io/onnx';
import { node } from '../src/verify/nodes';
import { CACHE, cachedModel, random } from './decoder';
import { benchModel, value } from './transformer';

export interface BertConfig {
  layers: number;
  heads: number;
  hidden: number;
  vocab: number;
  /** Scale of the Q and K weights: larger spreads the logits (peaked attention). */
  qkGain?: number;
}

export const BERT_BASE: BertConfig = { layers: 12, heads: 12, hidden: 768, vocab: 8192 };

export function buildBert(cfg: BertConfig): ModelProto {
  const { layers, heads, hidden: d, vocab } = cfg;
  const hd = d / heads;
  const nodes: NodeProto[] = [];
  const inits: TensorProto[] = [];
  const f32 = (name: string, dims: number[], amp: number, seed: number, fill?: number): string => {
    const count = dims.reduce((a, b) => a * b, 1);
    inits.push(makeTensor(name, DataType.FLOAT, dims, fill !== undefined ? new Array(count).fill(fill) : random(count, amp, seed)));
    return name;
  };
  const scalar = (name: string, v: number): string => {
    inits.push(makeTensor(name, DataType.FLOAT, [], [v]));
    return name;
  };
  inits.push(makeTensor('heads_shape', DataType.INT64, [4], [0, 0, heads, hd]), makeTensor('merge_shape', DataType.INT64, [3], [0, 0, d]));
  const ln = (x: string, out: string, seed: number): string => {
    nodes.push(node('LayerNormalization', [x, f32(`${out}_g`, [d], 0, 0, 1), f32(`${out}_b`, [d], 0.02, seed)], out, { axis: -1 }));
    return out;
  };
  const dense = (x: string, p: string, din: number, dout: number, seed: number): string => {
    nodes.push(node('MatMul', [x, f32(`${p}_w`, [din, dout], Math.sqrt(3 / din), seed)], `${p}_mm`));
    nodes.push(node('Add', [`${p}_mm`, f32(`${p}_b`, [dout], 0.02, seed + 1)], p));
    return p;
  };
  nodes.push(node('Gather', [f32('wte', [vocab, d], 1, 1), 'input_ids'], 'emb'));
  nodes.push(node('Unsqueeze', ['attention_mask'], 'mask_u1', { axes: [1] }), node('Unsqueeze', ['mask_u1'], 'mask_u2', { axes: [2] }));
  nodes.push(node('Cast', ['mask_u2'], 'mask_f', { to: DataType.FLOAT }), node('Sub', [scalar('one', 1), 'mask_f'], 'mask_inv'));
  nodes.push(node('Mul', ['mask_inv', scalar('minus_10000', -10000)], 'mask_bias'));
  let x = ln('emb', 'ln0', 2);
  const gain = cfg.qkGain ?? 1;
  for (let l = 0; l < layers; l++) {
    const p = `l${l}_`;
    const proj = (t: string, perm: number[], amp: number): string => {
      const y = dense(x, `${p}${t}`, d, d, 100 * l + t.charCodeAt(0));
      if (amp !== 1) {
        const w = inits.find((i) => i.name === `${p}${t}_w`)!;
        inits[inits.indexOf(w)] = makeTensor(w.name, DataType.FLOAT, [d, d], random(d * d, amp * Math.sqrt(3 / d), 100 * l + t.charCodeAt(0)));
      }
      nodes.push(node('Reshape', [y, 'heads_shape'], `${p}${t}4`), node('Transpose', [`${p}${t}4`], `${p}${t}h`, { perm }));
      return `${p}${t}h`;
    };
    const q = proj('q', [0, 2, 1, 3], gain);
    const k = proj('k', [0, 2, 3, 1], gain);
    const v = proj('v', [0, 2, 1, 3], 1);
    nodes.push(node('MatMul', [q, k], `${p}qk`), node('Div', [`${p}qk`, scalar(`${p}sqrt_h`, Math.sqrt(hd))], `${p}scores`));
    nodes.push(node('Add', [`${p}scores`, 'mask_bias'], `${p}masked`), node('Softmax', [`${p}masked`], `${p}probs`, { axis: 3 }));
    nodes.push(node('MatMul', [`${p}probs`, v], `${p}ctx`), node('Transpose', [`${p}ctx`], `${p}ctx_t`, { perm: [0, 2, 1, 3] }));
    nodes.push(node('Reshape', [`${p}ctx_t`, 'merge_shape'], `${p}ctx_m`));
    const attn = dense(`${p}ctx_m`, `${p}o`, d, d, 100 * l + 50);
    nodes.push(node('Add', [attn, x], `${p}res1`));
    const y = ln(`${p}res1`, `${p}ln1`, 100 * l + 60);
    const ff1 = dense(y, `${p}ff1`, d, 4 * d, 100 * l + 70);
    // GELU written out with Erf, as exporters do; onnxruntime fuses it.
    nodes.push(node('Div', [ff1, scalar(`${p}sqrt2`, Math.SQRT2)], `${p}g0`), node('Erf', [`${p}g0`], `${p}g1`));
    nodes.push(node('Add', [`${p}g1`, scalar(`${p}onef`, 1)], `${p}g2`), node('Mul', [ff1, `${p}g2`], `${p}g3`));
    nodes.push(node('Mul', [`${p}g3`, scalar(`${p}half`, 0.5)], `${p}gelu`));
    const ff2 = dense(`${p}gelu`, `${p}ff2`, 4 * d, d, 100 * l + 80);
    nodes.push(node('Add', [ff2, y], `${p}res2`));
    x = ln(`${p}res2`, `${p}ln2`, 100 * l + 90);
  }
  return benchModel({
    name: 'bert', node: nodes, initializer: inits,
    input: [value('input_ids', DataType.INT64, ['batch', 'sequence']), value('attention_mask', DataType.INT64, ['batch', 'sequence'])],
    output: [value(x, DataType.FLOAT, ['batch', 'sequence', d])],
  }, { opsetImport: [{ domain: '', version: 12 }] });
}

/** The model file for a config, generated once and cached. */
export function bertFile(cfg: BertConfig): string {
  return cachedModel(CACHE, `bert-${cfg.layers}x${cfg.hidden}-h${cfg.heads}-v${cfg.vocab}-g${cfg.qkGain ?? 1}.onnx`, () => buildBert(cfg));
}
