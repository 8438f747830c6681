/**
 * Decoder-only transformers built from plain ONNX ops with random weights, for latency benchmarks: pre-LN blocks,
 * fused QKV projection, a causal mask built at run time (Trilu over −inf, offset for the cache), a KV cache,
 * GELU MLP. Cached under ~/.cache/ssmax-patch-bench so repeated runs skip generation.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { makeTensor } from '../src/graph/tensor';
import { writeModel } from '../src/io/model-file';
import { DataType, ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../src/io/onnx';
import { node } from '../src/verify/nodes';
import { benchModel, value } from './transformer';

export interface DecoderConfig {
  layers: number;
  heads: number;
  hidden: number;
  vocab: number;
}

/** The benchmarks' model cache, outside the repository. */
export const CACHE = path.join(os.homedir(), '.cache', 'ssmax-patch-bench');

/** The model file `name` in `dir`, built and written on first use. */
export function cachedModel(dir: string, name: string, build: () => ModelProto): string {
  const file = path.join(dir, name);
  if (!fs.existsSync(file)) {
    fs.mkdirSync(dir, { recursive: true });
    writeModel(file, build());
  }
  return file;
}

/** `count` values uniform in [−amp, amp] from a linear congruential generator. */
export function random(count: number, amp: number, seed: number): number[] {
  let x = seed >>> 0;
  const out = new Array<number>(count);
  for (let i = 0; i < count; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out[i] = ((x / 4294967296) * 2 - 1) * amp;
  }
  return out;
}

