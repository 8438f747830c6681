/**
 * A run's peak memory, estimated before it runs (issue 33: a 65536-token sweep passed 14 GB and was killed with
 * nothing said). Pure: from the model's weights, its attention's shape and the run's inputs and outputs.
 *   weights    the initializers' bytes (one session is resident at a time);
 *   attention  matrices · batch · queries · keys · 4 bytes, at the site that holds the most [queries, keys]
 *              matrices at once (layers run one after another): a Softmax in plain ops 2 · heads + 1 (its input and
 *              output, and a mask of one [batch, 1, queries, keys] matrix); a fused operator heads + 1 (its
 *              kernel's one probability buffer, and a margin for a qk output); in float32 (onnxruntime's CPU kernels
 *              compute fp16 attention in float32). Measured, one 8192-token run of each: genai_pipeline-model-
 *              tiny_transformer (a plain Softmax, 2 heads) 1.45 GB peak RSS against 1.55 GB estimated;
 *              genai_tiny-qwen35_decoder (GroupQueryAttention, 4 heads) 1.29 GB against 1.6 GB;
 *   io         the run's inputs and outputs (caches, logits), at the sizes the run's shape gives them;
 *   BASE       the process itself (Node and onnxruntime, measured 0.15–0.2 GB).
 * A verification whose longest run would pass the budget (default half the memory free when it starts,
 * --max-memory to change it) is capped below it: the runs beyond are not started, and the cap says what the
 * longest one would need and the flag that allows it.
 */
import * as os from 'node:os';
import type { Detection } from '../detect/find-attention';
import { Graph } from '../graph/graph';
import { opt } from '../errors';
import { rawByteLength } from '../io/constants';
import { toNumber, ValueInfoProto } from '../io/onnx';
import { LengthLimit } from '../analysis/limits';
import { InputSpec, resolveDim, RunShape } from '../analysis/signature';
import { elementCount } from './tensors';

const BASE = 200 * 2 ** 20;
const GB = 2 ** 30;

export interface MemoryModel {
  weights: number;
  /** The most [queries, keys] matrices one site holds at once (undefined: some site's heads are unknown, and no estimate is made). */
  matrices?: number;
  specs: InputSpec[];
  outputs: ValueInfoProto[];
  fixed: ReadonlyMap<string, number>;
}

export interface PeakEstimate {
  total: number;
  weights: number;
  attention: number;
  io: number;
}

/**
 * What `matrices` counts, from detection's sites; undefined when a site's heads are unknown. `readsQk`: the sharpness
 * check reads a fused operator's qk output, which the kernel then writes too (heads matrices more; measured on
 * ort_whisper_decoder_with_past_self_mha_fused, 4 heads, 1500 queries over 65536 keys: 3.84 GB peak RSS, about
 * 9.5 matrices; 2·heads + 2 are counted).
 */
export function attentionMatrices(d: Pick<Detection, 'sites' | 'fused' | 'calls'>, readsQk = false): number | undefined {
  const all = [...d.sites, ...d.fused, ...d.calls.map((c) => c.inner)];
  if (!all.length || all.some((s) => !s.heads.heads)) return undefined;
  return Math.max(...all.map((s) => ('op' in s ? (readsQk ? 2 * s.heads.heads! + 2 : s.heads.heads! + 1) : 2 * s.heads.heads! + 1)));
}

/** The bytes of a graph's initializers (external data included: their dims say their size). */
export function weightBytes(graph: Graph): number {
  let total = 0;
  for (const t of graph.initializers.values()) total += rawByteLength(t.dataType ?? 0, elementCount(t.dims.map(toNumber))) ?? 0;
  return total;
}

/** The estimated peak of one run; `queries` is the rows each attention site computes (the run's new tokens). */
export function estimatePeak(m: MemoryModel, run: RunShape): PeakEstimate | null {
  if (!m.matrices) return null;
  const keys = run.seq + run.past;
  const attention = m.matrices * run.batch * run.seq * keys * 4;
  const io = ioBytes(m, run);
  return { total: BASE + m.weights + attention + io, weights: m.weights, attention, io };
}

