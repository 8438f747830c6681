/** onnxruntime-node sessions: one per model, reused across every length and check. */
import * as ort from 'onnxruntime-node';
import { Feeds, HostTensor } from './inputs';

export interface Outputs {
  [name: string]: { dims: number[]; data: Float64Array };
}

export class Runner {
  private constructor(private readonly session: ort.InferenceSession, readonly label: string) {}

  static async create(bytes: Uint8Array, label: string): Promise<Runner> {
    const session = await ort.InferenceSession.create(bytes, { logSeverityLevel: 3, intraOpNumThreads: 2 });
    return new Runner(session, label);
  }

  get outputNames(): readonly string[] {
    return this.session.outputNames;
  }

  async run(feeds: Feeds): Promise<Outputs> {
    const ortFeeds: Record<string, ort.Tensor> = {};
    for (const [name, t] of Object.entries(feeds)) ortFeeds[name] = toOrt(t);
    const result = await this.session.run(ortFeeds);
    const out: Outputs = {};
    for (const [name, t] of Object.entries(result)) out[name] = { dims: [...t.dims], data: toFloat64(t) };
    return out;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

function toOrt(t: HostTensor): ort.Tensor {
  return new ort.Tensor(t.type, t.data as never, t.dims);
}

function toFloat64(t: ort.Tensor): Float64Array {
  const data = t.data;
  if (data instanceof BigInt64Array) return Float64Array.from(data, (v) => Number(v));
  if (data instanceof Float32Array || data instanceof Int32Array || data instanceof Uint8Array) return Float64Array.from(data);
  if (data instanceof Float64Array) return data;
  return Float64Array.from(data as ArrayLike<number>);
}
