/** Builds tiny ONNX models in TypeScript for unit tests of each graph shape the tool handles. */
import { makeTensor } from '../../src/graph/tensor';
import { AttributeProto, DataType, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../../src/io/onnx';

type Attr = number | number[] | string | TensorProto;

export function node(opType: string, input: string[], output: string[], attrs: Record<string, Attr> = {}, name?: string): NodeProto {
  return {
    opType, domain: '', input, output, name: name ?? `${opType}_${output[0]}`,
    attribute: Object.entries(attrs).map(([n, v]): AttributeProto => {
      const base = { name: n, floats: [], ints: [], strings: [], tensors: [], graphs: [] };
      if (typeof v === 'string') return { ...base, type: 3, s: Buffer.from(v) };
      if (Array.isArray(v)) return { ...base, type: 7, ints: v };
      if (typeof v === 'number') return Number.isInteger(v) ? { ...base, type: 2, i: v } : { ...base, type: 1, f: v };
      return { ...base, type: 4, t: v };
    }),
  };
}

export function value(name: string, elemType: number, dims: (number | string)[]): ValueInfoProto {
  return {
    name,
    type: { tensorType: { elemType, shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } },
  };
}

export const f32 = (name: string, dims: number[], values: number[]): TensorProto => makeTensor(name, DataType.FLOAT, dims, values);
export const i64 = (name: string, values: number[], scalar = false): TensorProto =>
  makeTensor(name, DataType.INT64, scalar ? [] : [values.length], values);

export function model(opts: {
  nodes: NodeProto[]; inputs: ValueInfoProto[]; outputs: ValueInfoProto[]; initializers?: TensorProto[]; opset?: number; valueInfo?: ValueInfoProto[];
}): ModelProto {
  return {
    irVersion: 8, producerName: 'ssmax-patch tests', producerVersion: '0', metadataProps: [], functions: [],
    opsetImport: [{ domain: '', version: opts.opset ?? 17 }],
    graph: {
      name: 'test', node: opts.nodes, input: opts.inputs, output: opts.outputs, initializer: opts.initializers ?? [],
      valueInfo: opts.valueInfo ?? [],
    },
  };
}

/** A classifier head and nothing else: its Softmax normalises a projection, so the model has no attention. */
export const classifierOnly = (): ModelProto => model({
  nodes: [node('MatMul', ['x', 'w'], ['logits']), node('Softmax', ['logits'], ['p'], { axis: -1 })],
  inputs: [value('x', DataType.FLOAT, ['batch', 16])], outputs: [value('p', DataType.FLOAT, ['batch', 5])],
  initializers: [f32('w', [16, 5], randoms(80, 3))],
});

/** Deterministic pseudo-random values in [-amp, amp]. */
export function randoms(count: number, seed: number, amp = 1): number[] {
  let x = seed;
  return Array.from({ length: count }, () => {
    x = (x * 1103515245 + 12345) % 2147483648;
    return (x / 2147483648 * 2 - 1) * amp;
  });
}

/** A graph attribute (an If branch, a Loop or Scan body). */
export function graphAttr(name: string, g: GraphProto): AttributeProto {
  return { name, type: 5, g, floats: [], ints: [], strings: [], tensors: [], graphs: [] };
}

/** Attention on [B, N, S, H] tensors named by the caller, with tensors local to `tag` to keep names unique. */
export function attentionNodes(q: string, k: string, v: string, out: string, tag: string): NodeProto[] {
  return [
    node('Transpose', [k], [`${tag}_kt`], { perm: [0, 1, 3, 2] }, `${tag}_Transpose`),
    node('MatMul', [q, `${tag}_kt`], [`${tag}_mm`], {}, `${tag}_MatMul`),
    node('Div', [`${tag}_mm`, 'sqrt_d'], [`${tag}_scores`], {}, `${tag}_Div`),
    node('Softmax', [`${tag}_scores`], [`${tag}_p`], { axis: -1 }, `${tag}_Softmax`),
    node('MatMul', [`${tag}_p`, v], [out], {}, `${tag}_MatMulV`),
  ];
}
