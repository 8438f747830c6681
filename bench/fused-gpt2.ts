/**
 * A GPT-2-shaped decoder as onnxruntime's transformers optimizer leaves it: each attention block one
 * com.microsoft Attention node (unidirectional=1, QKV from merged `weights` and `bias`, the attention mask as a
 * raw int32 [B, T] mask_index, the cache stacked as past/present [2, B, N, P, H]), FastGelu for the MLP, and
 * residual Add + LayerNormalization (onnxruntime fuses them into SkipLayerNormalization at session start).
 * Random weights; generated into the benchmark cache, never committed.
 */
import { makeTensor } from '../src/graph/tensor';
import { DataType, ModelProto, NodeProto, TensorProto } from '../src/io/onnx';
import { attribute } from '../src/verify/nodes';
import { CACHE, cachedModel, DecoderConfig, random } from './decoder';
import { benchModel, value } from './transformer';

/** Positions the learned table covers: a 1024-token cache plus a few new ones. */
const POSITIONS = 1536;

export function buildFusedGpt2(cfg: DecoderConfig): ModelProto {
  const { layers, heads, hidden: d, vocab } = cfg;
  const nodes: NodeProto[] = [];
  const inits: TensorProto[] = [];
  const weight = (name: string, dims: number[], amp: number, seed: number): string => {
    inits.push(makeTensor(name, DataType.FLOAT, dims, random(dims.reduce((a, b) => a * b, 1), amp, seed)));
    return name;
  };
  const op = (opType: string, input: string[], output: string[], attrs: Record<string, number> = {}, domain = ''): void => {
    nodes.push({ opType, domain, input, output, name: output[0], attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)) });
  };
  inits.push(makeTensor('ones', DataType.FLOAT, [d], new Array(d).fill(1)), makeTensor('zeros', DataType.FLOAT, [d], new Array(d).fill(0)));
  op('Gather', [weight('wte', [vocab, d], 0.1, 1), 'input_ids'], ['tok']);
  op('Gather', [weight('wpe', [POSITIONS, d], 0.1, 2), 'position_ids'], ['pos']);
  op('Add', ['tok', 'pos'], ['h0']);
  const inputs = [value('input_ids', DataType.INT64, ['batch', 'sequence']), value('position_ids', DataType.INT64, ['batch', 'sequence']),
    value('attention_mask', DataType.INT32, ['batch', 'total_sequence'])];
  const outputs = [value('logits', DataType.FLOAT, ['batch', 'sequence', vocab])];
  let h = 'h0';
  for (let l = 0; l < layers; l++) {
    const p = `l${l}_`;
    inputs.push(value(`past_${l}`, DataType.FLOAT, [2, 'batch', heads, 'past_sequence', d / heads]));
    outputs.push(value(`present_${l}`, DataType.FLOAT, [2, 'batch', heads, 'total_sequence', d / heads]));
    op('LayerNormalization', [h, 'ones', 'zeros'], [`${p}ln1`], { axis: -1 });
    op('Attention', [`${p}ln1`, weight(`${p}qkv_w`, [d, 3 * d], 0.9 / Math.sqrt(d), 100 + l), weight(`${p}qkv_b`, [3 * d], 0.02, 200 + l),
      'attention_mask', `past_${l}`], [`${p}attn`, `present_${l}`], { num_heads: heads, unidirectional: 1 }, 'com.microsoft');
    op('MatMul', [`${p}attn`, weight(`${p}proj_w`, [d, d], 1 / Math.sqrt(d), 300 + l)], [`${p}proj`]);
    op('Add', [`${p}proj`, weight(`${p}proj_b`, [d], 0.02, 400 + l)], [`${p}proj_b_out`]);
    op('Add', [h, `${p}proj_b_out`], [`${p}h1`]);
    op('LayerNormalization', [`${p}h1`, 'ones', 'zeros'], [`${p}ln2`], { axis: -1 });
    op('MatMul', [`${p}ln2`, weight(`${p}fc_w`, [d, 4 * d], 1 / Math.sqrt(d), 500 + l)], [`${p}fc`]);
    op('FastGelu', [`${p}fc`, weight(`${p}fc_b`, [4 * d], 0.02, 600 + l)], [`${p}gelu`], {}, 'com.microsoft');
    op('MatMul', [`${p}gelu`, weight(`${p}out_w`, [4 * d, d], 1 / Math.sqrt(4 * d), 700 + l)], [`${p}mlp`]);
    op('Add', [`${p}h1`, `${p}mlp`], [`${p}h2`]);
    h = `${p}h2`;
  }
  op('LayerNormalization', [h, 'ones', 'zeros'], ['ln_f'], { axis: -1 });
  op('Transpose', ['wte'], ['wte_t']);
  op('MatMul', ['ln_f', 'wte_t'], ['logits']);
  return benchModel({ name: 'gpt2_fused', node: nodes, input: inputs, output: outputs, initializer: inits }, {
    producerName: 'ssmax-patch bench (onnxruntime-optimizer-shaped GPT-2)',
    opsetImport: [{ domain: '', version: 17 }, { domain: 'com.microsoft', version: 1 }],
  });
}

/** The model file for a config, generated once and cached. */
export function fusedGpt2File(cfg: DecoderConfig): string {
  return cachedModel(CACHE, `gpt2-fused-${cfg.layers}x${cfg.hidden}-h${cfg.heads}-v${cfg.vocab}.onnx`, () => buildFusedGpt2(cfg));
}
