/**
 * Which runs verification makes: short runs (batch 2: plain, a padded batch, KV-cache prefill and decoding with
 * past > 0) for wiring and the probe, and a sweep of context lengths L/4 … 16·L (batch 1) for retrofit parity,
 * liveness and sharpness, capped by the model's position table, by --max-len (by default also by the size of one
 * attention matrix), and by what the inputs allow. Where the model takes a KV cache, the sweep's runs are a few
 * query tokens over a synthesised cache (CACHE_QUERY), so a run's memory grows with the cache and its time with
 * one decode step, not with heads × length².
 */
import { LengthLimit } from '../analysis/limits';
import { RunShape } from '../analysis/signature';
import { opt } from '../errors';

export type CheckId = 'wiring' | 'probe' | 'retrofit' | 'liveness' | 'sharpness';
export const CHECK_IDS: CheckId[] = ['wiring', 'probe', 'retrofit', 'liveness', 'sharpness'];

export interface RunSpec extends RunShape {
  id: string;
  padded: boolean;
  /** Short runs feed wiring and the probe; sweep runs feed retrofit, liveness and sharpness. */
  kind: 'short' | 'sweep' | 'retrofit';
}

export interface PlanInput {
  trainLen: number;
  lengths?: number[];
  maxLen?: number;
  batch: number;
  limit: LengthLimit | null;
  /** Whether the sequence and past lengths of the synthesised inputs can vary, and their pinned values. */
  seqFree: boolean;
  pastFree: boolean;
  pinned: Partial<RunShape>;
  /** A synthesised attention mask exists, so a padded batch can be made. */
  canPad: boolean;
  /** The model's own token count when its inputs fix it (a one-token decoder over a cache). */
  fixedSeq?: number;
  /** The fewest cached tokens a run may have (1 where a kernel cannot take an empty cache). */
  minPast?: number;
  /** The most heads of any attention site, when detection knows them: bounds the default longest length. */
  heads?: number;
  /** Sweep whole prompts even over a cache (calibration reads a curve off every row of one causal run). */
  wholePrompts?: boolean;
}

export interface Plan {
  runs: RunSpec[];
  sweep: number[];
  notes: string[];
  /** The longest total length (past + sequence) any run may have, and why. */
  cap: number;
  capReason: string;
}

/** A plan once verification has prepared it: the executor and the checks read it; none of them adds to it. */
export type FrozenPlan = Readonly<Omit<Plan, 'runs' | 'sweep' | 'notes'>> & {
  readonly runs: readonly RunSpec[];
  readonly sweep: readonly number[];
  readonly notes: readonly string[];
};

export const SHORT_SEQ = 12;
const SECOND_SEQ = 7;

/**
 * Longest run by default. One 4096-token run of a 100 M-parameter model takes about 20 s on two cores and the
 * attention matrices grow with the square of the length, so longer runs are opt-in.
 */
export const DEFAULT_MAX_LEN = 4096;

/**
 * Query tokens of a sweep run over a cache: the rows liveness and sharpness read, each seeing t − 3 … t keys.
 * Four, not one, so a causal site's rows still see more than one n.
 */
export const CACHE_QUERY = 4;

/**
 * Longest run over a cache by default (cached keys + query tokens): its attention is [heads, CACHE_QUERY, T], so
 * the cache itself (layers · 2 · kv heads · T · head size values) is what grows; the memory budget bounds that.
 */
export const DEFAULT_CACHE_LEN = 131072;

/**
 * Values in one attention matrix [B, H, T, T] the default plan allows (2^27: 512 MiB in float32). The peak of a
 * run is about two such matrices (a Softmax's input and output) plus the weights, so this bounds the default
 * plan's memory for any head count.
 */
export const ATTENTION_BUDGET = 2 ** 27;

/**
 * The default longest length: DEFAULT_MAX_LEN for whole prompts, DEFAULT_CACHE_LEN for runs over a cache, lowered
 * to keep one attention matrix [heads, query rows, keys] within the budget. It does not stretch to reach beyond L:
 * a plan with no run beyond L ends in a skipped check that says which flag raises the longest length (--max-len).
 */
