/** ONNX enum values and the int64 helper, kept apart from the codec so every io module can import them. */

/** protobufjs decodes int64 as Long when the `long` package is present, as number otherwise. */
export type Int64 = number | { toNumber(): number };

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

/** TensorProto.DataLocation.EXTERNAL */
export const EXTERNAL = 1;

/**
 * Bits per element of every fixed-size ONNX element type (STRING has none). Covers the types up to IR 13,
 * including complex, the float8 variants and the 4-bit and 2-bit types, so payload sizes can be checked.
 */
const BITS: Record<number, number> = {
  1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64, 15: 128, 16: 16,
  17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2,
};

/** Bytes a tensor of `count` elements of `dataType` takes as raw data; undefined for strings and unknown types. */
export function rawByteLength(dataType: number, count: number): number | undefined {
  const bits = BITS[dataType];
  return bits === undefined ? undefined : Math.ceil((count * bits) / 8);
}

export function isKnownDataType(dataType: number): boolean {
  return dataType === 8 || BITS[dataType] !== undefined;
}
