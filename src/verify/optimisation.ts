/**
 * onnxruntime's extended graph optimisations can change an original model's own outputs: its fused
 * SkipLayerNormalization, say, computes the variance in one pass, which cancels on activations far from 0 with a
 * small spread, and the patched model, fused otherwise around its factors, then differs from the original by more
 * than the tolerance although the patch is exact. Where a parity check fails, the original runs once at 'basic'
 * and once at 'all' on the failing run: outputs that differ there are the optimiser's doing, and the whole
 * verification is made again with every model at 'basic', with a note.
 */
import { feedsFor } from './execute';
import { CheckResult } from './report';
import { Outputs } from './run';
import { SessionFactory } from './sessions';
import { Setup } from './setup';
import { describeStatsOf } from './checks/common';
import { compareRun } from './checks/unit';

/** A parity check that failed on outputs (not on an error): the run to try the optimisation levels on. */
export function failedParityRun(setup: Setup, checks: CheckResult[]): string | undefined {
  for (const c of checks) {
    if ((c.id !== 'wiring' && c.id !== 'retrofit') || c.status !== 'FAILED') continue;
    const run = c.runs.find((r) => !r.passed && !r.error);
    if (run && setup.plan.runs.some((r) => r.id === run.run)) return run.run;
  }
  return undefined;
}

/** Why the original's outputs on this run depend on the optimisation level, or null when they do not. */
export async function optimisationChanges(setup: Setup, factory: SessionFactory, runId: string): Promise<string | null> {
  const run = setup.plan.runs.find((r) => r.id === runId)!;
  const feeds = feedsFor(setup, run);
  const outputs: Partial<Record<'basic' | 'all', Outputs>> = {};
  for (const level of ['basic', 'all'] as const) {
    try {
      const runner = await factory.openOriginal(level);
      try {
        outputs[level] = await runner.run(feeds);
      } finally {
        await runner.release();
      }
    } catch {
      // An original that does not run at one level says nothing about the patch: the failure stands.
      return null;
    }
  }
  const compared = compareRun(setup, run, outputs.all!, outputs.basic!);
  if (compared.passed) return null;
  return `onnxruntime's graph optimisations change the original's own outputs (at 'all' against 'basic': ${describeStatsOf([compared], setup.tolerance)}), `
    + 'so every model was compared at the \'basic\' optimisation level';
}
