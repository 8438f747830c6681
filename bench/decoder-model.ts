/**
 * A GPT-style decoder of plain ONNX ops with random weights, for benchmarks: 12 layers, d = 768, 12 heads,
 * MLP 3072, vocab 8192, learned positions (4096 rows): about 100 M parameters. Generated into a cache folder
 * outside the repository, never committed.
 */
import { makeTensor } from '../src/graph/tensor';
import { DataType, ModelProto, NodeProto, TensorProto } from '../src/io/onnx';
import { node } from '../src/verify/nodes';
import { CACHE, cachedModel, DecoderConfig } from './decoder';
import { benchModel, Random, value } from './transformer';

export interface DecoderModelConfig extends DecoderConfig {
  mlp: number;
  positions: number;
}

export const DECODER_100M: DecoderModelConfig = { layers: 12, hidden: 768, heads: 12, mlp: 3072, vocab: 8192, positions: 4096 };

export function benchCacheDir(): string {
  return process.env.SSMAX_BENCH_CACHE ?? CACHE;
}

export function parameterCount(c: DecoderModelConfig): number {
  const layer = 4 * c.hidden * c.hidden + 4 * c.hidden + 2 * c.hidden * c.mlp + c.mlp + c.hidden + 4 * c.hidden;
  return c.layers * layer + 2 * c.vocab * c.hidden + c.positions * c.hidden + 2 * c.hidden;
}

/** The model file for `c`, generated on first use. */
export function decoderModelFile(c: DecoderModelConfig = DECODER_100M): string {
  return cachedModel(benchCacheDir(), `decoder-${c.layers}x${c.hidden}-h${c.heads}-v${c.vocab}-p${c.positions}.onnx`, () => buildDecoder(c));
}

export function buildDecoder(c: DecoderModelConfig): ModelProto {
  const nodes: NodeProto[] = [];
  const inits: TensorProto[] = [];
  const rnd = new Random(7);
  const headDim = c.hidden / c.heads;
  let counter = 0;
  const op = (opType: string, inputs: string[], attrs: Record<string, number | number[] | TensorProto> = {}, name?: string): string => {
    const out = `${name ?? opType.toLowerCase()}_${counter++}`;
    nodes.push(node(opType, inputs, out, attrs));
    return out;
  };
  const weight = (name: string, dims: number[], scale: number): string => {
    const count = dims.reduce((a, b) => a * b, 1);
    const data = new Float32Array(count);
    for (let i = 0; i < count; i++) data[i] = rnd.uniform(scale);
    inits.push({ ...makeTensor(name, DataType.FLOAT, dims, []), rawData: new Uint8Array(data.buffer) });
    return name;
  };
  const constant = (name: string, dims: number[], values: number[], type: number = DataType.FLOAT): string => {
    inits.push(makeTensor(name, type, dims, values));
    return name;
  };
  const std = 0.02 * Math.sqrt(3);
  const ones = constant('ones', [c.hidden], new Array(c.hidden).fill(1));
  const zeros = constant('zeros', [c.hidden], new Array(c.hidden).fill(0));
  const norm = (x: string): string => op('LayerNormalization', [x, ones, zeros], { axis: -1 }, 'ln');

  // Positions 0..T-1 and the causal mask, both from the run-time sequence length.
  const shape = op('Shape', ['input_ids']);
  const seq = op('Gather', [shape, constant('axis1', [], [1], DataType.INT64)], { axis: 0 }, 'seq');
  const positions = op('Range', [constant('zero', [], [0], DataType.INT64), seq, constant('one', [], [1], DataType.INT64)], {}, 'positions');
  const seq1 = op('Unsqueeze', [seq, constant('axes0', [1], [0], DataType.INT64)], {}, 'seq1');
  const square = op('Concat', [seq1, seq1], { axis: 0 }, 'square');
  const minusInf = makeTensor('minus_inf', DataType.FLOAT, [1], [-Infinity]);
  const full = op('ConstantOfShape', [square], { value: minusInf }, 'full');
  const mask = op('Trilu', [full, constant('k1', [], [1], DataType.INT64)], { upper: 1 }, 'causal_mask');

  let x = op('Add', [
    op('Gather', [weight('wte', [c.vocab, c.hidden], std), 'input_ids'], {}, 'tok'),
    op('Gather', [weight('wpe', [c.positions, c.hidden], std), positions], {}, 'pos'),
  ], {}, 'embed');
  const split = constant('split_heads', [4], [0, 0, c.heads, headDim], DataType.INT64);
  const merge = constant('merge_heads', [3], [0, 0, c.hidden], DataType.INT64);
  const sqrtD = constant('sqrt_d', [], [Math.sqrt(headDim)]);
  for (let l = 0; l < c.layers; l++) {
    const h = norm(x);
    const proj = (kind: string): string => op('Add', [op('MatMul', [h, weight(`l${l}.${kind}.w`, [c.hidden, c.hidden], std)]), weight(`l${l}.${kind}.b`, [c.hidden], std)]);
    const heads = (t: string, perm: number[]): string => op('Transpose', [op('Reshape', [t, split])], { perm });
    const q = heads(proj('q'), [0, 2, 1, 3]);
    const kT = heads(proj('k'), [0, 2, 3, 1]);
    const v = heads(proj('v'), [0, 2, 1, 3]);
    const logits = op('Div', [op('MatMul', [q, kT], {}, `l${l}.qk`), sqrtD], {}, `l${l}.scale`);
    const probs = op('Softmax', [op('Add', [logits, mask], {}, `l${l}.mask`)], { axis: -1 }, `l${l}.softmax`);
    const ctx = op('Reshape', [op('Transpose', [op('MatMul', [probs, v], {}, `l${l}.pv`)], { perm: [0, 2, 1, 3] }), merge]);
    x = op('Add', [x, op('Add', [op('MatMul', [ctx, weight(`l${l}.o.w`, [c.hidden, c.hidden], std)]), weight(`l${l}.o.b`, [c.hidden], std)])]);
    const m = op('Add', [op('MatMul', [norm(x), weight(`l${l}.fc.w`, [c.hidden, c.mlp], std)]), weight(`l${l}.fc.b`, [c.mlp], std)]);
    const act = op('Mul', [m, op('Sigmoid', [m])], {}, 'silu');
    x = op('Add', [x, op('Add', [op('MatMul', [act, weight(`l${l}.proj.w`, [c.mlp, c.hidden], std)]), weight(`l${l}.proj.b`, [c.hidden], std)])]);
  }
  const logitsOut = op('MatMul', [norm(x), weight('lm_head', [c.hidden, c.vocab], std)], {}, 'lm');
  nodes.push(node('Identity', [logitsOut], 'logits'));
  return benchModel({ name: 'decoder', node: nodes, initializer: inits,
    input: [value('input_ids', DataType.INT64, ['batch', 'sequence'])],
    output: [value('logits', DataType.FLOAT, ['batch', 'sequence', c.vocab])] });
}
