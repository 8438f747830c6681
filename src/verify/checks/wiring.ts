/**
 * Wiring parity: the patched model with every factor forced to 1 reproduces the original, on the short runs
 * and at length L. Anything the patch changed besides inserting its factors shows here.
 */
import { CheckId, RunSpec } from '../plan';
import { CheckResult, RunResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { parityCheck } from './common';
import { CheckUnit, compareRun, failedRun, Outcome, UnitContext } from './unit';

export class WiringCheck implements CheckUnit {
  readonly id: CheckId = 'wiring';
  private readonly runs: RunResult[] = [];

  constructor(private readonly ctx: UnitContext) {}

  get criterion(): string {
    const t = this.ctx.setup.tolerance;
    return `with the factor forced to 1, every output equals the original's (atol ${t.atol}, rtol ${t.rtol})`;
  }

  sessions(run: RunSpec): SessionKey[] {
    const atL = run.kind !== 'short' && run.past === 0 && run.seq === this.ctx.setup.L;
    return run.kind === 'short' || atL ? ['original', 'unit'] : [];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void {
    if (key !== 'unit') return;
    if ('error' in outcome) this.runs.push(failedRun(run, `the factor-1 model fails: ${outcome.error}`));
    else if (original) this.runs.push(compareRun(this.ctx.setup, run, outcome.outputs, original));
  }

  judge(): CheckResult {
    return parityCheck('wiring', this.criterion, this.runs, this.ctx.setup.tolerance, 'the factor-1 model equals the original');
  }
}