export function buildDecoder(cfg: DecoderConfig): ModelProto {
  const { layers, heads, hidden: d, vocab } = cfg;
  const hd = d / heads;
  const nodes: NodeProto[] = [];
  const inits: TensorProto[] = [];
  const f32 = (name: string, dims: number[], std: number, seed: number): string => {
    const count = dims.reduce((a, b) => a * b, 1);
    inits.push(makeTensor(name, DataType.FLOAT, dims, std === 0 ? new Array(count).fill(1) : random(count, std, seed).map((v) => v * 1.732)));
    return name;
  };
  const i64 = (name: string, values: number[], scalar = false): string => {
    inits.push(makeTensor(name, DataType.INT64, scalar ? [] : [values.length], values));
    return name;
  };
  f32('wte', [vocab, d], 0.5, 1);
  i64('heads_shape', [0, 0, heads, hd]);
  i64('merge_shape', [0, 0, d]);
  i64('one', [1], true);
  inits.push(makeTensor('sqrt_d', DataType.FLOAT, [], [Math.sqrt(hd)]));
  // Causal mask [Tq, Tk]: −inf above the diagonal shifted by the past length.
  nodes.push(node('Shape', ['input_ids'], 'ids_shape'), node('Gather', ['ids_shape', i64('axis1', [1], true)], 'tq'));
  nodes.push(node('Shape', ['past_key_0'], 'past_shape'), node('Gather', ['past_shape', i64('axis2', [2], true)], 'tpast'));
  nodes.push(node('Add', ['tq', 'tpast'], 'tk'), node('Add', ['tpast', 'one'], 'diag'));
  nodes.push(node('Unsqueeze', ['tq', i64('ax0', [0])], 'tq1'), node('Unsqueeze', ['tk', 'ax0'], 'tk1'));
  nodes.push(node('Concat', ['tq1', 'tk1'], 'mask_shape', { axis: 0 }));
  nodes.push(node('ConstantOfShape', ['mask_shape'], 'full', { value: makeTensor('v', DataType.FLOAT, [1], [-Infinity]) }));
  nodes.push(node('Trilu', ['full', 'diag'], 'causal', { upper: 1 }));
  nodes.push(node('Gather', ['wte', 'input_ids'], 'h0'));
  let h = 'h0';
  const inputs = [value('input_ids', DataType.INT64, ['batch', 'sequence'])];
  const outputs: ValueInfoProto[] = [];
  for (let l = 0; l < layers; l++) {
    const p = `l${l}_`;
    const ln = (x: string, tag: string): string => {
      nodes.push(node('LayerNormalization', [x, f32(`${p}${tag}_g`, [d], 0, 0), f32(`${p}${tag}_b`, [d], 0.01, 7 + l)], `${p}${tag}`, { axis: -1 }));
      return `${p}${tag}`;
    };
    const x = ln(h, 'ln1');
    nodes.push(node('MatMul', [x, f32(`${p}wqkv`, [d, 3 * d], 0.9 / Math.sqrt(d), 100 + l)], `${p}qkv`));
    nodes.push({ ...node('Split', [`${p}qkv`, i64(`${p}split`, [d, d, d])], `${p}q`, { axis: 2 }), output: [`${p}q`, `${p}k`, `${p}v`] });
    for (const t of ['q', 'k', 'v']) {
      nodes.push(node('Reshape', [`${p}${t}`, 'heads_shape'], `${p}${t}4`), node('Transpose', [`${p}${t}4`], `${p}${t}h`, { perm: [0, 2, 1, 3] }));
    }
    inputs.push(value(`past_key_${l}`, DataType.FLOAT, ['batch', heads, 'past_sequence', hd]), value(`past_value_${l}`, DataType.FLOAT, ['batch', heads, 'past_sequence', hd]));
    nodes.push(node('Concat', [`past_key_${l}`, `${p}kh`], `present_key_${l}`, { axis: 2 }), node('Concat', [`past_value_${l}`, `${p}vh`], `present_value_${l}`, { axis: 2 }));
    outputs.push(value(`present_key_${l}`, DataType.FLOAT, ['batch', heads, 'total_sequence', hd]), value(`present_value_${l}`, DataType.FLOAT, ['batch', heads, 'total_sequence', hd]));
    nodes.push(node('Transpose', [`present_key_${l}`], `${p}kt`, { perm: [0, 1, 3, 2] }));
    nodes.push(node('MatMul', [`${p}qh`, `${p}kt`], `${p}qk`), node('Div', [`${p}qk`, 'sqrt_d'], `${p}scores`));
    nodes.push(node('Add', [`${p}scores`, 'causal'], `${p}masked`), node('Softmax', [`${p}masked`], `${p}probs`, { axis: -1 }));
    nodes.push(node('MatMul', [`${p}probs`, `present_value_${l}`], `${p}ctx`), node('Transpose', [`${p}ctx`], `${p}ctx_t`, { perm: [0, 2, 1, 3] }));
    nodes.push(node('Reshape', [`${p}ctx_t`, 'merge_shape'], `${p}ctx_m`));
    nodes.push(node('MatMul', [`${p}ctx_m`, f32(`${p}wo`, [d, d], 1 / Math.sqrt(d), 200 + l)], `${p}attn`), node('Add', [h, `${p}attn`], `${p}h1`));
    const y = ln(`${p}h1`, 'ln2');
    nodes.push(node('MatMul', [y, f32(`${p}w1`, [d, 4 * d], 1 / Math.sqrt(d), 300 + l)], `${p}ff1`));
    inits.push(makeTensor(`${p}sqrt2`, DataType.FLOAT, [], [Math.SQRT2]), makeTensor(`${p}half`, DataType.FLOAT, [], [0.5]), makeTensor(`${p}onef`, DataType.FLOAT, [], [1]));
    // GELU written out with Erf, as exporters do; onnxruntime fuses it.
    nodes.push(node('Div', [`${p}ff1`, `${p}sqrt2`], `${p}g0`), node('Erf', [`${p}g0`], `${p}g1`), node('Add', [`${p}g1`, `${p}onef`], `${p}g2`));
    nodes.push(node('Mul', [`${p}ff1`, `${p}g2`], `${p}g3`), node('Mul', [`${p}g3`, `${p}half`], `${p}gelu`));
    nodes.push(node('MatMul', [`${p}gelu`, f32(`${p}w2`, [4 * d, d], 1 / Math.sqrt(4 * d), 400 + l)], `${p}ff2`), node('Add', [`${p}h1`, `${p}ff2`], `${p}h2`));
    h = `${p}h2`;
  }
  nodes.push(node('Transpose', ['wte'], 'wte_t', { perm: [1, 0] }), node('MatMul', [h, 'wte_t'], 'logits'));
  outputs.unshift(value('logits', DataType.FLOAT, ['batch', 'sequence', vocab]));
  return benchModel({ name: 'decoder', node: nodes, input: inputs, output: outputs, initializer: inits });
}

/** The model file for a config, generated once and cached. */
export function decoderFile(cfg: DecoderConfig): string {
  return cachedModel(CACHE, `decoder-${cfg.layers}x${cfg.hidden}-h${cfg.heads}-v${cfg.vocab}.onnx`, () => buildDecoder(cfg));
}
