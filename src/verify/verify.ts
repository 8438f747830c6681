/**
 * Proves on onnxruntime that a patch behaves: (1) with its factor forced to 1 it reproduces the original;
 * (2) at n = L_train the retrofit patch reproduces the original; (3) beyond L_train it differs; (4) nothing
 * is NaN or Inf at any tested length.
 */
import { Graph } from '../graph/graph';
import { inferElemTypes } from '../graph/types';
import { makeTensor } from '../graph/tensor';
import { DataType, encodeModel, ModelProto } from '../io/onnx';
import { cloneModel } from '../rewrite/patch';
import { readRecord } from '../rewrite/record';
import { scaleFromTrainLen } from '../policy/scale';
import { allFinite, compareOutputs, OutputStats } from './compare';
import { hasPast, Length, synthesizeInputs } from './inputs';
import { Outputs, Runner } from './run';

export type Status = 'PASSED' | 'FAILED' | 'SKIPPED';

export interface RunResult {
  length: Length;
  outputs: OutputStats[];
  passed: boolean;
  error?: string;
}

export interface CheckResult {
  name: string;
  status: Status;
  detail: string;
  runs: RunResult[];
}

export interface VerifyReport {
  passed: boolean;
  trainLen?: number;
  checks: CheckResult[];
}

export interface VerifyOptions {
  trainLen?: number;
  /** Sequence lengths to run; default [8, L, 4L] with L = trainLen, else [8, 64]. */
  lengths?: number[];
  batch?: number;
  /** Tolerance for parity checks (default 1e-5 for wiring, 1e-4 for retrofit). */
  atol?: number;
}

const APPLY = /^ssmax\/L\d+\/apply/;

/** The patched model with every inserted factor replaced by 1: the wiring alone. */
export function withUnitFactor(patched: ModelProto): ModelProto {
  const model = cloneModel(patched);
  const graph = new Graph(model.graph!);
  const types = inferElemTypes(graph);
  for (const node of graph.nodes.filter((n) => APPLY.test(n.name))) {
    const type = types.get(node.input[1]) ?? types.get(node.input[0]);
    const name = graph.uniqueName(`${node.name}/unit_factor`);
    graph.proto.initializer.push(makeTensor(name, type ?? DataType.FLOAT, [], [1]));
    node.input[1] = name;
  }
  return model;
}