/** Inputs at the sizes synthesis gives them; outputs by their declared dims, a dim no input names taken as the run's length. */
function ioBytes(m: MemoryModel, run: RunShape): number {
  const byParam = new Map<string, number>();
  let total = 0;
  const shared = sharedPasts(m.specs, run, m.fixed);
  const sources = new Set(shared.values());
  for (const s of m.specs) {
    if (s.unshaped || shared.has(s.name)) continue;
    const dims = s.dims.map((d, axis) => {
      const size = resolveDim(s, axis, run, m.fixed).size;
      if ('param' in d) byParam.set(d.param, size);
      return size;
    });
    // A shared cache twice: fed once, and once more as the present a layer builds from it (the cache outputs are
    // dropped, so each layer's lives only while the layer runs; measured 0.8 GB over the 1.3 GB estimated before
    // on the 12-layer × 768 decoder at 131072 keys, one layer's keys and values).
    total += (sources.has(s.name) ? 2 : 1) * (rawByteLength(s.elemType, elementCount(dims)) ?? 0);
  }
  for (const o of m.outputs) {
    const t = o.type?.tensorType;
    if (!t?.shape) continue;
    const dims = t.shape.dim.map((d) => (d.dimValue !== undefined && toNumber(d.dimValue) > 0 ? toNumber(d.dimValue)
      : byParam.get(d.dimParam ?? '') ?? run.seq + run.past));
    total += rawByteLength(t.elemType ?? 1, elementCount(dims)) ?? 0;
  }
  return total;
}

/**
 * A plan whose longest run feeds past inputs of this many bytes or more runs its sessions without the cache outputs;
 * a run that feeds this many shares their values between layers (sharedPasts).
 */
export const CACHE_OUTPUT_BYTES = 256 * 2 ** 20;

const pastSpecs = (specs: readonly InputSpec[]): InputSpec[] => specs.filter((s) => s.role === 'past' && !s.unshaped);
const specBytes = (s: InputSpec, run: RunShape, fixed: ReadonlyMap<string, number>): number =>
  rawByteLength(s.elemType, elementCount(s.dims.map((_, axis) => resolveDim(s, axis, run, fixed).size))) ?? 0;

/** The bytes of the past inputs at a run's shape: the cache the model's layers hold (and their presents return). */
export function pastBytes(m: { specs: readonly InputSpec[]; fixed: ReadonlyMap<string, number> }, run: RunShape): number {
  return pastSpecs(m.specs).reduce((n, s) => n + specBytes(s, run, m.fixed), 0);
}

/**
 * The past inputs a run feeds with another's values, each to the input whose values it takes, where the run's past
 * inputs are CACHE_OUTPUT_BYTES or more: inputs of one type and one shape at the run (a layer's keys, its values, the
 * next layer's …) take the values of the first two of them in turn, so keys and values stay distinct. Every session
 * is fed the same values, so the checks compare as before; onnxruntime reads a fed buffer in place, so the run holds
 * two caches' worth of inputs instead of one per layer (the 12-layer × 768 decoder at 65536 keys: 0.4 GB, not 4.5),
 * and synthesis fills two. `given`: inputs the user gave, never shared.
 */
export function sharedPasts(specs: readonly InputSpec[], run: RunShape, fixed: ReadonlyMap<string, number>,
  given: ReadonlySet<string> = new Set()): Map<string, string> {
  const pasts = pastSpecs(specs).filter((s) => !given.has(s.name));
  const out = new Map<string, string>();
  if (pastBytes({ specs, fixed }, run) < CACHE_OUTPUT_BYTES) return out;
  const groups = new Map<string, InputSpec[]>();
  for (const s of pasts) {
    const key = `${s.elemType}:${s.dims.map((_, axis) => resolveDim(s, axis, run, fixed).size).join('x')}`;
    groups.set(key, [...(groups.get(key) ?? []), s]);
  }
  for (const group of groups.values()) group.slice(2).forEach((s, i) => out.set(s.name, group[i % 2].name));
  return out;
}

/**
 * The outputs declared as a past input grown on one axis (the presents): the same rank and the same dims but on one
 * axis, where the past's is symbolic (its length) and the output's is another symbol (a fixed one is another cache).
 */
