/**
 * Tiny attention models with the input signatures real exports have, for input-synthesis tests: float16 and
 * bfloat16 hidden states, cross-attention over encoder_hidden_states, and a patch embedding over
 * pixel_values with symbolic height and width. Two heads of size 4 over a hidden size of 8.
 */
import { DataType, ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../../src/io/onnx';
import { f32, i64, model, node, randoms, value } from './build';

const HID = 8;

function attention(x: string, source: string, nodes: NodeProto[], inits: TensorProto[]): string {
  inits.push(i64('split', [0, 0, 2, 4]), i64('merge', [0, 0, HID]), f32('two', [], [2]));
  ['q', 'k', 'v'].forEach((p, i) => inits.push(f32(`w_${p}`, [HID, HID], randoms(HID * HID, 31 + i, 0.9))));
  for (const p of ['q', 'k', 'v']) {
    nodes.push(node('MatMul', [p === 'q' ? x : source, `w_${p}`], [`${p}_proj`]), node('Reshape', [`${p}_proj`, 'split'], [`${p}4`]));
    nodes.push(node('Transpose', [`${p}4`], [`${p}h`], { perm: p === 'k' ? [0, 2, 3, 1] : [0, 2, 1, 3] }));
  }
  nodes.push(node('MatMul', ['qh', 'kh'], ['qk']), node('Div', ['qk', 'two'], ['scores']), node('Softmax', ['scores'], ['probs'], { axis: -1 }));
  nodes.push(node('MatMul', ['probs', 'vh'], ['ctx']), node('Transpose', ['ctx'], ['ctx_t'], { perm: [0, 2, 1, 3] }), node('Reshape', ['ctx_t', 'merge'], ['hidden']));
  return 'hidden';
}

/** Self-attention over x [batch, sequence, 8] of `elemType`, cast to float inside and back at the output. */
export function castAttentionModel(elemType: number): ModelProto {
  const nodes: NodeProto[] = [node('Cast', ['x'], ['x_f'], { to: DataType.FLOAT })];
  const inits: TensorProto[] = [];
  const hidden = attention('x_f', 'x_f', nodes, inits);
  nodes.push(node('Cast', [hidden], ['y'], { to: elemType }));
  return model({ nodes, inputs: [value('x', elemType, ['batch', 'sequence', HID])], outputs: [value('y', elemType, ['batch', 'sequence', HID])], initializers: inits });
}

/** Decoder cross-attention: queries from inputs_embeds, keys and values from encoder_hidden_states. */
export function crossAttentionModel(): ModelProto {
  const nodes: NodeProto[] = [];
  const inits: TensorProto[] = [];
  const hidden = attention('inputs_embeds', 'encoder_hidden_states', nodes, inits);
  nodes.push(node('Identity', [hidden], ['y']));
  const inputs: ValueInfoProto[] = [
    value('inputs_embeds', DataType.FLOAT, ['batch', 'decoder_sequence_length', HID]),
    value('encoder_hidden_states', DataType.FLOAT, ['batch', 'encoder_sequence_length', HID]),
  ];
  return model({ nodes, inputs, outputs: [value('y', DataType.FLOAT, ['batch', 'decoder_sequence_length', HID])], initializers: inits });
}

/** ViT-like: 4×4 patches of pixel_values [batch, 3, height, width] embedded by a Conv, then self-attention. */
export function pixelAttentionModel(): ModelProto {
  const inits: TensorProto[] = [f32('patch_w', [HID, 3, 4, 4], randoms(HID * 3 * 16, 41, 0.4)), i64('flat', [0, HID, -1])];
  const nodes: NodeProto[] = [
    node('Conv', ['pixel_values', 'patch_w'], ['patches'], { kernel_shape: [4, 4], strides: [4, 4] }),
    node('Reshape', ['patches', 'flat'], ['tokens_t']),
    node('Transpose', ['tokens_t'], ['tokens'], { perm: [0, 2, 1] }),
  ];
  const hidden = attention('tokens', 'tokens', nodes, inits);
  nodes.push(node('Identity', [hidden], ['y']));
  return model({
    nodes, inputs: [value('pixel_values', DataType.FLOAT, ['batch', 3, 'height', 'width'])],
    outputs: [value('y', DataType.FLOAT, ['batch', 'tokens', HID])], initializers: inits,
  });
}

/**
 * Self-attention whose residual Add and LayerNormalization onnxruntime's extended fusions turn into
 * SkipLayerNormalization: its kernel computes the variance in one pass (E[x²] − E[x]²), which cancels where the
 * activations sit far from 0 with a small spread (here 32 ± 1e-3), so the model's own outputs differ between graph
 * optimisation levels 'basic' and 'all' (as in onnxruntime's GPT-2 fusion tests).
 */
export function skipLayerNormModel(): ModelProto {
  const nodes: NodeProto[] = [node('Mul', ['x', 'small'], ['x_small']), node('Add', ['x_small', 'offset'], ['skip'])];
  const inits: TensorProto[] = [
    f32('small', [], [1e-3]), f32('offset', [], [32]), f32('ln_scale', [HID], new Array<number>(HID).fill(1)), f32('ln_bias', [HID], new Array<number>(HID).fill(0)),
  ];
  const hidden = attention('x_small', 'x_small', nodes, inits);
  nodes.push(node('Add', [hidden, 'skip'], ['residual']), node('LayerNormalization', ['residual', 'ln_scale', 'ln_bias'], ['y'], { axis: -1 }));
  return model({ nodes, inputs: [value('x', DataType.FLOAT, ['batch', 'sequence', HID])], outputs: [value('y', DataType.FLOAT, ['batch', 'sequence', HID])], initializers: inits });
}