export async function verifyPatch(original: ModelProto, patched: ModelProto, options: VerifyOptions = {}): Promise<VerifyReport> {
  const record = readRecord(patched);
  const L = options.trainLen ?? record?.trainLen;
  const batch = options.batch ?? 2;
  const seqs = options.lengths ?? (L ? [Math.min(8, L), L, 4 * L] : [8, 64]);
  const graph = new Graph(original.graph!);
  const past = hasPast(graph);
  const runners = {
    original: await Runner.create(encodeModel(original), 'original'),
    patched: await Runner.create(encodeModel(patched), 'patched'),
    unit: await Runner.create(encodeModel(withUnitFactor(patched)), 'patched with factor 1'),
  };
  const lengths: Length[] = seqs.map((seq) => ({ batch, seq, past: 0 }));
  if (past) lengths.push({ batch, seq: 3, past: L ?? 8 });
  const cache = new Map<string, Outputs | Error>();
  const run = async (which: keyof typeof runners, len: Length): Promise<Outputs> => {
    const key = `${which}:${len.batch}:${len.seq}:${len.past}`;
    if (!cache.has(key)) {
      cache.set(key, await runners[which].run(synthesizeInputs(graph, len)).catch((e: Error) => e));
    }
    const value = cache.get(key)!;
    if (value instanceof Error) throw value;
    return value;
  };
  const compare = async (a: keyof typeof runners, len: Length, accept: (s: OutputStats[]) => boolean): Promise<RunResult> => {
    try {
      const outputs = compareOutputs(await run(a, len), await run('original', len));
      return { length: len, outputs, passed: accept(outputs) };
    } catch (e) {
      return { length: len, outputs: [], passed: false, error: oneLine(e) };
    }
  };
  const atol = options.atol;
  const checks: CheckResult[] = [];
  const wiringTol = atol ?? 1e-5;
  checks.push(summarise('wiring parity (factor forced to 1)', `max abs error ≤ ${wiringTol}`,
    await Promise.all(lengths.map((len) => compare('unit', len, (s) => s.every((o) => o.maxAbs <= wiringTol))))));
  checks.push(await retrofitCheck(patched, L, batch, past, atol ?? 1e-4, compare));
  const longest = lengths.reduce((a, b) => (b.seq + b.past > a.seq + a.past ? b : a));
  checks.push(summarise(`liveness at ${L ? '4·L' : 'the longest length'}`, 'outputs differ from the original (max abs > 1e-5) and are finite',
    [await compare('patched', longest, (s) => s.some((o) => o.maxAbs > 1e-5) && s.every((o) => o.finite))]));
  const finiteRuns: RunResult[] = [];
  for (const len of lengths) {
    try {
      const out = await run('patched', len);
      finiteRuns.push({ length: len, outputs: [], passed: allFinite(out) });
    } catch (e) {
      finiteRuns.push({ length: len, outputs: [], passed: false, error: oneLine(e) });
    }
  }
  checks.push(summarise('no NaN or Inf', 'every patched output finite at every length', finiteRuns));
  await Promise.all(Object.values(runners).map((r) => r.release()));
  return { passed: checks.every((c) => c.status !== 'FAILED'), trainLen: L, checks };
}

type Compare = (a: 'patched', len: Length, accept: (s: OutputStats[]) => boolean) => Promise<RunResult>;

async function retrofitCheck(patched: ModelProto, L: number | undefined, batch: number, past: boolean, tol: number, compare: Compare): Promise<CheckResult> {
  const name = 'retrofit parity at n = L';
  const record = readRecord(patched);
  if (!L || !record) return skipped(name, 'needs --train-len');
  const expected = scaleFromTrainLen(L);
  const sameS = record.sites.every((s) => (Array.isArray(s.s) ? s.s : [s.s]).every((v) => Math.abs(v - expected) < 1e-9));
  if (!sameS) return skipped(name, 's is not 1/ln L at every site');
  // With masks of ones, padding counts equal the key count and causal-padding counts equal positions.
  const like: Record<string, string> = { keys: 'keys', padding: 'keys', causal: 'causal', 'causal-padding': 'causal' };
  const modes = new Set(record.sites.map((s) => like[s.n] ?? s.n));
  const accept = (s: OutputStats[]): boolean => s.every((o) => o.maxAbs <= tol);
  if (modes.size === 1 && modes.has('keys')) {
    const lens: Length[] = [{ batch, seq: L, past: 0 }];
    if (past) lens.push({ batch, seq: 4, past: L - 4 });
    return summarise(name, `keys: Tk = ${L}, max abs error ≤ ${tol}`, await Promise.all(lens.map((len) => compare('patched', len, accept))));
  }
  if (modes.size === 1 && modes.has('causal') && past) {
    return summarise(name, `causal: one new token after ${L - 1} cached ones (n = ${L}), max abs error ≤ ${tol}`,
      [await compare('patched', { batch, seq: 1, past: L - 1 }, accept)]);
  }
  return skipped(name, 'causal n without a KV cache: no length puts every row at n = L (use --n keys to check)');
}

function summarise(name: string, detail: string, runs: RunResult[]): CheckResult {
  return { name, detail, runs, status: runs.every((r) => r.passed) ? 'PASSED' : 'FAILED' };
}

function skipped(name: string, detail: string): CheckResult {
  return { name, detail, runs: [], status: 'SKIPPED' };
}

function oneLine(e: unknown): string {
  return String((e as Error)?.message ?? e).split('\n')[0];
}