export function defaultCap(p: PlanInput): { cap: number; reason: string } {
  const query = cacheQuery(p);
  const heads = p.heads ?? 0;
  const usual = (n: number): { cap: number; reason: string } => ({ cap: n, reason: `the default longest length ${n}${query ? ' of runs over a cache' : ''}; ${opt('maxLen', 'N')} runs longer` });
  // Heads unknown: no estimate of a run's memory, so runs over a cache stop where whole prompts do.
  if (!heads) return usual(DEFAULT_MAX_LEN);
  const batch = p.pinned.batch ?? 1;
  // Lengths asked for by name are run up to the usual default.
  if (p.lengths) return usual(query ? DEFAULT_CACHE_LEN : DEFAULT_MAX_LEN);
  const rows = batch * heads;
  const fits = query ? Math.floor(ATTENTION_BUDGET / (rows * query)) : Math.floor(Math.sqrt(ATTENTION_BUDGET / rows));
  const most = query ? DEFAULT_CACHE_LEN : DEFAULT_MAX_LEN;
  if (fits >= most) return usual(most);
  const shape = `[${batch > 1 ? `${batch}, ` : ''}${heads}, ${query ?? 'T'}, T]`;
  return { cap: fits, reason: `the default plan keeps one attention matrix ${shape} within ${ATTENTION_BUDGET / 2 ** 20} Mi values; ${opt('maxLen', 'N')} runs longer` };
}

/**
 * The query tokens of a sweep run when the sweep runs over a cache (the past can grow): the model's own fixed
 * token count, else CACHE_QUERY; undefined when the sweep runs whole prompts.
 */
function cacheQuery(p: Pick<PlanInput, 'pastFree' | 'seqFree' | 'pinned' | 'fixedSeq' | 'wholePrompts'>): number | undefined {
  if (!p.pastFree) return undefined;
  if (p.pinned.seq !== undefined || p.fixedSeq !== undefined) return p.pinned.seq ?? p.fixedSeq;
  // A free sequence length: a few tokens over the cache, or whole prompts where asked; else the one token it takes.
  if (!p.seqFree) return 1;
  return p.wholePrompts ? undefined : CACHE_QUERY;
}

/** The shape of the sweep's run of `total` keys: whole prompts, or the query tokens after a cache of the rest. */
export function sweepShape(p: Pick<PlanInput, 'pastFree' | 'seqFree' | 'pinned' | 'fixedSeq' | 'wholePrompts' | 'minPast'>, total: number): RunShape {
  const batch = p.pinned.batch ?? 1;
  const query = cacheQuery(p);
  const minPast = p.pastFree ? p.minPast ?? 0 : 0;
  if (query === undefined) return { batch, seq: total, past: p.pinned.past ?? minPast };
  // Fewer keys than the fixed tokens (a length the memory budget tries): those tokens alone.
  const seq = p.seqFree ? Math.max(1, Math.min(query, total - minPast)) : Math.min(query, total);
  return { batch, seq, past: Math.max(0, total - seq) };
}

export function defaultSweep(L: number): number[] {
  const raw = [L / 4, L / 2, L, 2 * L, 4 * L, 8 * L, 16 * L].map((x) => Math.max(2, Math.round(x)));
  return [...new Set(raw)].sort((a, b) => a - b);
}

