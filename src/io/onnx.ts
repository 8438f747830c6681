/** Typed view of the ONNX protobuf messages and their encode/decode through protobufjs. */
import * as protobuf from 'protobufjs';
import { onnxSchema } from './schema';

/** protobufjs decodes int64 as Long when the `long` package is present, as number otherwise. */
export type Int64 = number | { toNumber(): number };

export interface StringStringEntry { key: string; value: string }
export interface OperatorSetId { domain: string; version: Int64 }

export interface TensorProto {
  dims: Int64[];
  dataType: number;
  name: string;
  rawData?: Uint8Array;
  floatData: number[];
  int32Data: number[];
  int64Data: Int64[];
  doubleData: number[];
  uint64Data: Int64[];
  stringData: Uint8Array[];
  externalData: StringStringEntry[];
  dataLocation: number;
  docString?: string;
}

export interface AttributeProto {
  name: string;
  type: number;
  f?: number;
  i?: Int64;
  s?: Uint8Array;
  t?: TensorProto;
  g?: GraphProto;
  floats: number[];
  ints: Int64[];
  strings: Uint8Array[];
  tensors: TensorProto[];
  graphs: GraphProto[];
  refAttrName?: string;
}

export interface NodeProto {
  input: string[];
  output: string[];
  name: string;
  opType: string;
  domain: string;
  attribute: AttributeProto[];
  docString?: string;
}

export interface Dimension { dimValue?: Int64; dimParam?: string; value?: 'dimValue' | 'dimParam' }
export interface TypeProto {
  tensorType?: { elemType: number; shape?: { dim: Dimension[] } };
  value?: string;
}
export interface ValueInfoProto { name: string; type?: TypeProto; docString?: string }

export interface GraphProto {
  node: NodeProto[];
  name: string;
  initializer: TensorProto[];
  input: ValueInfoProto[];
  output: ValueInfoProto[];
  valueInfo: ValueInfoProto[];
  docString?: string;
}

export interface FunctionProto {
  name: string;
  domain: string;
  input: string[];
  output: string[];
  node: NodeProto[];
  opsetImport: OperatorSetId[];
}

export interface ModelProto {
  irVersion: Int64;
  opsetImport: OperatorSetId[];
  producerName: string;
  producerVersion: string;
  docString?: string;
  graph?: GraphProto;
  metadataProps: StringStringEntry[];
  functions: FunctionProto[];
}

const root = protobuf.Root.fromJSON(onnxSchema as protobuf.INamespace);
const modelType = root.lookupType('onnx.ModelProto');

export function decodeModel(bytes: Uint8Array): ModelProto {
  return modelType.decode(bytes) as unknown as ModelProto;
}

export function encodeModel(model: ModelProto): Uint8Array {
  return modelType.encode(model as unknown as protobuf.Message).finish();
}

/** Reports structural problems protobufjs itself would accept (e.g. wrong field types) as text, or null. */
export function checkModelShape(model: ModelProto): string | null {
  return modelType.verify(model as unknown as Record<string, unknown>);
}

export function toNumber(v: Int64 | undefined): number {
  if (v === undefined || v === null) return 0;
  return typeof v === 'number' ? v : v.toNumber();
}

/** ONNX TensorProto.DataType values this tool reads or writes. */
export const DataType = {
  FLOAT: 1, UINT8: 2, INT8: 3, UINT16: 4, INT16: 5, INT32: 6, INT64: 7, STRING: 8, BOOL: 9,
  FLOAT16: 10, DOUBLE: 11, UINT32: 12, UINT64: 13, BFLOAT16: 16,
} as const;

export const AttributeType = {
  FLOAT: 1, INT: 2, STRING: 3, TENSOR: 4, GRAPH: 5, FLOATS: 6, INTS: 7, STRINGS: 8, TENSORS: 9, GRAPHS: 10,
} as const;
