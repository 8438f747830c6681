/**
 * Reading and writing model files: the public face of src/io. Reading decodes the graph and leaves the
 * weights in the file; writing streams everything unchanged from the input and writes only what changed,
 * to temporary files renamed into place when complete.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { InputError, SsmaxError, opt } from '../errors';
import { emitModel, Out, toBytes } from './emit';
import { checkExternalData, externalFiles, isInside } from './external';
import { ModelFormatError } from './format-error';
import type { ModelProto } from './onnx';
import { cloneTracked, originOf } from './origin';
import { Progress } from './progress';
import { decodeModelFrom } from './read';
import { commit, commitAsync, Committed, Job, PlaceJob, Stray } from './sink';
import { FileSource, MemorySource, Source, SourceChangedError } from './source';
import { WireError } from './wire';

/** The largest protobuf onnx and onnxruntime accept as one message. */
export const PROTOBUF_LIMIT = 2 ** 31 - 1;

export type ExternalDataMode = 'reference' | 'copy' | 'link';

export interface ParseOptions {
  /** Folder the model's external data locations are relative to; without it they are neither checked nor read. */
  dir?: string;
}

export function parseModel(bytes: Uint8Array, label: string, options: ParseOptions = {}): ModelProto {
  const dir = options.dir ? path.resolve(options.dir) : null;
  try {
    return decodeChecked(new MemorySource(bytes, label), dir);
  } catch (e) {
    throw ioError(label, e, 'read');
  }
}

export function readModel(file: string): ModelProto {
  const abs = path.resolve(file);
  try {
    if (!fs.statSync(abs).isFile()) throw new InputError(`${file}: not a file`, 'io');
    return decodeChecked(new FileSource(abs), path.dirname(abs));
  } catch (e) {
    throw ioError(file, e, 'read');
  }
}

/** Decodes the model and, when its folder is known, checks its external data. */
function decodeChecked(src: Source, dir: string | null): ModelProto {
  const model = decodeModelFrom(src, dir);
  if (dir) checkExternalData(model, dir);
  return model;
}

export interface SerializeOptions {
  /** Put external data into the bytes, so they stand alone (default true). */
  inlineExternalData?: boolean;
}

/** The model as one protobuf in memory, e.g. for onnxruntime; unchanged parts are the input's bytes. */
export function serializeModel(model: ModelProto, options: SerializeOptions = {}): Uint8Array {
  const out = emitModel(model, { inline: options.inlineExternalData ?? true });
  if (out.size > PROTOBUF_LIMIT) {
    throw new InputError(`the model is ${(out.size / 2 ** 30).toFixed(2)} GB: too large for one protobuf in memory (2 GB at most)`, 'too-large');
  }
  try {
    return toBytes(out);
  } catch (e) {
    throw ioError('model', e, 'read');
  }
}

export interface WriteOptions {
  force?: boolean;
  /** Files that must never be overwritten, besides the model's own input files (always protected). */
  protect?: string[];
  /**
   * How external data is placed when the output goes to another folder: `copy` (the default: the output's own
   * files, copy-on-write clones where the file system has them, so that no write through the output reaches the
   * input's data), `link` (hard links: a later write to the output's data file, such as a save that appends to
   * it, changes the input's data too), or `reference` (locations rewritten relative to the output).
   */
  externalData?: ExternalDataMode;
  progress?: Progress | null;
  /** Largest single protobuf to write; above it large initializers go to `<output>.data` (default 2 GB − 1). */
  maxProtobufBytes?: number;
  /**
   * A working copy in a temporary folder (verification's sessions), not a result: a signal during the command
   * still stops it, as if nothing was written.
   */
  scratch?: boolean;
}

export type Placement = 'in place' | 'referenced' | 'linked' | 'cloned' | 'copied' | 'written' | 'already there';

export interface WriteReport {
  output: string;
  bytes: number;
  /** Each external data file of the output and how it got there; empty when the output has none. */
  externalData: { file: string; how: Placement }[];
  /** Temporary files that killed runs of this tool left in the output's folders, removed before writing. */
  removedTemporaryFiles: Stray[];
}

/** Writes to temporary files beside the targets and renames them into place, so no half-written output remains. */
export function writeModel(file: string, model: ModelProto, options: WriteOptions = {}): WriteReport {
  const plan = planWrite(file, model, options);
  try {
    return settleWrite(plan.report, commit(plan.jobs, options.progress ?? null, !options.scratch));
  } catch (e) {
    throw ioError(file, e, 'write');
  }
}