export function makePlan(p: PlanInput): Plan {
  const notes: string[] = [];
  const byDefault = p.maxLen === undefined ? defaultCap(p) : null;
  const maxLen = p.maxLen ?? byDefault!.cap;
  const cap = Math.min(maxLen, p.limit?.length ?? Infinity);
  const capReason = p.limit && p.limit.length <= maxLen ? p.limit.reason : byDefault ? byDefault.reason : `the longest length ${maxLen} asked for with ${opt('maxLen')}`;
  const batch = p.pinned.batch ?? p.batch;
  const seqOf = (want: number): number => p.pinned.seq ?? p.fixedSeq ?? want;
  const minPast = p.pastFree ? p.minPast ?? 0 : 0;
  const pastOf = (want: number): number => p.pinned.past ?? Math.max(want, minPast);
  const runs: RunSpec[] = [];
  const short = seqOf(Math.max(2, Math.min(SHORT_SEQ, cap)));
  addRun(runs, 'short', batch, short, pastOf(0));
  if (p.canPad && batch >= 2 && short >= 2) addRun(runs, 'short', batch, short, pastOf(0), true);
  // A second length, so a site whose n is the key count sees two values of n (a cache gives them otherwise).
  if (p.seqFree && !p.pastFree && cap > SECOND_SEQ) addRun(runs, 'short', batch, SECOND_SEQ, pastOf(0));
  if (p.pastFree && cap >= 5) {
    // Prefill after a cache (Tq = 3 < Tk) and one-token decoding, within the cap.
    addRun(runs, 'short', batch, seqOf(3), Math.min(7, cap - seqOf(3)));
    addRun(runs, 'short', batch, seqOf(1), Math.min(8, cap - seqOf(1)));
  }
  const sweep = sweepOf(p, cap, capReason, notes);
  // Over a cache (a free past), each length is a few query tokens after the rest cached; else the whole prompt.
  for (const t of sweep) {
    const r = sweepShape(p, t);
    addRun(runs, 'sweep', r.batch, r.seq, r.past);
  }
  const query = cacheQuery(p);
  if (sweep.length && p.seqFree && query !== undefined) notes.push(`the model takes a KV cache: each length of the sweep is ${query} query tokens after the rest cached`);
  return { runs, sweep, notes, cap, capReason };
}

/**
 * The retrofit run over a cache: `seq` tokens after top − seq cached. Where the sweep runs top keys too, its run
 * takes this shape instead of being run again (its last rows are at n = top either way, and a run over the longest
 * caches costs the most: 0.75 s a session for the 12-layer × 768 decoder at 32768 keys), where the sweep has two
 * other lengths. It becomes the retrofit's run, as a separate one would be: the sharpness curve leaves it out (fused
 * attention's probabilities exposed for one query token over a cache read NaN in GPT-2's com.microsoft Attention
 * exports), liveness reads it as any run.
 */
function overCache(plan: Plan, batch: number, seq: number, top: number): string {
  const sweeps = plan.runs.filter((r) => r.kind === 'sweep');
  const sweep = sweeps.find((r) => r.batch === batch && !r.padded && r.seq + r.past === top);
  // The sharpness curve needs two lengths besides it.
  if (!sweep || sweeps.length < 3) return addRun(plan.runs, 'retrofit', batch, seq, top - seq);
  // The same shape already (a model whose inputs fix its tokens): one run, read by both as before.
  if (sweep.seq === seq) return sweep.id;
  plan.notes.push(`length ${top} runs ${seq === 1 ? 'one query token' : `${seq} query tokens`} after ${top - seq} cached: the retrofit's run, its last row at n = ${top}`);
  Object.assign(sweep, { seq, past: top - seq, kind: 'retrofit' });
  sweep.id = runId(sweep);
  return sweep.id;
}

/** A run's name in reports and notes: `batch=2 seq=3 past=7 padded`. */
export function runId({ batch, seq, past, padded }: RunShape & { padded?: boolean }): string {
  return `batch=${batch} seq=${seq}${past ? ` past=${past}` : ''}${padded ? ' padded' : ''}`;
}

/** Adds a run unless `runs` has one of the same id; returns the id. */
function addRun(runs: RunSpec[], kind: RunSpec['kind'], batch: number, seq: number, past: number, padded = false): string {
  const id = runId({ batch, seq, past, padded });
  if (!runs.some((r) => r.id === id)) runs.push({ id, kind, batch, seq, past, padded });
  return id;
}

