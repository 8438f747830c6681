/**
 * A GPT-2-shaped decoder as an ONNX graph, at any size: token embedding, per layer Q/K/V projections split
 * into heads, MatMul(q, kᵀ) → Div(√d) → Where(causal triangular mask, ·, finfo.min) → Softmax → MatMul(v), output
 * projection and an MLP with residuals, then an LM head. The weights are described, not built, so the
 * benchmark can stream gigabytes of them to disk while the tests fill small ones in memory.
 */
import { makeTensor } from '../src/graph/tensor';
import { DataType, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../src/io/onnx';
import { attribute } from '../src/verify/nodes';

export interface TransformerSpec {
  layers: number;
  d: number;
  heads: number;
  ff: number;
  vocab: number;
  /** Longest sequence the causal mask constant covers. */
  tmax: number;
}

export interface WeightSpec {
  name: string;
  dims: number[];
}

export interface TransformerGraph {
  /** The model with every small constant, and none of the weights in `weights`. */
  model: ModelProto;
  weights: WeightSpec[];
}

function node(opType: string, input: string[], output: string, attrs: Record<string, number | number[]> = {}): NodeProto {
  return { opType, domain: '', input, output: [output], name: `/${output}`, attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)) };
}

/** A tensor input or output: numbers are fixed dimensions, strings symbolic ones. */
export function value(name: string, elemType: number, dims: (number | string)[]): ValueInfoProto {
  return { name, type: { tensorType: { elemType, shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } } };
}

/** A benchmark model of `graph`: IR 8, opset 17 unless `extra` gives other opsets (or another producer). */
export function benchModel(graph: Omit<GraphProto, 'valueInfo'>, extra: Partial<Pick<ModelProto, 'producerName' | 'opsetImport'>> = {}): ModelProto {
  return {
    irVersion: 8, producerName: 'ssmax-patch bench', producerVersion: '0', metadataProps: [], functions: [],
    opsetImport: [{ domain: '', version: 17 }], ...extra, graph: { ...graph, valueInfo: [] },
  };
}

