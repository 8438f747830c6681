/**
 * Runs the checks' runs one session at a time: the original model over every run some check needs it for (its
 * outputs kept, large ones spilled to a temporary file), then each patched variant over its runs, each run's
 * outputs handed to the checks that read them with the original's and then dropped. A session is released
 * before the next is made, so one model's weights and one run's activations are resident at a time.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { InputError, opt } from '../errors';
import { runtimeLabel, runtimeReport } from '../onnxruntime';
import { CachePool, cachePool, Feeds, synthesize } from './inputs';
import { estimatePeak } from './memory';
import { runId, RunSpec } from './plan';
import { RunReport } from './report';
import { collectGarbage, Outputs, OutputTensor, Runner } from './run';
import { firstLine, LoadFailure, SESSION_LABELS, SESSION_ORDER, SessionFactory, SessionKey } from './sessions';
import { Setup } from './setup';
import { CheckUnit, Outcome, readersOf, sweepEndNote } from './checks/unit';
import { PREFIX } from './nodes';
import { makeScratch, removeScratch } from './scratch';

/** `notes`: this execution's notes, the plan's first; what running finds (an original that fails at a length) is added. */
export async function execute(setup: Setup, factory: SessionFactory, units: CheckUnit[], notes: string[],
  progress: (line: string) => void): Promise<RunReport[]> {
  const runs = setup.plan.runs;
  const readers = (run: RunSpec, key: SessionKey): CheckUnit[] => readersOf(setup, units, run, key);
  const reports = new Map<string, RunReport>();
  const store = new OriginalOutputs();
  const dropped = new Set<string>();
  const state: StepState = { reports, store, dropped, notes, readers: [], factory };
  try {
    for (const key of SESSION_ORDER) {
      const todo = runs.filter((r) => readers(r, key).length > 0 && !dropped.has(r.id));
      if (todo.length === 0) continue;
      let runner: Runner;
      try {
        progress(`verify: loading the ${SESSION_LABELS[key]} model`);
        runner = await factory.open(key);
      } catch (e) {
        if (!(e instanceof LoadFailure)) throw e;
        for (const r of todo) for (const u of readers(r, key)) u.observe(r, key, { error: e.message }, store.get(r.id));
        continue;
      }
      try {
        for (const [k, run] of todo.entries()) {
          if (dropped.has(run.id)) continue;
          const checks = [...new Set(readers(run, key).map((u) => u.id))].join(', ');
          progress(`verify: ${SESSION_LABELS[key]} model, run ${k + 1} of ${todo.length} (${run.id}) for ${checks}`);
          state.readers = readers(run, key);
          const bytes = await step(setup, runner, key, run, state);
          // This run's outputs are dropped (the original's large ones are on disk): free large ones before the next run.
          if (bytes >= SPILL_BYTES) await collectGarbage();
        }
      } finally {
        await factory.release(runner);
      }
    }
  } finally {
    store.clear();
  }
  return runs.filter((r) => reports.has(r.id)).map((r) => reports.get(r.id)!);
}

interface StepState {
  reports: Map<string, RunReport>;
  store: OriginalOutputs;
  dropped: Set<string>;
  notes: string[];
  readers: CheckUnit[];
  factory: SessionFactory;
  /** The original failed on a sweep run of several query tokens over a cache and ran it as one: `<run>: <error>`. */
  decodeOnly?: string;
}

/** One run of one session, its outputs handed on; nothing of them outlives the call. Returns their size in bytes. */
async function step(setup: Setup, runner: Runner, key: SessionKey, run: RunSpec, st: StepState): Promise<number> {
  if (key === 'original' && st.decodeOnly && cachedPrompt(run)) asDecode(run, st);
  let outcome = await runOnce(setup, runner, run, st.reports);
  if (key === 'original' && 'error' in outcome && !st.decodeOnly && cachedPrompt(run) && decodes(setup, st)) {
    outcome = await decodeInstead(setup, runner, run, outcome.error, st);
  }
  if (key === 'original' && 'error' in outcome && run === setup.plan.runs[0] && outcome.error.includes(PREFIX)) outcome = await bareOriginal(setup, run, st);
  const bytes = 'outputs' in outcome ? Object.values(outcome.outputs).reduce((n, t) => n + t.data.byteLength, 0) : 0;
  if (key === 'original') original(setup, run, outcome, st);
  else for (const u of st.readers) u.observe(run, key, outcome, st.store.get(run.id));
  return bytes;
}