/** The context lengths of the sweep: of the sequence, or of the cache when only it can grow. */
function sweepOf(p: PlanInput, cap: number, capReason: string, notes: string[]): number[] {
  if (!p.seqFree && !p.pastFree) {
    notes.push(p.pinned.seq !== undefined
      ? `sequence length fixed at ${p.pinned.seq} (by a given dim or input): no length sweep`
      : "the model's inputs have no dynamic sequence axis: no length sweep");
    return [];
  }
  const fixed = p.seqFree ? 0 : p.pinned.seq ?? p.fixedSeq ?? 1;
  if (!p.seqFree) notes.push(`the sequence length is fixed at ${fixed}: the sweep grows the cache instead`);
  const query = cacheQuery(p);
  const wanted = p.lengths ?? defaultSweep(p.trainLen);
  // A run over a cache has at least one query token after the cached ones it must have.
  const least = (p.seqFree && query !== undefined ? 1 : fixed) + (p.minPast ?? 0);
  const sweep = wanted.filter((t) => t <= cap && t >= least);
  const dropped = wanted.filter((t) => t > cap);
  if (dropped.length) notes.push(`lengths ${dropped.join(', ')} not run: capped at ${cap} (${capReason})`);
  // The default sweep doubles past L; where the cap falls between L and 2L, the longest length it allows runs
  // instead of none beyond L (from 1.25·L, where the factor s·ln n differs from 1 by a share checks can see).
  if (!p.lengths && dropped.length && cap >= 1.25 * p.trainLen && !sweep.some((t) => t > p.trainLen)) {
    sweep.push(cap);
    notes.push(`length ${cap}, the longest the cap allows, run beyond L instead`);
  }
  const short = wanted.filter((t) => t < least);
  const tokens = p.seqFree ? 'a query token' : `the fixed ${fixed} tokens`;
  if (short.length && p.lengths) notes.push(`lengths ${short.join(', ')} not run: every run has at least ${least} keys (${tokens}${p.minPast ? ` after ${p.minPast} cached` : ''})`);
  if (sweep.length >= 2 || p.seqFree) return sweep;
  // Fixed tokens beyond the lengths asked for: the cache grows on top of them, by L, 4L and 16L.
  const grown = [least, ...[1, 4, 16].map((k) => least + k * p.trainLen)].filter((t) => t <= cap);
  if (grown.length >= 2) notes.push(`the sweep grows the cache from ${least} keys: lengths ${grown.join(', ')}`);
  return grown.length >= 2 ? grown : sweep;
}

/**
 * The runs where rows can have a factor of 1 (n in [from, upTo]), added to the plan when missing: the whole
 * sequence at length upTo (capped), and one new token after upTo − 1 cached ones. Which of their rows do have
 * that n is seen at run time, per site. Returns the run ids, or why no run can get there.
 */
export function retrofitRuns(plan: Plan, identity: { from: number; upTo: number },
  o: Pick<PlanInput, 'seqFree' | 'pastFree' | 'pinned' | 'batch' | 'minPast'>): string[] | string {
  const ids: string[] = [];
  const top = Math.min(identity.upTo, plan.cap);
  if (top < identity.from) return `n = ${identity.from} is beyond the longest runnable length ${plan.cap} (${plan.capReason})`;
  // Over a cache, one token after top − 1 cached ones puts its row at n = top: no whole prompt of top tokens.
  if ((o.seqFree || o.pinned.seq === top) && !o.minPast && !o.pastFree) ids.push(addRun(plan.runs, 'retrofit', o.batch, top, 0));
  const seq = o.pinned.seq ?? 1;
  if (o.pastFree && seq < top) ids.push(overCache(plan, o.batch, seq, top));
  // More fixed tokens than L: causal rows still count up through L, and where the cache can grow, a cache of L
  // keys is what cross attention over it sees (which rows do have n = L is seen at run time, per site).
  if (!ids.length && !o.seqFree && seq > top) {
    ids.push(addRun(plan.runs, 'retrofit', o.batch, seq, o.pastFree ? o.minPast ?? 0 : 0));
    if (o.pastFree && top > (o.minPast ?? 0)) ids.push(addRun(plan.runs, 'retrofit', o.batch, seq, top));
  }
  return ids.length ? ids : `no run reaches n = ${top}: ${plan.notes[0] ?? 'the sequence length cannot vary'}`;
}