export function transformerGraph(spec: TransformerSpec): TransformerGraph {
  const { layers, d, heads, ff, vocab, tmax } = spec;
  const dh = d / heads;
  const nodes: NodeProto[] = [];
  const weights: WeightSpec[] = [{ name: 'wte', dims: [vocab, d] }];
  const tri: number[] = [];
  for (let i = 0; i < tmax; i++) for (let j = 0; j < tmax; j++) tri.push(j <= i ? 1 : 0);
  const small: TensorProto[] = [
    { ...makeTensor('causal_tri', DataType.INT32, [tmax * tmax], tri), dims: [1, 1, tmax, tmax] },
    makeTensor('heads_shape', DataType.INT64, [4], [0, 0, heads, dh]),
    makeTensor('merge_shape', DataType.INT64, [3], [0, 0, d]),
    makeTensor('sqrt_dh', DataType.FLOAT, [], [Math.sqrt(dh)]),
    makeTensor('neg_max', DataType.FLOAT, [], [-3.4028234663852886e38]),
    makeTensor('zeros2', DataType.INT64, [2], [0, 0]),
    makeTensor('axes23', DataType.INT64, [2], [2, 3]),
    makeTensor('seq_index', DataType.INT64, [], [1]),
    makeTensor('axis0', DataType.INT64, [1], [0]),
  ];
  // The causal mask for this length: Slice(tri, [0,0], [T,T]) on axes 2 and 3, as bool.
  nodes.push(node('Shape', ['input_ids'], 'ids_shape'), node('Gather', ['ids_shape', 'seq_index'], 'seq'),
    node('Unsqueeze', ['seq', 'axis0'], 'seq1'), node('Concat', ['seq1', 'seq1'], 'seq2', { axis: 0 }),
    node('Slice', ['causal_tri', 'zeros2', 'seq2', 'axes23'], 'tri_tt'), node('Cast', ['tri_tt'], 'keep', { to: DataType.BOOL }),
    node('Gather', ['wte', 'input_ids'], 'h0'));
  let h = 'h0';
  for (let l = 0; l < layers; l++) {
    const p = `l${l}_`;
    for (const w of ['wq', 'wk', 'wv', 'wo']) weights.push({ name: `${p}${w}`, dims: [d, d] });
    weights.push({ name: `${p}w1`, dims: [d, ff] }, { name: `${p}w2`, dims: [ff, d] });
    for (const x of ['q', 'k', 'v']) {
      nodes.push(node('MatMul', [h, `${p}w${x}`], `${p}${x}`), node('Reshape', [`${p}${x}`, 'heads_shape'], `${p}${x}4`),
        node('Transpose', [`${p}${x}4`], `${p}${x}h`, { perm: x === 'k' ? [0, 2, 3, 1] : [0, 2, 1, 3] }));
    }
    nodes.push(node('MatMul', [`${p}qh`, `${p}kh`], `${p}qk`), node('Div', [`${p}qk`, 'sqrt_dh'], `${p}scores`),
      node('Where', ['keep', `${p}scores`, 'neg_max'], `${p}masked`), node('Softmax', [`${p}masked`], `${p}probs`, { axis: -1 }),
      node('MatMul', [`${p}probs`, `${p}vh`], `${p}ctx`), node('Transpose', [`${p}ctx`], `${p}ctx_t`, { perm: [0, 2, 1, 3] }),
      node('Reshape', [`${p}ctx_t`, 'merge_shape'], `${p}ctx_m`), node('MatMul', [`${p}ctx_m`, `${p}wo`], `${p}attn`),
      node('Add', [h, `${p}attn`], `${p}h1`), node('MatMul', [`${p}h1`, `${p}w1`], `${p}ff1`), node('Relu', [`${p}ff1`], `${p}act`),
      node('MatMul', [`${p}act`, `${p}w2`], `${p}ff2`), node('Add', [`${p}h1`, `${p}ff2`], `${p}out`));
    h = `${p}out`;
  }
  weights.push({ name: 'lm_head', dims: [d, vocab] });
  nodes.push(node('MatMul', [h, 'lm_head'], 'logits'));
  const model = benchModel({ name: 'transformer', node: nodes, initializer: small,
    input: [value('input_ids', DataType.INT64, ['batch', 'seq'])], output: [value('logits', DataType.FLOAT, ['batch', 'seq', vocab])] });
  return { model, weights };
}

/** A deterministic xorshift stream. */
export class Random {
  private x: number;
  constructor(seed: number) {
    this.x = seed >>> 0 || 1;
  }
  /** Uniform in [-a, a]. */
  uniform(a: number): number {
    this.x ^= this.x << 13; this.x >>>= 0;
    this.x ^= this.x >>> 17;
    this.x ^= this.x << 5; this.x >>>= 0;
    return (this.x / 4294967296 * 2 - 1) * a;
  }
}

/** Deterministic float32 values in [−amp, amp], generated into `out`. */
export function fillWeights(out: Float32Array, seed: number, amp: number): void {
  const rnd = new Random(seed);
  for (let i = 0; i < out.length; i++) out[i] = rnd.uniform(amp);
}

/** The model with its weights filled in memory (for tests: keep the spec small); `gain` scales the weights. */
export function smallTransformer(spec: TransformerSpec, seed = 7, gain = 1): ModelProto {
  const { model, weights } = transformerGraph(spec);
  for (const [i, w] of weights.entries()) {
    const count = w.dims.reduce((a, b) => a * b, 1);
    const values = new Float32Array(count);
    fillWeights(values, seed + i, gain / Math.sqrt(w.dims[0]));
    model.graph!.initializer.push(makeTensor(w.name, DataType.FLOAT, w.dims, Array.from(values)));
  }
  return model;
}
