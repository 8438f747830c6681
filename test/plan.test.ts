/** The default plan's longest length: DEFAULT_MAX_LEN, lowered so one attention matrix stays within the budget. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { makePlan, PlanInput } from '../src/verify/plan';
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

  it('counts a pinned batch, and leaves lengths or a longest length asked for alone', () => {
    assert.deepEqual(makePlan(input({ heads: 4, pinned: { batch: 4 } })).sweep, [128, 256, 512, 1024, 2048]);
    assert.deepEqual(makePlan(input({ heads: 12, lengths: [4096] })).sweep, [4096]);
    assert.deepEqual(makePlan(input({ heads: 12, maxLen: 8192 })).sweep, [128, 256, 512, 1024, 2048, 4096, 8192]);
  });
});
