/**
 * Tensors on the host side of onnxruntime: the element types it accepts, and conversions from and to numbers.
 * bfloat16 has no typed array in onnxruntime-node, so bf16 inputs are fed as float32 and cast inside the
 * in-memory copy of the model that runs (see runtime-model.ts).
 */
import { float16ToNumber, float32ToFloat16Bits } from '../graph/tensor';
import { DataType } from '../io/onnx';
import { InputError } from '../errors';

export type HostType =
  | 'float32' | 'float64' | 'float16' | 'int64' | 'int32' | 'int16' | 'int8'
  | 'uint8' | 'uint16' | 'uint32' | 'uint64' | 'bool';

export type HostData =
  | Float32Array | Float64Array | BigInt64Array | BigUint64Array | Int32Array | Int16Array | Int8Array
  | Uint8Array | Uint16Array | Uint32Array;

export interface HostTensor {
  type: HostType;
  dims: number[];
  data: HostData;
}

export type Feeds = Record<string, HostTensor>;

const HOST_TYPES: Record<number, HostType> = {
  [DataType.FLOAT]: 'float32', [DataType.DOUBLE]: 'float64', [DataType.FLOAT16]: 'float16',
  [DataType.BFLOAT16]: 'float32', [DataType.INT64]: 'int64', [DataType.INT32]: 'int32', [DataType.INT16]: 'int16',
  [DataType.INT8]: 'int8', [DataType.UINT8]: 'uint8', [DataType.UINT16]: 'uint16', [DataType.UINT32]: 'uint32',
  [DataType.UINT64]: 'uint64', [DataType.BOOL]: 'bool',
};

const TYPE_NAMES: Record<number, string> = Object.fromEntries(Object.entries(DataType).map(([k, v]) => [v, k.toLowerCase()]));

export function elemTypeName(elemType: number): string {
  return TYPE_NAMES[elemType] ?? `type ${elemType}`;
}

/** The host type an ONNX element type is fed as (bfloat16 as float32), or an InputError naming the input. */
export function hostTypeOf(elemType: number, input: string): HostType {
  const t = HOST_TYPES[elemType];
  if (!t) throw new InputError(`input '${input}': element type ${elemTypeName(elemType)} is not supported by onnxruntime-node; give a model without it`, 'cannot-verify');
  return t;
}

export function elementCount(dims: readonly number[]): number {
  return dims.reduce((a, b) => a * b, 1);
}

/** A host tensor of `type` holding `values` (rounded or truncated as the type requires). */
export function makeHost(type: HostType, dims: number[], values: ArrayLike<number>): HostTensor {
  const n = values.length;
  switch (type) {
    case 'float32': return { type, dims, data: Float32Array.from(values) };
    case 'float64': return { type, dims, data: Float64Array.from(values) };
    case 'float16': return { type, dims, data: Uint16Array.from({ length: n }, (_, i) => float32ToFloat16Bits(values[i])) };
    case 'int64': return { type, dims, data: BigInt64Array.from({ length: n }, (_, i) => BigInt(Math.trunc(values[i]))) };
    case 'uint64': return { type, dims, data: BigUint64Array.from({ length: n }, (_, i) => BigInt(Math.trunc(values[i]))) };
    case 'int32': return { type, dims, data: Int32Array.from(values) };
    case 'int16': return { type, dims, data: Int16Array.from(values) };
    case 'int8': return { type, dims, data: Int8Array.from(values) };
    case 'uint8': return { type, dims, data: Uint8Array.from(values) };
    case 'uint16': return { type, dims, data: Uint16Array.from(values) };
    case 'uint32': return { type, dims, data: Uint32Array.from(values) };
    case 'bool': return { type, dims, data: Uint8Array.from({ length: n }, (_, i) => (values[i] ? 1 : 0)) };
  }
}

/** The values of a host tensor as numbers (float16 decoded, 64-bit integers as the nearest double). */
export function hostValues(type: string, data: ArrayLike<number | bigint>): Float32Array | Float64Array {
  if (data instanceof Float32Array || data instanceof Float64Array) return data;
  if (type === 'float16' && data instanceof Uint16Array) return Float32Array.from(data, float16ToNumber);
  if (data instanceof BigInt64Array || data instanceof BigUint64Array) return Float64Array.from(data, (v) => Number(v));
  return Float64Array.from(data as ArrayLike<number>);
}
