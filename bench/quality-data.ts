/**
 * The evaluation sets of the quality benchmark: the retrieval task of fixtures/quality/train.py, generated here
 * from a seed so that the benchmark needs no Python and every run sees the same examples.
 *
 * A sequence of n tokens ends with QUERIES query tokens, each naming a key; the answer to each is the value of
 * the one record holding that key earlier in the sequence (chance 1/VALUES). A record token holds a key and a
 * value, NOISE + key·VALUES + value; a query token is NOISE + KEYS·VALUES + key. QUERIES of the KEYS keys are
 * asked, each once, in random order; their records stand at random positions before the queries, and
 *   - sparse ('records in noise'): every other token is noise (0 … NOISE−1);
 *   - dense: every other token is a record of one of the keys not asked, whose value is one of DECOYS values
 *     drawn for the sequence, so that attention leaking onto them adds up on a few wrong answers.
 */

export const TASK = { noise: 64, keys: 16, values: 64, queries: 8, decoys: 2, trainLen: 64 } as const;

export type Layout = 'sparse' | 'dense';

/** 1×–16× the training length. */
export const EVAL_LENGTHS = [64, 128, 256, 512, 1024];

export interface EvalSet {
  n: number;
  /** [count, n] token ids, row-major. */
  tokens: BigInt64Array;
  /** [count, QUERIES]: the answer to each query, a value in 0 … VALUES−1. */
  answers: Int32Array;
}

/** mulberry32: a small, fast 32-bit generator, plenty for drawing tokens; `below(k)` is uniform in 0 … k−1. */
function generator(seed: number): { below: (k: number) => number } {
  let a = seed >>> 0;
  const next = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
  return { below: (k) => Math.floor((next() / 2 ** 32) * k) };
}

type Rng = { below: (k: number) => number };

/** A random order of 0 … k−1 (Fisher–Yates). */
function shuffled(rng: Rng, k: number): number[] {
  const a = Array.from({ length: k }, (_, i) => i);
  for (let i = k - 1; i > 0; i--) {
    const j = rng.below(i + 1);
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

/** `k` distinct integers of 0 … range−1. */
function distinct(rng: Rng, k: number, range: number): number[] {
  const chosen = new Set<number>();
  while (chosen.size < k) chosen.add(rng.below(range));
  return [...chosen];
}

const record = (key: number, value: number): number => TASK.noise + key * TASK.values + value;
const query = (key: number): number => TASK.noise + TASK.keys * TASK.values + key;

/** Fills one row of n tokens and its QUERIES answers. */
function example(rng: Rng, layout: Layout, row: BigInt64Array, answers: Int32Array): void {
  const ctx = row.length - TASK.queries;
  const keys = shuffled(rng, TASK.keys);
  const asked = keys.slice(0, TASK.queries), others = keys.slice(TASK.queries);
  const values = asked.map(() => rng.below(TASK.values));
  const decoys = Array.from({ length: TASK.decoys }, () => rng.below(TASK.values));
  for (let i = 0; i < ctx; i++) {
    row[i] = BigInt(layout === 'dense' ? record(others[rng.below(others.length)], decoys[rng.below(TASK.decoys)]) : rng.below(TASK.noise));
  }
  distinct(rng, TASK.queries, ctx).forEach((p, q) => { row[p] = BigInt(record(asked[q], values[q])); });
  shuffled(rng, TASK.queries).forEach((q, i) => {
    row[ctx + i] = BigInt(query(asked[q]));
    answers[i] = values[q];
  });
}

/** `count` sequences of length n; the same (seed, layout, n, count) always gives the same set. */
export function evalSet(seed: number, layout: Layout, n: number, count: number): EvalSet {
  if (n < 2 * TASK.queries) throw new Error(`a sequence of ${n} tokens cannot hold ${TASK.queries} records and their queries`);
  const rng = generator((Math.imul(seed, 0x9e3779b1) ^ Math.imul(n, 0x85ebca6b) ^ (layout === 'dense' ? 0x27d4eb2f : 0)) >>> 0);
  const tokens = new BigInt64Array(count * n);
  const answers = new Int32Array(count * TASK.queries);
  for (let i = 0; i < count; i++) {
    example(rng, layout, tokens.subarray(i * n, (i + 1) * n), answers.subarray(i * TASK.queries, (i + 1) * TASK.queries));
  }
  return { n, tokens, answers };
}
