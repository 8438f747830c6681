/**
 * Which runs verification makes: short runs (batch 2: plain, a padded batch, KV-cache prefill and decoding with
 * past > 0) for wiring and the probe, and a sweep of context lengths L/4 … 16·L (batch 1) for retrofit parity,
 * liveness and sharpness, capped by the model's position table, by --max-len, and by what the inputs allow.
 */
import { LengthLimit } from './limits';
import { RunShape } from './signature';

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
}

export interface Plan {
  runs: RunSpec[];
  sweep: number[];
  notes: string[];
  /** The longest total length (past + sequence) any run may have, and why. */
  cap: number;
  capReason: string;
}

export const SHORT_SEQ = 12;

/**
 * Longest run by default. One 4096-token run of a 100 M-parameter model takes about 10 s on two cores and the
 * attention matrices grow with the square of the length, so longer runs are opt-in.
 */
export const DEFAULT_MAX_LEN = 4096;

export function defaultSweep(L: number): number[] {
  const raw = [L / 4, L / 2, L, 2 * L, 4 * L, 8 * L, 16 * L].map((x) => Math.max(2, Math.round(x)));
  return [...new Set(raw)].sort((a, b) => a - b);
}

export function makePlan(p: PlanInput): Plan {
  const notes: string[] = [];
  const maxLen = p.maxLen ?? DEFAULT_MAX_LEN;
  const cap = Math.min(maxLen, p.limit?.length ?? Infinity);
  const capReason = p.limit && p.limit.length <= maxLen ? p.limit.reason
    : p.maxLen === undefined ? `the default longest length ${DEFAULT_MAX_LEN}; raise it to run longer` : `the longest length ${maxLen} asked for`;
  const batch = p.pinned.batch ?? p.batch;
  const seqOf = (want: number): number => p.pinned.seq ?? want;
  const pastOf = (want: number): number => p.pinned.past ?? want;
  const runs: RunSpec[] = [];
  const add = (kind: RunSpec['kind'], b: number, seq: number, past: number, padded = false): void => {
    const id = `batch=${b} seq=${seq}${past ? ` past=${past}` : ''}${padded ? ' padded' : ''}`;
    if (!runs.some((r) => r.id === id)) runs.push({ id, kind, batch: b, seq, past, padded });
  };
  const short = seqOf(Math.max(2, Math.min(SHORT_SEQ, cap)));
  add('short', batch, short, pastOf(0));
  if (p.canPad && batch >= 2 && short >= 2) add('short', batch, short, pastOf(0), true);
  if (p.pastFree && cap >= 5) {
    // Prefill after a cache (Tq = 3 < Tk) and one-token decoding, within the cap.
    add('short', batch, seqOf(3), Math.min(7, cap - seqOf(3)));
    add('short', batch, seqOf(1), Math.min(8, cap - seqOf(1)));
  }
  let sweep: number[] = [];
  if (!p.seqFree) {
    notes.push(p.pinned.seq !== undefined
      ? `sequence length fixed at ${p.pinned.seq} (by a given dim or input): no length sweep`
      : "the model's inputs have no dynamic sequence axis: no length sweep");
  } else {
    const wanted = p.lengths ?? defaultSweep(p.trainLen);
    sweep = wanted.filter((t) => t <= cap);
    const dropped = wanted.filter((t) => t > cap);
    if (dropped.length) notes.push(`lengths ${dropped.join(', ')} not run: capped at ${cap} (${capReason})`);
    for (const t of sweep) add('sweep', p.pinned.batch ?? 1, t, pastOf(0));
  }
  return { runs, sweep, notes, cap, capReason };
}

export interface RetrofitInput {
  seqFree: boolean;
  pastFree: boolean;
  pinned: Partial<RunShape>;
  batch: number;
}

/**
 * The runs where every row has n = L, added to the plan when missing: keys mode at Tk = L (the full sequence,
 * and new tokens after L − seq cached ones); causal mode only with a KV cache, one token after L − 1.
 * Returns the run ids, or why no run can reach n = L.
 */
export function retrofitRuns(plan: Plan, mode: 'keys' | 'causal', L: number, o: RetrofitInput): string[] | string {
  const ids: string[] = [];
  const want = (seq: number, past: number): void => {
    const id = `batch=${o.batch} seq=${seq}${past ? ` past=${past}` : ''}`;
    if (!plan.runs.some((r) => r.id === id)) plan.runs.push({ id, kind: 'retrofit', batch: o.batch, seq, past, padded: false });
    ids.push(id);
  };
  if (mode === 'causal') {
    if (!o.pastFree) return 'causal n without a KV cache: no length puts every row at n = L (patch with n mode keys to check)';
    if ((o.pinned.seq ?? 1) !== 1) return `causal n needs one new token after L − 1 cached ones; the sequence length is fixed at ${o.pinned.seq}`;
    want(1, L - 1);
    return ids;
  }
  if (o.seqFree || o.pinned.seq === L) want(L, 0);
  const seq = o.pinned.seq ?? 4;
  if (o.pastFree && seq < L) want(seq, L - seq);
  return ids.length ? ids : `no run reaches Tk = L = ${L}: ${plan.notes[0] ?? 'the sequence length cannot vary'}`;
}
