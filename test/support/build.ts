/** Builds tiny ONNX models in TypeScript for unit tests of each graph shape the tool handles. */
import { makeTensor } from '../../src/graph/tensor';
import { AttributeProto, DataType, ModelProto, NodeProto, TensorProto, ValueInfoProto } from '../../src/io/onnx';

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

/** Deterministic pseudo-random values in [-amp, amp]. */
export function randoms(count: number, seed: number, amp = 1): number[] {
  let x = seed;
  return Array.from({ length: count }, () => {
    x = (x * 1103515245 + 12345) % 2147483648;
    return (x / 2147483648 * 2 - 1) * amp;
  });
}