/**
 * The first run of the original failed in a node verification added (its probability read-outs): the model
 * as it is, on the same inputs, says what is wrong with them in its own words; if it runs, the fault is this
 * tool's.
 */
async function bareOriginal(setup: Setup, run: RunSpec, st: StepState): Promise<Outcome> {
  const bare = await st.factory.openOriginal(st.factory.optimization);
  try {
    await bare.run(feedsFor(setup, run));
  } catch (e) {
    return { error: firstLine(e) };
  } finally {
    await st.factory.release(bare);
  }
  throw new Error(`verification's copy of the original fails at ${run.id} where the original runs (a bug)`);
}

/**
 * Some decoders take a cache with one query token or a prompt without one, not both (onnxruntime-genai's MHA
 * builds its causal mask [S, S] and expands it to S + past keys): where the original fails on a sweep run of
 * several tokens over a cache and ran one token over one (a short run), the run becomes one token over a cache of the
 * same length, for every session (it is changed before any other runs it), and so does every later sweep run.
 */
async function decodeInstead(setup: Setup, runner: Runner, run: RunSpec, error: string, st: StepState): Promise<Outcome> {
  const failed = run.id;
  asDecode(run, st);
  const outcome = await runOnce(setup, runner, run, st.reports);
  if ('error' in outcome) return outcome;
  st.decodeOnly = `${failed}: ${error}`;
  st.notes.push(`the original model fails on several query tokens over a cache (${st.decodeOnly}) and runs one: from there on, each length of the sweep is one query token after the rest cached`);
  return outcome;
}

const cachedPrompt = (run: RunSpec): boolean => run.kind === 'sweep' && run.seq > 1 && run.past > 0;

/** The original ran one query token over a cache (the short decoding run). */
const decodes = (setup: Setup, st: StepState): boolean => setup.plan.runs.some((r) => r.kind === 'short' && r.seq === 1 && r.past > 0 && st.store.has(r.id));

function asDecode(run: RunSpec, st: StepState): void {
  st.reports.delete(run.id);
  run.past += run.seq - 1;
  run.seq = 1;
  run.id = runId(run);
}

/** The inputs of a run: the same for every session. */
export function feedsFor(setup: Setup, run: RunSpec): Feeds {
  return synthesize(setup.graph, setup.specs, run, { fixed: setup.fixed, given: setup.given, padded: run.padded, seed: seedOf(run.id), pool: poolOf(setup) });
}

const pools = new WeakMap<Setup, CachePool | null>();

/**
 * The shared caches of a verification: sized by its runs over a large cache (a run turned into one query token keeps
 * its key count).
 */
function poolOf(setup: Setup): CachePool | undefined {
  if (!pools.has(setup)) pools.set(setup, cachePool(setup.specs, setup.fixed, setup.plan.runs, new Set(Object.keys(setup.given))) ?? null);
  return pools.get(setup) ?? undefined;
}

async function runOnce(setup: Setup, runner: Runner, run: RunSpec, reports: Map<string, RunReport>): Promise<Outcome> {
  const feeds = feedsFor(setup, run);
  const peak = estimatePeak(setup.memory, run);
  const report = reports.get(run.id) ?? {
    id: run.id, kind: run.kind, batch: run.batch, seq: run.seq, past: run.past, padded: run.padded, ms: {}, ...(peak ? { estimatedPeakBytes: peak.total } : {}),
  };
  reports.set(run.id, report);
  const start = performance.now();
  try {
    return { outputs: await runner.run(feeds) };
  } catch (e) {
    report.errors = { ...report.errors, [runner.label]: firstLine(e) };
    return { error: firstLine(e) };
  } finally {
    report.ms[runner.label] = Math.round(performance.now() - start);
  }
}

