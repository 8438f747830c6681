/**
 * Wiring parity: the patched model with every factor forced to 1 reproduces the original, on the short runs
 * and at length L. Anything the patch changed besides inserting its factors shows here. Where the other checks
 * read a plain-op form of a patch written with fused operators, the model as written must also compute what that
 * form computes at its real factor, on the first run past L: a fused operator that bypassed the factor, or read
 * anything else than the plain form does, would pass every check of the plain form.
 */
import { CheckId, RunSpec } from '../plan';
import { CheckResult, RunResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { describeStatsOf, parityCheck } from './common';
import { CheckUnit, compareRun, failedRun, Outcome, UnitContext } from './unit';

export class WiringCheck implements CheckUnit {
  readonly id: CheckId = 'wiring';
  private readonly runs: RunResult[] = [];
  /** The run past L where the patch as written is compared with its plain-op form, and what each gave. */
  private readonly written?: string;
  private plain?: Outcome;
  private writtenResult?: RunResult;

  constructor(private readonly ctx: UnitContext) {
    const { setup } = ctx;
    if (ctx.factory.fusedForm) this.written = setup.plan.runs.find((r) => r.kind !== 'short' && setup.keysOf(r) > setup.liveFrom)?.id;
  }

  get criterion(): string {
    const t = this.ctx.setup.tolerance;
    const written = this.written ? '; the patch as written (fused operators) computes what its plain-op form computes, on the first run past L' : '';
    return `with the factor forced to 1, every output equals the original's (atol ${t.atol}, rtol ${t.rtol})${written}`;
  }

  sessions(run: RunSpec): SessionKey[] {
    const atL = run.kind !== 'short' && run.past === 0 && run.seq === this.ctx.setup.L;
    const unit: SessionKey[] = run.kind === 'short' || atL ? ['original', 'unit'] : [];
    return run.id === this.written ? [...unit, 'patched', 'written'] : unit;
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void {
    if (key === 'patched') this.plain = outcome;
    if (key === 'written') this.compareWritten(run, outcome);
    if (key !== 'unit') return;
    if ('error' in outcome) this.runs.push(failedRun(run, `the factor-1 model fails: ${outcome.error}`));
    else if (original) this.runs.push(compareRun(this.ctx.setup, run, outcome.outputs, original));
  }

  /** The patch as written against its plain-op form on the same run (the plain form's outputs are dropped then). */
  private compareWritten(run: RunSpec, outcome: Outcome): void {
    const plain = this.plain;
    this.plain = undefined;
    if (!plain || 'error' in plain) return;
    this.writtenResult = 'error' in outcome ? failedRun(run, `the patch as written fails where its plain-op form runs: ${outcome.error}`)
      : compareRun(this.ctx.setup, run, outcome.outputs, plain.outputs);
  }

  judge(): CheckResult {
    const result = parityCheck('wiring', this.criterion, this.runs, this.ctx.setup.tolerance, 'the factor-1 model equals the original');
    const w = this.writtenResult;
    if (!w || result.status === 'FAILED') return result;
    const tol = this.ctx.setup.tolerance;
    if (w.error || !w.passed) {
      const why = w.error ?? `differs at ${describeStatsOf([w], tol)}`;
      return { ...result, status: 'FAILED', summary: `the patch as written (fused operators) does not compute what its plain-op form computes past L: ${why}` };
    }
    return { ...result, summary: `${result.summary}; the patch as written (fused) equals its plain-op form past L: ${describeStatsOf([w], tol)}` };
  }
}
