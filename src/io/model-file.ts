/**
 * Reading and writing model files. Everything that touches the file system for models goes through here,
 * so that the later streaming and lossless writer replaces one module.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { InputError } from '../errors';
import { decodeModel, encodeModel, ModelProto, toNumber } from './onnx';

export function parseModel(bytes: Uint8Array, label: string): ModelProto {
  let model: ModelProto;
  try {
    model = decodeModel(bytes);
  } catch (err) {
    throw new InputError(`${label}: not a readable ONNX model (${(err as Error).message})`);
  }
  if (!model.graph || toNumber(model.irVersion) <= 0) {
    throw new InputError(`${label}: not an ONNX model (no graph or no IR version)`);
  }
  if (toNumber(model.irVersion) > 13) {
    throw new InputError(`${label}: unsupported IR version ${toNumber(model.irVersion)} (this tool reads up to 13)`);
  }
  return model;
}

export function readModel(file: string): ModelProto {
  let bytes: Buffer;
  try {
    bytes = fs.readFileSync(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new InputError(code === 'ENOENT' ? `${file}: no such file` : `${file}: cannot read (${code ?? 'error'})`);
  }
  return parseModel(bytes, file);
}

export function serializeModel(model: ModelProto): Uint8Array {
  return encodeModel(model);
}

export interface WriteOptions {
  force?: boolean;
  /** Files that must never be overwritten, e.g. the input model. */
  protect?: string[];
}

/** Writes to a temporary file beside the target and renames it into place, so no half-written output remains. */
export function writeModel(file: string, model: ModelProto, options: WriteOptions = {}): void {
  const target = path.resolve(file);
  for (const p of options.protect ?? []) {
    if (samePath(p, target)) throw new InputError(`${file}: refusing to overwrite the input model`);
  }
  if (fs.existsSync(target) && !options.force) {
    throw new InputError(`${file}: already exists (use --force to overwrite)`);
  }
  const bytes = serializeModel(model);
  const tmp = path.join(path.dirname(target), `.${path.basename(target)}.${process.pid}.tmp`);
  try {
    fs.writeFileSync(tmp, bytes, { flag: 'wx' });
    fs.renameSync(tmp, target);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new InputError(`${file}: cannot write (${code})`);
  }
}

function samePath(a: string, b: string): boolean {
  const real = (p: string): string => {
    try {
      return fs.realpathSync(p);
    } catch {
      return path.resolve(p);
    }
  };
  return real(a) === real(b);
}
