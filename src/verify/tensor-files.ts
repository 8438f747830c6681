/**
 * User-given input tensors: NumPy .npy, JSON (nested arrays, or {"dims": [...], "data": [...]}) and ONNX
 * TensorProto .pb files (the format of ONNX test data sets). Values are converted to the element type the
 * model declares for the input.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as protobuf from 'protobufjs';
import { float16ToNumber, readTensor } from '../graph/tensor';
import { DataType, TensorProto } from '../io/onnx';
import { onnxSchema } from '../io/schema';
import { InputError, opt } from '../errors';
import { elementCount, HostTensor, hostTypeOf, makeHost } from './tensors';

interface RawTensor {
  dims: number[];
  values: ArrayLike<number>;
}

const PARSERS: Record<string, (bytes: Uint8Array, where: string) => RawTensor> = { '.npy': parseNpy, '.json': parseJson, '.pb': parsePb };

/** Reads `file` as the value of input `name`, converted to `elemType`. */
export function readTensorFile(file: string, name: string, elemType: number): HostTensor {
  const where = opt('inputFiles', `${name}=${file}`);
  let bytes: Buffer;
  try {
    bytes = fs.readFileSync(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new InputError(`${where}: ${code === 'ENOENT' ? 'no such file' : `cannot read (${code ?? 'error'})`}`, 'io');
  }
  const parse = PARSERS[path.extname(file).toLowerCase()];
  if (!parse) throw new InputError(`${where}: unknown file type; use .npy, .json or .pb (ONNX TensorProto)`, 'usage');
  const raw = parse(bytes, where);
  const type = hostTypeOf(elemType, name);
  if (type !== 'float32' && type !== 'float64' && type !== 'float16' && type !== 'bool') {
    for (let i = 0; i < raw.values.length; i++) {
      if (!Number.isInteger(raw.values[i])) throw new InputError(`${where}: input '${name}' is ${type} but the file holds ${raw.values[i]}`, 'usage');
    }
  }
  return makeHost(type, raw.dims, raw.values);
}

const NPY_TYPES: Record<string, { size: number; read: (v: DataView, o: number) => number }> = {
  f4: { size: 4, read: (v, o) => v.getFloat32(o, true) },
  f8: { size: 8, read: (v, o) => v.getFloat64(o, true) },
  f2: { size: 2, read: (v, o) => float16ToNumber(v.getUint16(o, true)) },
  i8: { size: 8, read: (v, o) => Number(v.getBigInt64(o, true)) },
  u8: { size: 8, read: (v, o) => Number(v.getBigUint64(o, true)) },
  i4: { size: 4, read: (v, o) => v.getInt32(o, true) },
  u4: { size: 4, read: (v, o) => v.getUint32(o, true) },
  i2: { size: 2, read: (v, o) => v.getInt16(o, true) },
  u2: { size: 2, read: (v, o) => v.getUint16(o, true) },
  i1: { size: 1, read: (v, o) => v.getInt8(o) },
  u1: { size: 1, read: (v, o) => v.getUint8(o) },
  b1: { size: 1, read: (v, o) => v.getUint8(o) },
};

/** NumPy format versions 1–3: magic, version, header length, a Python dict literal, then the raw data. */
export function parseNpy(bytes: Uint8Array, where: string): RawTensor {
  const magic = Buffer.from(bytes.subarray(0, 6)).toString('latin1');
  if (magic !== '\x93NUMPY') throw new InputError(`${where}: not a .npy file`, 'usage');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const major = bytes[6];
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = major === 1 ? 10 : 12;
  const header = Buffer.from(bytes.subarray(start, start + headerLen)).toString('latin1');
  const descr = /'descr':\s*'([<>|=])([a-z]\d+)'/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !shape) throw new InputError(`${where}: .npy header not understood`, 'usage');
  if (/'fortran_order':\s*True/.test(header)) throw new InputError(`${where}: Fortran-ordered arrays are not supported; save with np.ascontiguousarray`, 'usage');
  if (descr[1] === '>') throw new InputError(`${where}: big-endian arrays are not supported`, 'usage');
  const kind = NPY_TYPES[descr[2]];
  if (!kind) throw new InputError(`${where}: NumPy dtype '${descr[2]}' is not supported`, 'usage');
  const dims = shape[1].split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  const count = elementCount(dims);
  const offset = start + headerLen;
  if (bytes.byteLength - offset < count * kind.size) throw new InputError(`${where}: file is shorter than its shape [${dims.join(', ')}] needs`, 'usage');
  const data = new DataView(bytes.buffer, bytes.byteOffset + offset, count * kind.size);
  const values = new Float64Array(count);
  for (let i = 0; i < count; i++) values[i] = kind.read(data, i * kind.size);
  return { dims, values };
}

/** Nested arrays of numbers or booleans, or {"dims": [...], "data": [...]}. */
export function parseJson(bytes: Uint8Array, where: string): RawTensor {
  let json: unknown;
  try {
    json = JSON.parse(Buffer.from(bytes).toString('utf8'));
  } catch {
    throw new InputError(`${where}: not valid JSON`, 'usage');
  }
  if (json && typeof json === 'object' && !Array.isArray(json)) {
    const o = json as { dims?: unknown; data?: unknown };
    if (!Array.isArray(o.dims) || !o.dims.every((d) => Number.isInteger(d) && d >= 0) || !Array.isArray(o.data)) {
      throw new InputError(`${where}: expected nested arrays or {"dims": [...], "data": [...]}`, 'usage');
    }
    const values = flatNumbers(o.data, where);
    const dims = o.dims as number[];
    if (values.length !== elementCount(dims)) throw new InputError(`${where}: ${values.length} values do not fill dims [${dims.join(', ')}]`, 'usage');
    return { dims, values };
  }
  const dims: number[] = [];
  for (let level: unknown = json; Array.isArray(level); level = level[0]) dims.push(level.length);
  const values = flatNumbers(json, where);
  if (values.length !== elementCount(dims)) throw new InputError(`${where}: nested arrays are ragged`, 'usage');
  return { dims, values };
}

function flatNumbers(v: unknown, where: string): number[] {
  const out: number[] = [];
  const walk = (x: unknown): void => {
    if (Array.isArray(x)) x.forEach(walk);
    else if (typeof x === 'number') out.push(x);
    else if (typeof x === 'boolean') out.push(x ? 1 : 0);
    else throw new InputError(`${where}: expected numbers, found ${JSON.stringify(x)}`, 'usage');
  };
  walk(v);
  return out;
}

const tensorType = protobuf.Root.fromJSON(onnxSchema as protobuf.INamespace).lookupType('onnx.TensorProto');

export function parsePb(bytes: Uint8Array, where: string): RawTensor {
  let t: TensorProto;
  try {
    t = tensorType.decode(bytes) as unknown as TensorProto;
  } catch (err) {
    throw new InputError(`${where}: not an ONNX TensorProto (${(err as Error).message})`, 'usage');
  }
  if (t.dataType === DataType.STRING) throw new InputError(`${where}: string tensors are not supported`, 'usage');
  if (t.dataLocation === 1) throw new InputError(`${where}: tensors with external data are not supported`, 'usage');
  const c = readTensor(t, Number.MAX_SAFE_INTEGER);
  if (!c) throw new InputError(`${where}: TensorProto of data type ${t.dataType} could not be read`, 'usage');
  return { dims: c.dims, values: c.values };
}