/** onnxruntime's words for a kernel that lacks a feature (its NOT_IMPLEMENTED status, or a kernel's own check). */
const UNSUPPORTED = /\bnot (?:supported|implemented)\b|NOT_IMPLEMENTED/i;

/**
 * The original's outcome: kept for the variants' runs. An original that fails on the first run cannot be
 * verified (an input error); failing at a sweep length ends the sweep there.
 */
function original(setup: Setup, run: RunSpec, outcome: Outcome, { store, dropped, notes }: StepState): void {
  if ('outputs' in outcome) {
    store.set(run.id, outcome.outputs);
    return;
  }
  if (run === setup.plan.runs[0]) {
    // A kernel that does not implement what the model asks fails whatever the inputs: no size or file helps.
    const action = UNSUPPORTED.test(outcome.error)
      ? `this runtime (${runtimeLabel(runtimeReport())}) does not implement what the model asks, whatever its inputs: verify it where a runtime does, or re-export it without that feature`
      : `set sizes with ${opt('dims', 'NAME=N')} or give inputs with ${opt('inputFiles', 'NAME=FILE')}`;
    throw new InputError(`the original model fails on the synthesised inputs (${run.id}): ${outcome.error}; ${action}`, 'cannot-verify');
  }
  dropped.add(run.id);
  if (run.kind === 'sweep') {
    for (const r of setup.plan.runs) if (r.kind === 'sweep' && r.seq + r.past >= run.seq + run.past) dropped.add(r.id);
    notes.push(sweepEndNote(run.seq + run.past, outcome.error));
  } else {
    notes.push(`the original model fails at ${run.id}, so that run was not compared: ${outcome.error}`);
  }
}

/** A deterministic seed per run, so every session sees the same inputs for the same run. */
function seedOf(id: string): number {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619);
  return h >>> 0;
}

/** Tensors larger than this are kept in a temporary file until the variants' runs read them. */
export const SPILL_BYTES = 32 * 1024 * 1024;

/** The original's outputs of every run, large tensors on disk so they do not add to a long run's peak memory. */
class OriginalOutputs {
  private readonly held = new Map<string, Outputs>();
  private readonly spilled = new Map<string, Map<string, { dims: number[]; file: string; wide: boolean }>>();
  private dir: string | null = null;

  set(run: string, outputs: Outputs): void {
    const small: Outputs = {};
    const big = new Map<string, { dims: number[]; file: string; wide: boolean }>();
    for (const [name, t] of Object.entries(outputs)) {
      if (t.data.byteLength <= SPILL_BYTES) { small[name] = t; continue; }
      this.dir ??= makeScratch('ssmax-verify-outputs-');
      const file = path.join(this.dir, `${this.spilled.size}-${big.size}.bin`);
      fs.writeFileSync(file, new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
      big.set(name, { dims: t.dims, file, wide: t.data instanceof Float64Array });
    }
    this.held.set(run, small);
    if (big.size) this.spilled.set(run, big);
  }

  has(run: string): boolean {
    return this.held.has(run);
  }

  get(run: string): Outputs | undefined {
    const small = this.held.get(run);
    const big = this.spilled.get(run);
    if (!small || !big) return small;
    const out: Outputs = { ...small };
    for (const [name, s] of big) {
      const bytes = fs.readFileSync(s.file);
      const data: OutputTensor['data'] = s.wide ? new Float64Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 8) : new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
      out[name] = { dims: s.dims, data };
    }
    return out;
  }

  clear(): void {
    this.held.clear();
    this.spilled.clear();
    if (this.dir) removeScratch(this.dir);
    this.dir = null;
  }
}