/**
 * As writeModel, letting the event loop run between chunks: a signal handler can then remove the temporary
 * files (removeTemporaryFiles in ./sink) while a large model is being written.
 */
export async function writeModelAsync(file: string, model: ModelProto, options: WriteOptions = {}): Promise<WriteReport> {
  const plan = planWrite(file, model, options);
  try {
    return settleWrite(plan.report, await commitAsync(plan.jobs, options.progress ?? null, !options.scratch));
  } catch (e) {
    throw ioError(file, e, 'write');
  }
}

function planWrite(file: string, model: ModelProto, options: WriteOptions): { jobs: Job[]; report: WriteReport } {
  const target = path.resolve(file);
  const dir = path.dirname(target);
  const inputs = [...inputFiles(model), ...(options.protect ?? [])];
  guardTarget(file, target, inputs, options.force);
  checkFolder(file, dir);
  const placed = placeExternalData(model, dir, options.externalData, inputs, options.force);
  const jobs: Job[] = [...placed.jobs];
  let out = emitModel(model, { relocate: placed.relocate });
  const limit = options.maxProtobufBytes ?? PROTOBUF_LIMIT;
  const report: WriteReport = { output: file, bytes: 0, externalData: placed.report, removedTemporaryFiles: [] };
  if (out.size > limit) {
    const location = `${path.basename(target)}.data`;
    const data = new Out();
    out = emitModel(model, { relocate: placed.relocate, externalize: { location, data, minBytes: 1024 } });
    if (out.size > limit) {
      throw new InputError(`${file}: the model exceeds ${limit} bytes even with its initializers in external data`, 'too-large');
    }
    const dataTarget = path.join(dir, location);
    guardTarget(dataTarget, dataTarget, inputs, options.force);
    jobs.push({ kind: 'write', target: dataTarget, out: data });
    report.externalData.push({ file: dataTarget, how: 'written' });
  }
  jobs.push({ kind: 'write', target, out });
  report.bytes = out.size;
  return { jobs, report };
}

/** How each data file actually got there (a copy is a clone where the file system has them), and the strays removed. */
function settleWrite(report: WriteReport, committed: Committed): WriteReport {
  for (const r of committed.results) {
    const entry = report.externalData.find((e) => e.file === r.target);
    if (entry && r.how !== 'written') entry.how = r.how;
  }
  report.removedTemporaryFiles = committed.strays;
  return report;
}

/** The files a model was read from: its own file and its external data files. */
export function inputFiles(model: ModelProto): string[] {
  const origin = originOf(model);
  const own = origin && origin.ctx.src instanceof FileSource ? [origin.ctx.src.name] : [];
  return [...own, ...externalFiles(model).map((f) => f.file)];
}

/**
 * The checks the write makes on its target, made before any long work (a verification) so that a refusal comes
 * first: not an input, not a folder, not existing without `force`, in a folder that exists and can be written.
 */
export function checkTarget(file: string, options: Pick<WriteOptions, 'force' | 'protect'> = {}): void {
  const target = path.resolve(file);
  const dir = path.dirname(target);
  guardTarget(file, target, options.protect ?? [], options.force);
  checkFolder(file, dir);
  try {
    fs.accessSync(dir, fs.constants.W_OK);
  } catch {
    throw new InputError(`${file}: cannot write (folder ${dir} is not writable)`, 'io');
  }
}

function guardTarget(label: string, target: string, inputs: string[], force?: boolean): void {
  for (const p of inputs) {
    if (samePath(p, target)) throw new InputError(`${label}: refusing to overwrite the input model${p.endsWith('.onnx') ? '' : ` (its external data ${path.basename(p)})`}`, 'usage');
  }
  const st = statOrNull(target);
  if (!st) return;
  if (st.isDirectory()) throw new InputError(`${label}: is a folder`, 'io');
  if (!force) throw new InputError(`${label}: already exists (${opt('overwrite')} overwrites it)`, 'output-exists');
}

function checkFolder(label: string, dir: string): void {
  const st = statOrNull(dir);
  if (!st) throw new InputError(`${label}: cannot write (folder ${dir} does not exist)`, 'io');
  if (!st.isDirectory()) throw new InputError(`${label}: cannot write (${dir} is not a folder)`, 'io');
}

interface Placed {
  jobs: PlaceJob[];
  relocate: Map<string, string>;
  report: { file: string; how: Placement }[];
}

