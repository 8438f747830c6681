/**
 * Small models verify can run from synthesised inputs alone, one per place a site can be: fused attention
 * operators behind projections (com.microsoft MultiHeadAttention with a cache and for cross attention,
 * GroupQueryAttention, DecoderMaskedMultiHeadAttention, com.microsoft Attention, ONNX Attention), and plain-op
 * attention inside If branches, a Loop body and a Scan body. Weights are random; sequence axes are dynamic.
 */
import { DataType, GraphProto, ModelProto, NodeProto, ValueInfoProto } from '../../src/io/onnx';
import { attentionNodes, f32, graphAttr, i64, model, node, randoms, value } from './build';

const D = 16, N = 2, H = 8;

function ms(opType: string, inputs: string[], outputs: string[], attrs: Record<string, number>): NodeProto {
  return { ...node(opType, inputs, outputs, attrs, opType), domain: 'com.microsoft' };
}

function withMs(m: ModelProto): ModelProto {
  m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
  return m;
}

const weight = (name: string, rows: number, cols: number, seed: number, amp = 0.6): ReturnType<typeof f32> =>
  f32(name, [rows, cols], randoms(rows * cols, seed, amp));

/** q, k, v projections of `x` (and of `kv` for k and v), and the output projection of `out`. */
function projections(x: string, kv: string, kvWidth = D): { nodes: NodeProto[]; inits: ReturnType<typeof f32>[] } {
  return {
    nodes: [node('MatMul', [x, 'wq'], ['q']), node('MatMul', [kv, 'wk'], ['k']), node('MatMul', [kv, 'wv'], ['v'])],
    inits: [weight('wq', D, D, 1), weight('wk', D, kvWidth, 2), weight('wv', D, kvWidth, 3, 0.3), weight('wo', D, D, 4, 0.3)],
  };
}

/** The output projection, after the attention operator. */
const output = (): NodeProto => node('MatMul', ['attn', 'wo'], ['y']);

/** A value of an element type, shape left open (subgraph inputs and outputs). */
const open = (name: string, elemType: number): ValueInfoProto => ({ name, type: { tensorType: { elemType } } });

/** com.microsoft MultiHeadAttention, causal (unidirectional) with a KV cache. */
export function mhaCacheModel(): ModelProto {
  const p = projections('hidden_states', 'hidden_states');
  return withMs(model({
    nodes: [...p.nodes, ms('MultiHeadAttention', ['q', 'k', 'v', '', '', '', 'past_key', 'past_value'], ['attn', 'present_key', 'present_value'], { num_heads: N, unidirectional: 1 }), output()],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D]), value('past_key', DataType.FLOAT, ['batch', N, 'past_sequence', H]),
      value('past_value', DataType.FLOAT, ['batch', N, 'past_sequence', H])],
    outputs: ['y', 'present_key', 'present_value'].map((o) => value(o, DataType.FLOAT, [])), initializers: p.inits,
  }));
}

/** com.microsoft MultiHeadAttention over an encoder's states (cross attention, keys mode), with a bias. */
export function mhaCrossModel(): ModelProto {
  const p = projections('hidden_states', 'encoder_hidden_states');
  return withMs(model({
    nodes: [...p.nodes, ms('MultiHeadAttention', ['q', 'k', 'v', 'bias'], ['attn'], { num_heads: N }), output()],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D]), value('encoder_hidden_states', DataType.FLOAT, ['batch', 'encoder_sequence', D])],
    outputs: [value('y', DataType.FLOAT, [])], initializers: [...p.inits, f32('bias', [3 * D], randoms(3 * D, 9, 0.2))],
  }));
}

/** com.microsoft GroupQueryAttention (4 query heads, 2 key/value heads), prompt and decoding with a cache. */
export function gqaModel(): ModelProto {
  const Nq = 2, Nkv = 1;
  const p = projections('hidden_states', 'hidden_states', Nkv * H);
  return withMs(model({
    nodes: [...p.nodes, ms('GroupQueryAttention', ['q', 'k', 'v', 'past_key', 'past_value', 'seqlens_k', 'total_sequence_length'], ['attn', 'present_key', 'present_value'],
      { num_heads: Nq, kv_num_heads: Nkv }), output()],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D]), value('past_key', DataType.FLOAT, ['batch', Nkv, 'past_sequence', H]),
      value('past_value', DataType.FLOAT, ['batch', Nkv, 'past_sequence', H]), value('seqlens_k', DataType.INT32, ['batch']), value('total_sequence_length', DataType.INT32, [])],
    outputs: ['y', 'present_key', 'present_value'].map((o) => value(o, DataType.FLOAT, [])), initializers: p.inits,
  }));
}

