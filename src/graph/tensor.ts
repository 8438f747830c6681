/** Reading values out of TensorProto and building small tensors for the nodes this tool inserts. */
import { readExternal } from '../io/external';
import { DataType, Int64, TensorProto, toNumber } from '../io/onnx';

/** @internal */
export interface ConstTensor {
  dims: number[];
  dataType: number;
  values: number[];
}

export const float16ToNumber = (h: number): number => {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * 2 ** (exp - 15) * (1 + frac / 1024);
};

/** Per element type: the bytes of one element, and how to read the element at a byte offset (little-endian). */
const RAW: Record<number, [number, (view: DataView, o: number) => number]> = {
  [DataType.FLOAT]: [4, (v, o) => v.getFloat32(o, true)],
  [DataType.DOUBLE]: [8, (v, o) => v.getFloat64(o, true)],
  [DataType.INT32]: [4, (v, o) => v.getInt32(o, true)],
  [DataType.INT64]: [8, (v, o) => Number(v.getBigInt64(o, true))],
  [DataType.UINT64]: [8, (v, o) => Number(v.getBigUint64(o, true))],
  [DataType.UINT32]: [4, (v, o) => v.getUint32(o, true)],
  [DataType.INT16]: [2, (v, o) => v.getInt16(o, true)],
  [DataType.UINT16]: [2, (v, o) => v.getUint16(o, true)],
  [DataType.INT8]: [1, (v, o) => v.getInt8(o)],
  [DataType.BOOL]: [1, (v, o) => v.getUint8(o)],
  [DataType.UINT8]: [1, (v, o) => v.getUint8(o)],
  [DataType.FLOAT16]: [2, (v, o) => float16ToNumber(v.getUint16(o, true))],
  [DataType.BFLOAT16]: [2, (v, o) => bfloat16ToNumber(v.getUint16(o, true))],
};

function readRaw(raw: Uint8Array, dataType: number, count: number): number[] | null {
  const [size, read] = RAW[dataType] ?? [];
  if (!size || !read || raw.byteLength < size * count) return null;
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  return Array.from({ length: count }, (_, i) => read(view, i * size));
}

/**
 * Values of a tensor, read from the model or from its external data file; null when too large, not readable,
 * or of a type this tool does not read. Large tensors are never read: detection needs small constants only.
 */
export function readTensor(t: TensorProto, maxElements = 1 << 20): ConstTensor | null {
  const dims = (t.dims ?? []).map(toNumber);
  const count = dims.reduce((a, b) => a * b, 1);
  if (count > maxElements) return null;
  let values: number[] | null = null;
  if (t.dataLocation === 1) {
    try {
      const raw = readExternal(t);
      values = raw ? readRaw(raw, t.dataType, count) : null;
    } catch {
      // Unreadable external data stays unread: the reader already reported broken files.
    }
  } else if (t.rawData && t.rawData.length > 0) values = readRaw(t.rawData, t.dataType, count);
  else if (t.floatData?.length) values = [...t.floatData];
  else if (t.int64Data?.length) values = t.int64Data.map(toNumber);
  else if (t.doubleData?.length) values = [...t.doubleData];
  else if (t.uint64Data?.length) values = t.uint64Data.map(toNumber);
  else if (t.int32Data?.length) {
    values = t.dataType === DataType.FLOAT16 ? t.int32Data.map(float16ToNumber) : [...t.int32Data];
  } else if (count === 0) values = [];
  if (!values || values.length !== count) return null;
  return { dims, dataType: t.dataType, values };
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The fp16 nearest to x (ties to even), subnormals included, as its 16 bits. */
export function float32ToFloat16Bits(x: number): number {
  f32[0] = x;
  const u = u32[0];
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  const mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal (or zero): the mantissa with its implicit 1, shifted right by 14 − e, rounded to even.
    if (e < -10) return sign;
    const full = mant | 0x800000;
    const shift = 14 - e;
    return sign | roundShift(full, shift);
  }
  return sign | ((e << 10) + roundShift(mant, 13));
}

/** x >> shift rounded to nearest, ties to even (a carry out of the mantissa correctly bumps the exponent). */
function roundShift(x: number, shift: number): number {
  const kept = Math.floor(x / 2 ** shift);
  const rest = x - kept * 2 ** shift;
  const half = 2 ** (shift - 1);
  return rest > half || (rest === half && (kept & 1) === 1) ? kept + 1 : kept;
}

/** The bf16 nearest to x (ties to even), as its 16 bits. */
export function float32ToBfloat16Bits(x: number): number {
  f32[0] = x;
  const u = u32[0];
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x7fffff)) return (u >>> 16) | 0x40;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bfloat16ToNumber(h: number): number {
  u32[0] = h << 16;
  return f32[0];
}

/** A TensorProto holding `values` as raw little-endian bytes. */
export function makeTensor(name: string, dataType: number, dims: number[], values: number[]): TensorProto {
  const size = { [DataType.FLOAT]: 4, [DataType.INT64]: 8, [DataType.FLOAT16]: 2, [DataType.BFLOAT16]: 2,
    [DataType.DOUBLE]: 8, [DataType.INT32]: 4 }[dataType];
  if (!size) throw new Error(`makeTensor: unsupported data type ${dataType}`);
  const raw = new Uint8Array(size * values.length);
  const view = new DataView(raw.buffer);
  values.forEach((v, i) => {
    const o = i * size;
    if (dataType === DataType.FLOAT) view.setFloat32(o, v, true);
    else if (dataType === DataType.DOUBLE) view.setFloat64(o, v, true);
    else if (dataType === DataType.INT64) view.setBigInt64(o, BigInt(Math.trunc(v)), true);
    else if (dataType === DataType.INT32) view.setInt32(o, v, true);
    else if (dataType === DataType.FLOAT16) view.setUint16(o, float32ToFloat16Bits(v), true);
    else view.setUint16(o, float32ToBfloat16Bits(v), true);
  });
  return {
    name, dataType, dims: dims as Int64[], rawData: raw, floatData: [], int32Data: [], int64Data: [], doubleData: [],
    uint64Data: [], stringData: [], externalData: [], dataLocation: 0,
  };
}
