/** onnxruntime sessions: one per model variant, created once and reused across every run and check. */
import * as v8 from 'node:v8';
import * as vm from 'node:vm';
import type * as ort from 'onnxruntime-web';
import { externalFiles } from '../io/external';
import { encodeModel, readModel } from '../io/model-file';
import { ModelProto } from '../io/onnx';
import { cores, onnxruntime } from '../onnxruntime';
import { Feeds, hostValues } from './tensors';

export interface OutputTensor {
  dims: number[];
  data: Float32Array | Float64Array;
}

export type Outputs = Record<string, OutputTensor>;

/** onnxruntime's graph optimisation levels verification uses. */
export type Optimization = 'disabled' | 'basic' | 'all';

export class Runner {
  /** Milliseconds spent in session.run, summed over every run of this session. */
  runMs = 0;

  private constructor(private readonly session: ort.InferenceSession, readonly label: string, readonly createMs: number) {}

  /**
   * A session from the model's bytes, or from a model file (whose external data stays in files). `sameShape`: every
   * run of this session has the same shapes (calibrate by loss), so it keeps a memory arena (see below).
   */
  static async create(model: Uint8Array | string, label: string, optimization: Optimization = 'all', sameShape = false): Promise<Runner> {
    const start = performance.now();
    const runtime = onnxruntime();
    // No memory arena and no memory pattern: a long run's activations are returned after the run instead of staying
    // reserved for the session's lifetime (a 4096-token run of a 12-layer model reserves about 2 GB), as runs of
    // growing lengths would otherwise each reserve more. Runs of one shape reuse what the first reserved, and the
    // arena saves each later run the page faults of its large buffers: 145 → 76 ms per 2048-token run of the LM
    // benchmark's models. No prepacked copy of the weights: 12 % less memory at that run, and no slower on this CPU provider.
    const options: ort.InferenceSession.SessionOptions = {
      executionProviders: [runtime.provider], logSeverityLevel: 4, intraOpNumThreads: cores(), graphOptimizationLevel: optimization,
      enableCpuMemArena: sameShape, enableMemPattern: false, extra: { session: { disable_prepacking: '1' } },
    };
    // The WebAssembly runtime has no file system: a model file's external data is handed over, file by file.
    if (typeof model === 'string' && runtime.provider === 'wasm') options.externalData = externalDataOf(model);
    let session: ort.InferenceSession;
    try {
      session = typeof model === 'string'
        ? await runtime.ort.InferenceSession.create(model, options) : await runtime.ort.InferenceSession.create(model, options);
    } catch (e) {
      throw runtime.provider === 'wasm' ? wasmLoadError(e) : e;
    }
    return new Runner(session, label, performance.now() - start);
  }

  static async fromModel(model: ModelProto, label: string): Promise<Runner> {
    return Runner.create(encodeModel(model), label);
  }

  /** Runs the session; `fetches` limits which outputs are copied back (default: all). */
  async run(feeds: Feeds, fetches?: readonly string[]): Promise<Outputs> {
    const ortFeeds: Record<string, ort.Tensor> = {};
    const { Tensor } = onnxruntime().ort;
    for (const [name, t] of Object.entries(feeds)) {
      if (this.session.inputNames.includes(name)) ortFeeds[name] = new Tensor(t.type, t.data as never, t.dims);
    }
    const start = performance.now();
    try {
      // A kernel's failure is thrown with its status and reported by the checks: the run's own log would print it on stderr again.
      const quiet = { logSeverityLevel: 4 as const };
      const result = fetches ? await this.session.run(ortFeeds, [...fetches], quiet) : await this.session.run(ortFeeds, quiet);
      const out: Outputs = {};
      for (const [name, t] of Object.entries(result)) {
        out[name] = { dims: [...t.dims], data: hostValues(t.type, t.data as ArrayLike<number | bigint>) };
      }
      return out;
    } finally {
      this.runMs += performance.now() - start;
    }
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/**
 * onnxruntime-web refuses some models onnxruntime-node loads (its shape inference rejects declared shapes the native
 * build lets pass, in some Whisper and ONNX Attention exports): the first line says which runtime refused.
 */
function wasmLoadError(e: unknown): Error {
  const [first, ...rest] = String((e as Error)?.message ?? e).split('\n');
  const { version } = onnxruntime();
  return new Error([`${first} (onnxruntime-web ${version}, WebAssembly; onnxruntime-node may load it)`, ...rest].join('\n'));
}

/** The data files a model file refers to, each under the location the model names it by. */
function externalDataOf(file: string): { path: string; data: string }[] {
  return externalFiles(readModel(file)).map((f) => ({ path: f.location, data: f.file }));
}

/**
 * Output tensors live in memory onnxruntime allocated until their JavaScript objects are collected, which V8 does
 * when it sees fit: for a 4096-token run's logits that is 134 MB on top of the next run's peak. The collector is
 * run by hand where outputs were just dropped (Node's --expose-gc, enabled for this call).
 */
export async function collectGarbage(): Promise<void> {
  // The run's promise machinery holds the outputs until the next turn of the event loop.
  await new Promise((resolve) => setTimeout(resolve, 0));
  v8.setFlagsFromString('--expose-gc');
  (vm.runInNewContext('gc') as () => void)();
}