/** ONNX Attention (opset 23), 3-D inputs with q_num_heads, causal, with a cache. */
export function onnxAttentionModel(): ModelProto {
  const p = projections('hidden_states', 'hidden_states');
  return model({
    opset: 23,
    nodes: [...p.nodes, node('Attention', ['q', 'k', 'v', '', 'past_key', 'past_value'], ['attn', 'present_key', 'present_value'], { q_num_heads: N, kv_num_heads: N, is_causal: 1 }), output()],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D]), value('past_key', DataType.FLOAT, ['batch', N, 'past_sequence', H]),
      value('past_value', DataType.FLOAT, ['batch', N, 'past_sequence', H])],
    outputs: ['y', 'present_key', 'present_value'].map((o) => value(o, DataType.FLOAT, [])), initializers: p.inits,
  });
}

/** The same with a softcap: the patch expands it (the factor goes after the cap, on the logits). */
export function onnxSoftcapModel(): ModelProto {
  const m = onnxAttentionModel();
  m.graph!.node.find((n) => n.opType === 'Attention')!.attribute.push({ name: 'softcap', type: 1, f: 2.5, floats: [], ints: [], strings: [], tensors: [], graphs: [] });
  return m;
}

/** com.microsoft Attention (Q, K and V computed inside from one weight), keys mode. */
export function msAttentionModel(): ModelProto {
  return withMs(model({
    nodes: [ms('Attention', ['hidden_states', 'qkv_weight', 'qkv_bias'], ['attn'], { num_heads: N }), node('MatMul', ['attn', 'wo'], ['y'])],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D])],
    outputs: [value('y', DataType.FLOAT, [])],
    initializers: [weight('qkv_weight', D, 3 * D, 5), f32('qkv_bias', [3 * D], randoms(3 * D, 6, 0.2)), weight('wo', D, D, 4, 0.3)],
  }));
}

/**
 * com.microsoft DecoderMaskedMultiHeadAttention: one new token over a cache in a shared buffer (the CPU kernel
 * needs one), past_sequence_length of it valid.
 */
export function dmmhaModel(): ModelProto {
  const p = projections('hidden_states', 'hidden_states');
  return withMs(model({
    nodes: [...p.nodes, ms('DecoderMaskedMultiHeadAttention', ['q', 'k', 'v', '', '', 'past_key', 'past_value', 'past_sequence_length'], ['attn', 'present_key', 'present_value'],
      { num_heads: N, past_present_share_buffer: 1 }), output()],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 1, D]), value('past_key', DataType.FLOAT, ['batch', N, 'total_sequence', H]),
      value('past_value', DataType.FLOAT, ['batch', N, 'total_sequence', H]), value('past_sequence_length', DataType.INT32, [1])],
    outputs: ['y', 'present_key', 'present_value'].map((o) => value(o, DataType.FLOAT, [])), initializers: p.inits,
  }));
}

// ---- plain-op attention in subgraphs ----------------------------------------------------------------------

/** q, k, v [batch, N, sequence, H] from one input through projections per head. */
function headsFrom(x: string): { nodes: NodeProto[]; inits: ReturnType<typeof f32>[] } {
  const split = (t: string): NodeProto[] => [
    node('Reshape', [`${t}_flat`, 'split_heads'], [`${t}_4d`]), node('Transpose', [`${t}_4d`], [t], { perm: [0, 2, 1, 3] }),
  ];
  return {
    nodes: [node('MatMul', [x, 'wq'], ['q_flat']), node('MatMul', [x, 'wk'], ['k_flat']), node('MatMul', [x, 'wv'], ['v_flat']), ...split('q'), ...split('k'), ...split('v')],
    inits: [weight('wq', D, D, 1), weight('wk', D, D, 2), weight('wv', D, D, 3, 0.3), i64('split_heads', [0, 0, N, H]), f32('sqrt_d', [], [Math.sqrt(H)])],
  };
}