/** Where the output's external data comes from: the same files in place, copies, links, or references. */
function placeExternalData(model: ModelProto, outDir: string, mode: ExternalDataMode | undefined, inputs: string[], force?: boolean): Placed {
  const placed: Placed = { jobs: [], report: [], relocate: new Map() };
  for (const f of externalFiles(model)) {
    const dest = path.resolve(outDir, f.location);
    // The same folder, also through a symlink: the very file, which must not be replaced by a copy of itself.
    if (dest === f.file || realPath(dest) === realPath(f.file)) {
      placed.report.push({ file: f.file, how: 'in place' });
    } else if (mode === 'reference') {
      placed.relocate.set(f.file, path.relative(outDir, f.file).split(path.sep).join('/'));
      placed.report.push({ file: f.file, how: 'referenced' });
    } else {
      if (!isInside(outDir, dest)) {
        throw new InputError(`external data '${f.location}' lies outside its model's folder: it cannot be placed beside the output (use ${opt('externalData', 'reference')})`, 'bad-external-data');
      }
      const kind = mode === 'link' ? 'link' : 'copy';
      // A hard link to the input's data (an earlier --external-data link): kept as it is for link; a copy replaces
      // it otherwise, which loses nothing, since the input's data stays under its own name.
      const linked = sameFile(dest, f.file);
      if (linked && kind === 'link') {
        placed.report.push({ file: dest, how: 'already there' });
        continue;
      }
      if (!linked) guardTarget(dest, dest, inputs, force);
      placed.jobs.push({ kind, target: dest, source: f.file });
      placed.report.push({ file: dest, how: kind === 'link' ? 'linked' : 'copied' });
    }
  }
  return placed;
}

function samePath(a: string, b: string): boolean {
  return realPath(a) === realPath(b) || sameFile(a, b);
}

/** The path with every symlink resolved; the path itself where it does not exist (yet). */
function realPath(p: string): string {
  try {
    return fs.realpathSync(p);
  } catch {
    return path.resolve(p);
  }
}

function sameFile(a: string, b: string): boolean {
  const x = statOrNull(a);
  const y = statOrNull(b);
  return Boolean(x && y && x.dev === y.dev && x.ino === y.ino);
}

/** The file's status, or null when it cannot be had (missing, unreadable folder, ...). */
function statOrNull(file: string): fs.Stats | null {
  try {
    return fs.statSync(file);
  } catch {
    return null;
  }
}

const errnoText: Record<string, string> = {
  ENOSPC: 'no space left on the device', EDQUOT: 'disk quota exceeded', EACCES: 'permission denied',
  EPERM: 'operation not permitted', EROFS: 'read-only file system', EFBIG: 'file too large for the file system',
  ENOENT: 'no such file or folder', EXDEV: `on another file system: use ${opt('externalData', 'copy')}`, EIO: 'input/output error',
  EISDIR: 'is a folder', ENOTDIR: 'not a folder', EMFILE: 'too many open files',
};

/** An error met reading or writing `label`, as the InputError the user sees; errors of unknown kind pass through. */
function ioError(label: string, e: unknown, verb: 'read' | 'write'): Error {
  if (e instanceof SsmaxError) return e;
  if (e instanceof SourceChangedError) return new InputError(e.message, 'io');
  if (verb === 'read' && e instanceof ModelFormatError) return new InputError(`${label}: ${e.message}`, e.code);
  if (verb === 'read' && e instanceof WireError) return new InputError(`${label}: not a readable ONNX model (${e.message})`, 'bad-model');
  const code = (e as NodeJS.ErrnoException)?.code;
  if (verb === 'read' && code === 'ENOENT') return new InputError(`${label}: no such file`, 'io');
  return code ? new InputError(`${label}: cannot ${verb} (${errnoText[code] ?? code})`, 'io') : (e as Error);
}

/** Decodes a model held in memory; external data, if any, is neither checked nor readable (no folder). */
export function decodeModel(bytes: Uint8Array): ModelProto {
  return decodeModelFrom(new MemorySource(bytes, 'bytes'), null);
}

/**
 * The model as one protobuf, with external data read back in so the bytes stand alone (onnxruntime sessions
 * made from bytes cannot resolve external paths). See serializeModel for the size limit and errors.
 */
export function encodeModel(model: ModelProto): Uint8Array {
  return serializeModel(model);
}

/** A deep copy that is still written losslessly (it keeps each message's provenance). */
export function cloneModel(model: ModelProto): ModelProto {
  return cloneTracked(model);
}
