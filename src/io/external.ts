/**
 * External data: tensors whose bytes live in other files (`data_location = EXTERNAL`, with `location`,
 * `offset`, `length` entries relative to the model's folder). Checked when a model is read, read on demand
 * for the few small constants detection needs, and placed for the output (in place, linked, copied or
 * referenced).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { memo } from '../memo';
import { EXTERNAL, rawByteLength, toNumber } from './constants';
import type { AttributeProto, GraphProto, ModelProto, TensorProto } from './onnx';
import { externalContext } from './origin';
import { ModelFormatError } from './format-error';
import { readExact } from './source';

export interface ExternalRef {
  location: string;
  offset: number;
  /** Bytes of data: the `length` entry, or what dims × element size needs when it is absent. */
  length: number;
}

/** Every tensor in the model: initializers and attribute tensors, in the main graph, subgraphs and functions. */
export function forEachTensor(model: ModelProto, fn: (t: TensorProto) => void): void {
  if (model.graph) forGraph(model.graph, fn);
  for (const f of model.functions ?? []) for (const n of f.node) forAttributes(n.attribute, fn);
}

function forGraph(g: GraphProto, fn: (t: TensorProto) => void): void {
  for (const t of g.initializer) fn(t);
  for (const n of g.node) forAttributes(n.attribute, fn);
}

export function forAttributes(attributes: AttributeProto[], fn: (t: TensorProto) => void): void {
  for (const a of attributes) {
    for (const t of [a.t, ...(a.tensors ?? [])]) if (t) fn(t);
    for (const g of [a.g, ...(a.graphs ?? [])]) if (g) forGraph(g, fn);
  }
}

export function isExternal(t: TensorProto): boolean {
  return t.dataLocation === EXTERNAL;
}

export function externalRef(t: TensorProto): ExternalRef {
  const entry = (key: string): string | undefined => t.externalData.find((kv) => kv.key === key)?.value;
  const label = `tensor '${t.name}'`;
  const location = entry('location');
  if (!location) throw new ModelFormatError(`${label}: external data without a location`, 'bad-external-data');
  const number = (key: string): number | undefined => {
    const v = entry(key);
    if (v === undefined) return undefined;
    if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) throw new ModelFormatError(`${label}: external data ${key} '${v}' is not a byte count`, 'bad-external-data');
    return Number(v);
  };
  const count = t.dims.map(toNumber).reduce((a, b) => a * b, 1);
  const needed = rawByteLength(t.dataType, count);
  const length = number('length') ?? needed;
  if (length === undefined) throw new ModelFormatError(`${label}: external data of data type ${t.dataType} needs a length`, 'bad-external-data');
  if (needed !== undefined && length !== needed) {
    throw new ModelFormatError(`${label}: external data length ${length}, but dims [${t.dims.map(toNumber).join(', ')}] need ${needed} bytes`, 'bad-external-data');
  }
  return { location, offset: number('offset') ?? 0, length };
}

/**
 * The data file a location names, relative to the model's folder. Absolute paths are refused (onnx and
 * onnxruntime refuse them too); paths that leave the folder are accepted for reading, since
 * `--external-data reference` writes them, but never as copy or link targets.
 */
export function dataFile(dir: string, location: string): string {
  if (path.isAbsolute(location) || /^[A-Za-z]:[\\/]/.test(location)) {
    throw new ModelFormatError(`external data location '${location}' is an absolute path (onnx and onnxruntime refuse those)`, 'bad-external-data');
  }
  return path.resolve(dir, location);
}

export function isInside(dir: string, file: string): boolean {
  const rel = path.relative(dir, file);
  return rel !== '' && !rel.startsWith('..') && !path.isAbsolute(rel);
}

/** Checks that every external tensor's file exists and holds its bytes. */
export function checkExternalData(model: ModelProto, dir: string): void {
  const sizes = new Map<string, number>();
  forEachTensor(model, (t) => {
    if (!isExternal(t)) return;
    const ref = externalRef(t);
    const file = dataFile(dir, ref.location);
    const size = memo(sizes, file, () => fileSize(file, ref.location, t.name));
    if (ref.offset + ref.length > size) {
      throw new ModelFormatError(`tensor '${t.name}': external data at offset ${ref.offset} + ${ref.length} bytes runs past the end of '${ref.location}' (${size} bytes)`, 'bad-external-data');
    }
  });
}

function fileSize(file: string, location: string, tensor: string): number {
  try {
    const st = fs.statSync(file);
    if (!st.isFile()) throw new ModelFormatError(`tensor '${tensor}': external data '${location}' is not a file`, 'bad-external-data');
    return st.size;
  } catch (e) {
    if (e instanceof ModelFormatError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    throw new ModelFormatError(`tensor '${tensor}': external data file '${location}' ${code === 'ENOENT' ? 'not found' : `cannot be read (${code})`}`, 'bad-external-data');
  }
}

/** The bytes of an external tensor, or null when its model's folder is unknown. */
export function readExternal(t: TensorProto): Uint8Array | null {
  const ctx = externalContext(t);
  if (!ctx || ctx.dir === null) return null;
  const ref = externalRef(t);
  const key = `${ref.location}\u0000${ref.offset}\u0000${ref.length}`;
  const known = ctx.reads?.get(key);
  if (known) return known;
  const fd = fs.openSync(dataFile(ctx.dir, ref.location), 'r');
  try {
    const bytes = readExact(fd, ref.offset, ref.length);
    if (bytes.byteLength <= CACHED_READ_BYTES) (ctx.reads ??= new Map()).set(key, bytes);
    return bytes;
  } finally {
    fs.closeSync(fd);
  }
}

/** The largest external tensor kept after its first read (masks and shape constants are far smaller). */
const CACHED_READ_BYTES = 1 << 20;

/** The external data files a model references, absolute, with the location that names each. */
export function externalFiles(model: ModelProto): { file: string; location: string }[] {
  const seen = new Map<string, { file: string; location: string }>();
  forEachTensor(model, (t) => {
    if (!isExternal(t)) return;
    const ctx = externalContext(t);
    if (!ctx || ctx.dir === null) return;
    const location = externalRef(t).location;
    const file = dataFile(ctx.dir, location);
    if (!seen.has(file)) seen.set(file, { file, location });
  });
  return [...seen.values()];
}