export function cacheOutputs(specs: readonly InputSpec[], outputs: readonly ValueInfoProto[]): string[] {
  const pasts = specs.filter((s) => s.role === 'past' && !s.unshaped);
  const text = (d: { dimValue?: unknown; dimParam?: string }): string => (d.dimValue !== undefined && toNumber(d.dimValue as number) > 0 ? String(toNumber(d.dimValue as number)) : d.dimParam ?? '?');
  return outputs.filter((o) => {
    const dims = o.type?.tensorType?.shape?.dim.map(text);
    return dims && pasts.some((p) => {
      if (p.dims.length !== dims.length) return false;
      const past = p.dims.map((d) => ('value' in d ? String(d.value) : 'param' in d ? d.param : '?'));
      const differ = past.map((d, a) => d !== dims[a]);
      const axis = differ.indexOf(true);
      return differ.filter(Boolean).length === 1 && 'param' in p.dims[axis] && !/^\d+$/.test(dims[axis]);
    });
  }).map((o) => o.name);
}

/** The default budget: half the memory free now (and within a container's limit), so no run swaps the machine. */
export function defaultBudget(): { bytes: number; why: string } {
  const constrained = typeof process.constrainedMemory === 'function' ? process.constrainedMemory() ?? 0 : 0;
  const free = constrained > 0 ? Math.min(os.freemem(), constrained) : os.freemem();
  return { bytes: Math.floor(free / 2), why: `half of the ${gb(free)} free` };
}

export const gb = (bytes: number): string => `${(bytes / GB).toFixed(bytes < 10 * GB ? 1 : 0)} GB`;

/**
 * The longest total length whose run fits the budget, as a cap with its reason, when the longest length the
 * plan wants (`want`) does not fit; null when it fits or no estimate can be made. `shape(t)` is the run of t tokens.
 */
export function memoryLimit(m: MemoryModel, want: number, shape: (total: number) => RunShape, budget: { bytes: number; why: string }): LengthLimit | null {
  const need = estimatePeak(m, shape(want));
  if (!need || need.total <= budget.bytes) return null;
  const parts = `weights ${gb(need.weights)}, attention ${gb(need.attention)}, inputs and outputs ${gb(need.io)}`;
  return {
    length: longestWithin(want, (t) => estimatePeak(m, shape(t))!.total <= budget.bytes),
    reason: `a run of ${want} tokens would need about ${gb(need.total)} (${parts}), over the memory budget ${gb(budget.bytes)} `
      + `(${budget.why}); ${opt('maxMemory', `${Math.ceil(need.total / GB)}G`)} runs it`,
  };
}

/**
 * The cache a run of the default plan may feed (bytes, counted as if no input shared another's values). A run over
 * a cache takes time with the cache, not with its query tokens: every layer reads its cache and copies it into the
 * present it builds, 1.5 s a session for the 12-layer × 768 decoder's 4.5 GiB at 65536 keys on two cores. Within
 * 6 GiB a run takes about 2 s a session, so verify's time grows little with L; --max-len runs longer.
 */
export const CACHE_RUN_BYTES = 6 * GB;

/** The longest total length whose run feeds a cache within CACHE_RUN_BYTES, where `want`'s run feeds more; else null. */
export function cacheLimit(m: MemoryModel, want: number, shape: (total: number) => RunShape): LengthLimit | null {
  const need = pastBytes(m, shape(want));
  if (need <= CACHE_RUN_BYTES) return null;
  return {
    length: longestWithin(want, (t) => pastBytes(m, shape(t)) <= CACHE_RUN_BYTES),
    reason: `a run of ${want} keys would feed a cache of ${gb(need)}; the default plan keeps a run's cache within ${gb(CACHE_RUN_BYTES)}, as its time grows with it (every layer reads the cache and copies it); ${opt('maxLen', String(want))} runs it`,
  };
}

/** The longest length below `want` that `fits` (a bisection: what a run needs grows with its length); 1 at least. */
function longestWithin(want: number, fits: (total: number) => boolean): number {
  let lo = 1, hi = want;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/** `--max-memory` values: bytes, or a number with K, M, G or T (powers of 1024). */
export function parseSize(text: string): number | null {
  const m = /^(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?$/i.exec(text.trim());
  if (!m) return null;
  const power = ' KMGT'.indexOf(m[2].toUpperCase() || ' ');
  const bytes = Number(m[1]) * 1024 ** power;
  return bytes >= 1 ? Math.floor(bytes) : null;
}
