/** Reads the PyTorch reference files written by fixtures/torch/make.py. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { encodeModel } from '../../src/io/model-file';
import { ModelProto } from '../../src/io/onnx';
import { Feeds, HostTensor } from '../../src/verify/inputs';
import { Outputs, Runner } from '../../src/verify/run';

export const FIXTURES = path.resolve(__dirname, '../../../fixtures');
export const TORCH = path.join(FIXTURES, 'torch');
/**
 * The corpus of real models (SOURCES.md describes each file): the folder $SSMAX_CORPUS names, else ../shared/corpus
 * beside the repository. Every corpus test reads it from here. Where it is absent those tests skip, and
 * test/corpus-present.test.ts says so in one line (or, under CI=true, fails).
 */
export const CORPUS = process.env.SSMAX_CORPUS ? path.resolve(process.env.SSMAX_CORPUS) : path.resolve(__dirname, '../../../../shared/corpus');

/** How to point the tests at a corpus, for skip reasons and failures. */
export const CORPUS_HINT = 'set SSMAX_CORPUS to the corpus folder to run them';

/** The skip reason of a test that needs these corpus files (a folder counts as a file), or false when all are there. */
export function corpusSkip(...files: string[]): string | false {
  const missing = files.filter((f) => !fs.existsSync(path.join(CORPUS, f)));
  if (!missing.length) return false;
  return fs.existsSync(CORPUS) ? `${missing.join(', ')} not in the corpus ${CORPUS}` : `no corpus at ${CORPUS} (${CORPUS_HINT})`;
}

/** Every .onnx file below a folder, recursively; none when the folder is absent. */
export function onnxFiles(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return onnxFiles(p);
    return e.name.endsWith('.onnx') ? [p] : [];
  });
}

export interface RefTensor { dtype: 'int64' | 'float32' | 'int32' | 'float16' | 'bool'; dims: number[]; data: string }
export interface RefCase {
  name: string;
  patch: null | { n?: 'keys' | 'causal'; s: number | number[] | number[][] };
  inputs: Record<string, RefTensor>;
  outputs: Record<string, RefTensor>;
}
export interface RefFile { model: string; opset: number; num_layers: number; num_heads: number; causal: boolean; cases: RefCase[] }

export function loadRef(name: string, dir = TORCH): RefFile {
  return JSON.parse(fs.readFileSync(path.join(dir, `${name}.ref.json`), 'utf8')) as RefFile;
}

export function decode(t: RefTensor): HostTensor {
  const bytes = Buffer.from(t.data, 'base64');
  const buf = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  switch (t.dtype) {
    case 'int64': return { type: 'int64', dims: t.dims, data: new BigInt64Array(buf) };
    case 'int32': return { type: 'int32', dims: t.dims, data: new Int32Array(buf) };
    case 'float16': return { type: 'float16', dims: t.dims, data: new Uint16Array(buf) };
    case 'bool': return { type: 'bool', dims: t.dims, data: new Uint8Array(buf) };
    case 'float32': return { type: 'float32', dims: t.dims, data: new Float32Array(buf) };
  }
}

export function feedsOf(c: RefCase): Feeds {
  return Object.fromEntries(Object.entries(c.inputs).map(([k, v]) => [k, decode(v)]));
}

/** A reference case's inputs and the outputs its reference computed. */
type RefIO = Pick<RefCase, 'name' | 'inputs' | 'outputs'>;

/** The model on onnxruntime, fed a reference case's inputs. */
export async function runCase(model: ModelProto, c: RefIO): Promise<Outputs> {
  const runner = await Runner.create(encodeModel(model), c.name);
  const out = await runner.run(Object.fromEntries(Object.entries(c.inputs).map(([k, v]) => [k, decode(v)])));
  await runner.release();
  return out;
}

/** The largest absolute difference of any output from the reference's. */
export function maxCaseDiff(out: Outputs, c: RefIO): number {
  let diff = 0;
  for (const [name, t] of Object.entries(c.outputs)) {
    const want = decode(t).data as Float32Array;
    for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(out[name].data[i] - want[i]));
  }
  return diff;
}