const merge = (t: string, out: string): NodeProto[] => [
  node('Transpose', [t], [`${out}_t`], { perm: [0, 2, 1, 3] }), node('Reshape', [`${out}_t`, 'merge_heads'], [out]),
];

function branch(name: string, nodes: NodeProto[], output: string): GraphProto {
  return { name, node: nodes, input: [], output: [open(output, DataType.FLOAT)], initializer: [], valueInfo: [] };
}

/** An If whose branches each hold attention (keys and queries swapped in one), on a bool input. */
export function ifModel(): ModelProto {
  const h = headsFrom('hidden_states');
  return model({
    nodes: [...h.nodes, { ...node('If', ['use_self'], ['attn4'], {}, 'If'), attribute: [
      graphAttr('then_branch', branch('then', attentionNodes('q', 'k', 'v', 'then_out', 'then'), 'then_out')),
      graphAttr('else_branch', branch('else', attentionNodes('k', 'q', 'v', 'else_out', 'else'), 'else_out')),
    ] }, ...merge('attn4', 'y')],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D]), value('use_self', DataType.BOOL, [])],
    outputs: [value('y', DataType.FLOAT, ['batch', 'sequence', D])], initializers: [...h.inits, i64('merge_heads', [0, 0, D])],
  });
}

/** A Loop whose body applies attention to its state twice over. */
export function loopModel(): ModelProto {
  const h = headsFrom('hidden_states');
  const body: GraphProto = {
    name: 'body', initializer: [], valueInfo: [],
    input: [value('i', DataType.INT64, []), value('c_in', DataType.BOOL, []), open('state', DataType.FLOAT)],
    output: [value('c_out', DataType.BOOL, []), open('state_out', DataType.FLOAT)],
    node: [node('Identity', ['c_in'], ['c_out'], {}, 'loop_cond'), ...attentionNodes('state', 'k', 'v', 'state_out', 'loop')],
  };
  const go = { ...i64('go', [1], true), dataType: DataType.BOOL, rawData: Uint8Array.from([1]) };
  return model({
    nodes: [...h.nodes, { ...node('Loop', ['trips', 'go', 'q'], ['attn4'], {}, 'Loop'), attribute: [graphAttr('body', body)] }, ...merge('attn4', 'y')],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D])],
    outputs: [value('y', DataType.FLOAT, ['batch', 'sequence', D])], initializers: [...h.inits, i64('trips', [2], true), go, i64('merge_heads', [0, 0, D])],
  });
}

/** A Scan over the batch whose body applies attention to one item ([N, S, H], 3-D logits). */
export function scanModel(): ModelProto {
  const h = headsFrom('hidden_states');
  const body: GraphProto = {
    name: 'scan_body', initializer: [], valueInfo: [],
    input: ['qs', 'ks', 'vs'].map((n) => open(n, DataType.FLOAT)), output: [open('os', DataType.FLOAT)],
    node: [
      node('Transpose', ['ks'], ['scan_kt'], { perm: [0, 2, 1] }, 'scan_Transpose'), node('MatMul', ['qs', 'scan_kt'], ['scan_mm'], {}, 'scan_MatMul'),
      node('Div', ['scan_mm', 'sqrt_d'], ['scan_scores'], {}, 'scan_Div'), node('Softmax', ['scan_scores'], ['scan_p'], { axis: -1 }, 'scan_Softmax'),
      node('MatMul', ['scan_p', 'vs'], ['os'], {}, 'scan_MatMulV'),
    ],
  };
  return model({
    nodes: [...h.nodes, { ...node('Scan', ['q', 'k', 'v'], ['attn4'], { num_scan_inputs: 3 }, 'Scan'), attribute: [graphAttr('body', body), node('x', [], [], { num_scan_inputs: 3 }).attribute[0]] },
      ...merge('attn4', 'y')],
    inputs: [value('hidden_states', DataType.FLOAT, ['batch', 'sequence', D])],
    outputs: [value('y', DataType.FLOAT, ['batch', 'sequence', D])], initializers: [...h.inits, i64('merge_heads', [0, 0, D])],
  });
}
