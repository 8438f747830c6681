/**
 * Synthesises inputs for a model from its graph alone: token ids inside the embedding's vocabulary, masks of
 * ones, positions counting from the past length, random past key/values; dynamic dims set from a Length.
 */
import { Graph } from '../graph/graph';
import { DataType, ValueInfoProto, toNumber } from '../io/onnx';
import { InputError } from '../errors';

export interface Length {
  batch: number;
  seq: number;
  past: number;
}

export interface HostTensor {
  type: 'float32' | 'int64' | 'int32' | 'bool' | 'float16';
  dims: number[];
  data: Float32Array | BigInt64Array | Int32Array | Uint8Array | Uint16Array;
}

export type Feeds = Record<string, HostTensor>;

/** A deterministic generator, so every run of a check sees the same inputs. */
export function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
}

export function hasPast(graph: Graph): boolean {
  return realInputs(graph).some((v) => /past/i.test(v.name));
}

export function realInputs(graph: Graph): ValueInfoProto[] {
  return graph.proto.input.filter((v) => !graph.initializers.has(v.name));
}

export function synthesizeInputs(graph: Graph, len: Length, seed = 1): Feeds {
  const feeds: Feeds = {};
  const random = rng(seed);
  for (const input of realInputs(graph)) {
    const tensor = input.type?.tensorType;
    if (!tensor) throw new InputError(`input '${input.name}': only tensor inputs can be synthesised`);
    const dims = (tensor.shape?.dim ?? []).map((d, axis) => dimValue(input.name, d.dimParam, toNumber(d.dimValue), axis, len));
    feeds[input.name] = fill(graph, input.name, tensor.elemType, dims, len, random);
  }
  return feeds;
}

function dimValue(input: string, param: string | undefined, value: number, axis: number, len: Length): number {
  if (value > 0) return value;
  const name = (param ?? '').toLowerCase();
  if (/batch/.test(name) || (!name && axis === 0)) return len.batch;
  if (/past/.test(name)) return len.past;
  if (/total|all|kv|key/.test(name) || (/mask/i.test(input) && axis === 1 && len.past > 0)) return len.past + len.seq;
  if (/past/i.test(input) && !name) return len.past;
  return len.seq;
}

function fill(graph: Graph, name: string, elemType: number, dims: number[], len: Length, random: () => number): HostTensor {
  const count = dims.reduce((a, b) => a * b, 1);
  const lower = name.toLowerCase();
  if (elemType === DataType.INT64 || elemType === DataType.INT32) {
    const values = new Array<number>(count);
    const vocab = vocabSize(graph, name);
    for (let i = 0; i < count; i++) {
      if (/mask/.test(lower)) values[i] = 1;
      else if (/position/.test(lower)) values[i] = len.past + (i % dims[dims.length - 1]);
      else if (/token_type|segment/.test(lower)) values[i] = 0;
      else values[i] = Math.floor(random() * vocab);
    }
    return elemType === DataType.INT64
      ? { type: 'int64', dims, data: BigInt64Array.from(values.map(BigInt)) }
      : { type: 'int32', dims, data: Int32Array.from(values) };
  }
  if (elemType === DataType.BOOL) return { type: 'bool', dims, data: new Uint8Array(count).fill(1) };
  if (elemType === DataType.FLOAT) {
    const data = new Float32Array(count);
    for (let i = 0; i < count; i++) data[i] = /mask/.test(lower) ? 1 : (random() * 2 - 1);
    return { type: 'float32', dims, data };
  }
  throw new InputError(`input '${name}': cannot synthesise element type ${elemType}`);
}

/** Rows of the embedding table the ids index (Gather of an initializer), or 2 when no table is found. */
function vocabSize(graph: Graph, input: string, depth = 0): number {
  for (const node of graph.consumersOf(input)) {
    if (node.opType === 'Gather' && node.input[1] === input && graph.initializers.has(node.input[0])) {
      return toNumber(graph.initializers.get(node.input[0])!.dims[0]);
    }
    if (depth < 3 && ['Cast', 'Reshape', 'Unsqueeze', 'Squeeze', 'Flatten'].includes(node.opType)) {
      return vocabSize(graph, node.output[0], depth + 1);
    }
  }
  return 2;
}
