/** The default plan's longest length: DEFAULT_MAX_LEN, lowered so one attention matrix stays within the budget. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CACHE_QUERY, DEFAULT_CACHE_LEN, makePlan, PlanInput, retrofitRuns } from '../src/verify/plan';
import { render } from '../src/errors';

const input = (over: Partial<PlanInput>): PlanInput => ({
  trainLen: 512, batch: 2, limit: null, seqFree: true, pastFree: false, pinned: {}, canPad: false, ...over,
});

describe('the default longest length', () => {
  it('stops where one [12, T, T] matrix would pass 2^27 values, and says so', () => {
    const plan = makePlan(input({ heads: 12 }));
    assert.deepEqual(plan.sweep, [128, 256, 512, 1024, 2048]);
    assert.equal(plan.cap, 3344);
    assert.match(render(plan.notes.join('\n'), 'cli'), /lengths 4096, 8192 not run: capped at 3344 \(the default plan keeps one attention matrix \[12, T, T\] within 128 Mi values; --max-len N runs longer\)/);
  });

  it('keeps 4096 where few heads fit, and where the head count is unknown', () => {
    assert.deepEqual(makePlan(input({ heads: 4 })).sweep, [128, 256, 512, 1024, 2048, 4096]);
    assert.deepEqual(makePlan(input({})).sweep, [128, 256, 512, 1024, 2048, 4096]);
  });

  it('does not stretch past the budget to reach beyond L: the skipped check says what to raise', () => {
    const plan = makePlan(input({ heads: 64, trainLen: 2048 }));
    assert.deepEqual(plan.sweep, [512, 1024]);
    assert.match(plan.notes.join('\n'), /lengths 2048, 4096, 8192, 16384, 32768 not run: capped at 1448 \(the default plan keeps one attention matrix \[64, T, T\] within 128 Mi values;/);
  });

  it('runs the longest length a cap allows where it falls between 1.25·L and 2L, so a check beyond L has a run', () => {
    const between = makePlan(input({ trainLen: 4096, maxLen: 6000 }));
    assert.deepEqual(between.sweep, [1024, 2048, 4096, 6000]);
    assert.match(between.notes.join('\n'), /length 6000, the longest the cap allows, run beyond L instead/);
    assert.deepEqual(makePlan(input({ trainLen: 4096, maxLen: 5000 })).sweep, [1024, 2048, 4096], 'below 1.25·L the factor is too near 1 to check');
    assert.deepEqual(makePlan(input({ trainLen: 4096, maxLen: 6000, lengths: [4096, 8192] })).sweep, [4096], 'lengths asked for are kept as asked');
  });

  it('counts a pinned batch, and leaves lengths or a longest length asked for alone', () => {
    assert.deepEqual(makePlan(input({ heads: 4, pinned: { batch: 4 } })).sweep, [128, 256, 512, 1024, 2048]);
    assert.deepEqual(makePlan(input({ heads: 12, lengths: [4096] })).sweep, [4096]);
    assert.deepEqual(makePlan(input({ heads: 12, maxLen: 8192 })).sweep, [128, 256, 512, 1024, 2048, 4096, 8192]);
  });
});

describe('runs over a KV cache', () => {
  const cached = (over: Partial<PlanInput>): PlanInput => input({ pastFree: true, heads: 4, trainLen: 8192, ...over });

  it('sweeps 4 query tokens after t − 4 cached keys, up to 131072 keys by default', () => {
    const plan = makePlan(cached({}));
    assert.deepEqual(plan.sweep, [2048, 4096, 8192, 16384, 32768, 65536, 131072]);
    assert.equal(plan.cap, DEFAULT_CACHE_LEN);
    const sweep = plan.runs.filter((r) => r.kind === 'sweep');
    assert.equal(sweep.length, plan.sweep.length);
    sweep.forEach((r, i) => {
      assert.ok(r.seq <= CACHE_QUERY, r.id);
      assert.equal(r.seq + r.past, plan.sweep[i], r.id);
      assert.equal(r.batch, 1, r.id);
    });
    assert.match(plan.notes.join('\n'), /takes a KV cache: each length of the sweep is 4 query tokens after the rest cached/);
  });

  it('puts retrofit parity\'s one row at exactly n = L, with no whole prompt of L tokens', () => {
    const plan = makePlan(cached({}));
    const ids = retrofitRuns(plan, { from: 8192, upTo: 8192 }, { seqFree: true, pastFree: true, pinned: {}, batch: 1, minPast: 0 });
    assert.ok(Array.isArray(ids), String(ids));
    const runs = plan.runs.filter((r) => ids.includes(r.id));
    assert.deepEqual(runs.map((r) => [r.seq, r.past]), [[1, 8191]]);
    // Without a cache the same promise takes the whole prompt of L tokens.
    const whole = makePlan(input({ heads: 4, trainLen: 8192, maxLen: 8192 }));
    const wholeIds = retrofitRuns(whole, { from: 8192, upTo: 8192 }, { seqFree: true, pastFree: false, pinned: {}, batch: 1, minPast: 0 });
    assert.deepEqual(whole.runs.filter((r) => (wholeIds as string[]).includes(r.id)).map((r) => [r.seq, r.past]), [[8192, 0]]);
  });

  it('keeps one attention matrix [heads, query rows, T] within 2^27 values, and says so', () => {
    const plan = makePlan(cached({ heads: 1024 }));
    assert.equal(plan.cap, 2 ** 27 / (1024 * 4));
    assert.match(render(plan.notes.join('\n'), 'cli'), /capped at 32768 \(the default plan keeps one attention matrix \[1024, 4, T\] within 128 Mi values; --max-len N runs longer\)/);
    // The model's own fixed tokens are the query rows: 1,500 of them over a growing cache.
    const fixed = makePlan(cached({ seqFree: false, fixedSeq: 1500 }));
    assert.equal(fixed.cap, Math.floor(2 ** 27 / (4 * 1500)));
    for (const r of fixed.runs.filter((x) => x.kind === 'sweep')) assert.equal(r.seq, 1500, r.id);
    // Heads unknown: no memory estimate, so no longer than whole prompts.
    assert.equal(makePlan(cached({ heads: undefined })).cap, 4096);
  });

  it('the position table still caps the cache', () => {
    const plan = makePlan(cached({ limit: { length: 2048, reason: "position table 'wpe' has 2048 rows" } }));
    assert.deepEqual(plan.sweep, [2048]);
    assert.deepEqual(plan.runs.filter((r) => r.kind === 'sweep').map((r) => [r.seq, r.past]), [[4, 2044]]);
  });

  it('calibration\'s whole prompts stay whole prompts', () => {
    const plan = makePlan(cached({ wholePrompts: true, trainLen: 512 }));
    assert.equal(plan.cap, 4096);
    assert.deepEqual(plan.runs.filter((r) => r.kind === 'sweep').map((r) => [r.seq, r.past]), [[128, 0], [256, 0], [512, 0], [1024, 0], [2048, 0], [4096, 0]]);
  });
});
