/**
 * Liveness: beyond where the factor is 1, the patched model's outputs differ from the original's by more than
 * the float noise of the factor-1 model, and no output is NaN or Inf where the original's is finite, in any run.
 */
import { CheckId, RunSpec } from '../plan';
import { CheckResult, RunResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { isUniform, layerMeans } from '../sharpness';
import { aliveRuns, LivenessData, livenessCheck, skippedCheck } from './common';
import { CheckUnit, compareRun, Outcome, UnitContext } from './unit';

export class LivenessCheck implements CheckUnit {
  readonly id: CheckId = 'liveness';
  private readonly data: LivenessData;

  constructor(private readonly ctx: UnitContext) {
    const { setup } = ctx;
    const p = setup.preset;
    const beyond = p.kind === 'llama4' ? `floor_scale − 1 = ${p.floorScale - 1}` : p.kind === 'none' ? 'one token (the none preset: the prior alone)' : `L = ${setup.liveFrom}`;
    this.data = { longRuns: [], saturated: new Set(), finiteRuns: 0, nonFinite: [], errors: [], beyond };
  }

  readonly criterion = 'beyond where the factor is 1 some output differs from the original\'s by more than 10× the factor-1 float noise and 1e-6 of its scale; no NaN or Inf where the original is finite';

  sessions(run: RunSpec): SessionKey[] {
    if (run.kind === 'short') return this.ctx.setup.checks.has('probe') ? ['original', 'probe'] : [];
    return ['original', 'patched'];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void {
    if ((key !== 'patched' && key !== 'probe') || !original) return;
    if ('error' in outcome) {
      if (key === 'patched') this.data.errors.push(`${run.id}: the patched model fails where the original runs: ${outcome.error}`);
      return;
    }
    const r = compareRun(this.ctx.setup, run, outcome.outputs, original);
    this.data.finiteRuns++;
    for (const o of r.outputs.filter((x) => x.newNonFinite > 0)) {
      this.data.nonFinite.push(`${run.id}: ${o.name} has ${o.newNonFinite} NaN/Inf values where the original's are finite`);
    }
    if (key === 'patched' && run.seq + run.past > this.ctx.setup.liveFrom) {
      this.data.longRuns.push(r);
      if (this.saturated(run, original)) this.data.saturated.add(run.id);
    }
  }

  /**
   * The original's attention is saturated (mean largest probability ≥ 0.99) or uniform (≤ 1.25/n: logits near
   * 0, as in small random models): no factor can change its outputs.
   */
  private saturated(run: RunSpec, original: Outputs): boolean {
    const rowMax = this.ctx.factory.rowMax.original?.outputs;
    if (!rowMax?.size) return false;
    const means = layerMeans(new Map([...rowMax].map(([i, name]) => [i, original[name]])), run.seq);
    const mean = means.reduce((a, b) => a + b, 0) / means.length;
    return means.length > 0 && (mean >= 0.99 || isUniform(mean, run.seq + run.past));
  }

  judge(done: ReadonlyMap<CheckId, CheckResult>): CheckResult {
    const { setup } = this.ctx;
    if (setup.integerOutputs) {
      return skippedCheck('liveness', this.criterion, 'every output is an integer (token ids, say): a factor that works may change none of them, so equal outputs prove nothing', 'not applicable');
    }
    if (setup.preset.kind === 'none' && setup.sites.every((s) => s.theta?.beta.every((b) => b === 0))) {
      return skippedCheck('liveness', this.criterion, 'a neutral prior (θβ = 0 at every head) without a factor changes nothing by design: fine-tune θ, then verify again', 'not applicable');
    }
    // The float noise of a patch that must equal the original: runs that did (a failed run is no noise).
    const noise: RunResult[] = [...(done.get('wiring')?.runs ?? []), ...(done.get('retrofit')?.runs ?? [])].filter((r) => r.passed);
    return livenessCheck(this.criterion, { ...this.data, longRuns: aliveRuns(this.data.longRuns, noise) });
  }
}
