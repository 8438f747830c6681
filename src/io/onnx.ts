/**
 * Typed view of the ONNX protobuf messages, and bytes ↔ model. Decoding keeps the provenance of every
 * message (src/io/origin.ts), so encoding a decoded model gives back the input's bytes for everything
 * unchanged, unknown fields included.
 */
import { Int64 } from './constants';

export { toNumber, DataType, AttributeType } from './constants';
export type { Int64 } from './constants';

/**
 * The default operator set: '' or 'ai.onnx', or no domain at all (an absent string field reads as '' in protobuf;
 * on a decoded message it lives on the prototype, so a spread copy of one has none).
 */
export function isDefaultDomain(domain: string | undefined): boolean {
  return !domain || domain === 'ai.onnx';
}

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
