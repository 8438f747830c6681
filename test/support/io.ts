/** Helpers for the I/O tests: the CLI as a child process, folder snapshots, external data, onnxruntime loads. */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as ort from 'onnxruntime-node';
import { smallTransformer } from '../../bench/transformer';
import { SsmaxError } from '../../src/errors';
import { ModelProto, TensorProto } from '../../src/io/onnx';
import { decodeAs, encodeAs } from '../../src/io/proto';
import { concatBytes, lenHeader, varintField } from '../../src/io/wire';

export const BIN = path.resolve(__dirname, '../../../bin/ssmax-patch.js');

export interface CliResult { code: number; stdout: string; stderr: string }

export function cli(args: string[], options: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): CliResult {
  const r = spawnSync(process.execPath, [BIN, ...args], { cwd: options.cwd, env: options.env ?? process.env, encoding: 'utf8' });
  return { code: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

const scratch: string[] = [];

/** Removes every folder tmpdir() made so far: each suite calls it in its after() hook. */
export function removeScratch(): void {
  for (const dir of scratch.splice(0)) fs.rmSync(dir, { recursive: true, force: true });
}

/** A fresh folder, removed by removeScratch(). */
export function tmpdir(prefix = 'ssmax-io-'): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  scratch.push(dir);
  return dir;
}

export const sha = (file: string): string => createHash('sha256').update(fs.readFileSync(file)).digest('hex');

/** Every file in a folder (hidden ones included, recursively) with its hash: to prove nothing changed. */
export function snapshot(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return snapshot(p).map((s) => `${e.name}/${s}`);
    return [`${e.name}:${e.isFile() ? sha(p) : 'other'}`];
  }).sort();
}

/** For assert.throws: an error of this tool whose message, as the CLI prints it, matches. */
export function cliError(pattern: RegExp): (e: unknown) => boolean {
  return (e) => e instanceof SsmaxError && pattern.test(e.cliMessage);
}

export function assertOneLineError(r: CliResult, code: number, pattern: RegExp): void {
  assert.equal(r.code, code, `exit ${r.code}: ${r.stderr}${r.stdout}`);
  const lines = r.stderr.trim().split('\n');
  assert.equal(lines.length, 1, `expected one line on stderr, got:\n${r.stderr}`);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(r.stderr, /\n\s+at /, 'stack trace printed');
}

/** Loads a model file (or bytes) in onnxruntime: null when it loads, the first line of the error otherwise. */
export async function ortLoadError(model: string | Uint8Array): Promise<string | null> {
  try {
    const s = typeof model === 'string'
      ? await ort.InferenceSession.create(model, { logSeverityLevel: 4 })
      : await ort.InferenceSession.create(model, { logSeverityLevel: 4 });
    await s.release();
    return null;
  } catch (e) {
    return String((e as Error).message).split('\n')[0];
  }
}

/** Runs a model file on onnxruntime with int64 token ids, returning every output as a Float32Array. */
export async function runIds(model: string | Uint8Array, ids: number[][]): Promise<Record<string, Float32Array>> {
  const s = typeof model === 'string' ? await ort.InferenceSession.create(model) : await ort.InferenceSession.create(model);
  const flat = BigInt64Array.from(ids.flat().map(BigInt));
  const out = await s.run({ input_ids: new ort.Tensor('int64', flat, [ids.length, ids[0].length]) });
  await s.release();
  return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, v.data as Float32Array]));
}

export function assertSameOutputs(a: Record<string, Float32Array>, b: Record<string, Float32Array>): void {
  assert.deepEqual(Object.keys(a).sort(), Object.keys(b).sort());
  for (const k of Object.keys(a)) assert.ok(Buffer.from(a[k].buffer).equals(Buffer.from(b[k].buffer)), `output ${k} differs`);
}

export interface ExternalOptions {
  /** Tensors with at least this many bytes of raw data go to external data (default 1024, as onnx does). */
  threshold?: number;
  /** One data file per tensor instead of one for all. */
  perTensor?: boolean;
  location?: string;
}

/**
 * Writes `bytes` (an embedded-weights model) to `dir/name` with its large tensors in external data, using
 * protobufjs directly rather than this tool's writer, so the tests do not grade the tool with itself.
 */
export function writeExternal(bytes: Uint8Array, dir: string, name: string, options: ExternalOptions = {}): string {
  const model = decodeAs<ModelProto>('ModelProto', bytes);
  const threshold = options.threshold ?? 1024;
  const location = options.location ?? `${name}.data`;
  const shared: Buffer[] = [];
  let offset = 0;
  const move = (t: TensorProto, index: number): void => {
    if (!t.rawData || t.rawData.length < threshold) return;
    const data = Buffer.from(t.rawData);
    let entries: { key: string; value: string }[];
    if (options.perTensor) {
      const file = `${name}.w${index}.bin`;
      fs.writeFileSync(path.join(dir, file), data);
      entries = [{ key: 'location', value: file }, { key: 'offset', value: '0' }, { key: 'length', value: String(data.length) }];
    } else {
      entries = [{ key: 'location', value: location }, { key: 'offset', value: String(offset) }, { key: 'length', value: String(data.length) }];
      shared.push(data);
      offset += data.length;
    }
    delete (t as { rawData?: Uint8Array }).rawData;
    t.dataLocation = 1;
    t.externalData = entries;
  };
  model.graph!.initializer.forEach(move);
  model.graph!.node.forEach((n, i) => n.attribute.forEach((a) => a.t && move(a.t, 10000 + i)));
  if (!options.perTensor) fs.writeFileSync(path.join(dir, location), Buffer.concat(shared));
  const file = path.join(dir, name);
  fs.writeFileSync(file, encodeAs('ModelProto', model));
  return file;
}

/**
 * A small attention model plus an unused float initializer 'big_table' of `elements` values, written as a
 * sparse file: the table is zeros but for marker bytes at both ends, so a multi-GB model costs no disk space.
 */
export function writeSparseModel(file: string, elements: number): { markers: { head: Buffer; tail: Buffer }; rawBytes: number } {
  const model = smallTransformer({ layers: 1, d: 16, heads: 2, ff: 16, vocab: 20, tmax: 8 });
  const graphHead = encodeAs('GraphProto', model.graph!);
  const rawBytes = elements * 4;
  const tensorHead = encodeAs('TensorProto', { name: 'big_table', dataType: 1, dims: [elements] });
  const rawHeader = lenHeader(9, rawBytes);
  const tensorLength = tensorHead.length + rawHeader.length + rawBytes;
  const entryHeader = lenHeader(5, tensorLength);
  const graphLength = graphHead.length + entryHeader.length + tensorLength;
  const top = concatBytes([varintField(1, 8), encodeAs('ModelProto', { opsetImport: model.opsetImport, producerName: 'sparse' }),
    lenHeader(7, graphLength), graphHead, entryHeader, tensorHead, rawHeader]);
  const markers = { head: Buffer.from('first bytes of the table'), tail: Buffer.from('last bytes of the table') };
  const fd = fs.openSync(file, 'w');
  fs.writeSync(fd, top, 0, top.length, 0);
  fs.writeSync(fd, markers.head, 0, markers.head.length, top.length);
  fs.writeSync(fd, markers.tail, 0, markers.tail.length, top.length + rawBytes - markers.tail.length);
  fs.closeSync(fd);
  return { markers, rawBytes };
}

/** A scratch folder on tmpfs when there is one (sparse files read fast there), else in the temp folder. */
export function scratchdir(prefix: string): string {
  return fs.existsSync('/dev/shm') ? fs.mkdtempSync(path.join('/dev/shm', prefix)) : tmpdir(prefix);
}
