/**
 * Liveness: beyond where the factor is 1, the patched model's outputs differ from the original's by more than
 * the float noise of the factor-1 model, and no output is NaN or Inf where the original's is finite, in any run.
 */
import { CheckId, RunSpec } from '../plan';
import { CheckResult, RunResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { isTied, isUniform, layerMeans } from '../sharpness';
import { opt } from '../../errors';
import { longerAdvice } from '../../analysis/reach';
import { aliveRuns, check, e2, skippedCheck } from './common';
import { CheckUnit, compareRun, Outcome, sweepEnd, UnitContext } from './unit';

export class LivenessCheck implements CheckUnit {
  readonly id: CheckId = 'liveness';
  private readonly longRuns: RunResult[] = [];
  /** Long runs where no factor can change the outputs (see saturated). */
  private readonly saturatedRuns = new Set<string>();
  private finiteRuns = 0;
  /** Runs where the original's own outputs hold NaN or Inf (the patched may match them there). */
  private readonly originalNonFinite = new Set<string>();
  private readonly nonFinite: string[] = [];
  private readonly errors: string[] = [];
  /** Where the factor must show: `L = 64`, `n ≥ floor_scale = 8192`. */
  private readonly beyond: string;

  constructor(private readonly ctx: UnitContext) {
    const { setup } = ctx;
    const p = setup.preset;
    this.beyond = p.kind === 'llama4' ? `floor_scale − 1 = ${p.floorScale - 1}` : p.kind === 'none' ? (setup.liveFrom > 1 ? `W + S = ${setup.liveFrom} keys (the none preset: a window alone hides nothing up to there)` : `one token (the none preset: the ${setup.record.rope ? 'rescaled RoPE' : 'prior'} alone)`) : `L = ${setup.liveFrom}`;
  }

  readonly criterion = 'beyond where the factor is 1 some output differs from the original\'s by more than 10× the factor-1 float noise and 1e-6 of its scale; no NaN or Inf where the original is finite';

  sessions(run: RunSpec): SessionKey[] {
    if (run.kind === 'short') return this.ctx.setup.checks.has('probe') ? ['original', 'probe'] : [];
    return ['original', 'patched'];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void {
    if ((key !== 'patched' && key !== 'probe') || !original) return;
    if ('error' in outcome) {
      if (key === 'patched') this.errors.push(`${run.id}: the patched model fails where the original runs: ${outcome.error}`);
      return;
    }
    const r = compareRun(this.ctx.setup, run, outcome.outputs, original);
    this.finiteRuns++;
    if (r.outputs.some((x) => x.expectedNonFinite > 0)) this.originalNonFinite.add(run.id);
    for (const o of r.outputs.filter((x) => x.newNonFinite > 0)) {
      this.nonFinite.push(`${run.id}: ${o.name} has ${o.newNonFinite} NaN/Inf values where the original's are finite`);
    }
    // A short run past L counts too: a model fixed at one length beyond L has no other.
    if (this.ctx.setup.keysOf(run) > this.ctx.setup.liveFrom && (key === 'patched' || run.kind === 'short')) {
      this.longRuns.push(r);
      if (this.saturated(run, original, key === 'patched' ? outcome.outputs : undefined)) this.saturatedRuns.add(run.id);
    }
  }

  /**
   * No factor can change the outputs of this run: the original's attention is tied (every sampled row spread evenly
   * over keys whose logits tie: isTied), or saturated (mean largest probability ≥ 0.99) or uniform (≤ 1.25/n: logits
   * near 0, as in small random models) while the patched model's row maxima moved. A live factor moves even such
   * rows a little, a dead one leaves them bit-equal: without that reading a dead factor on a uniform model would
   * pass as "not applicable".
   */
  private saturated(run: RunSpec, original: Outputs, patched: Outputs | undefined): boolean {
    const { original: ours, patched: theirs } = this.ctx.factory.rowMax;
    if (!ours?.outputs.size) return false;
    const rows = new Map([...ours.outputs].map(([i, name]) => [i, original[name]]));
    if (isTied([...rows.values()].filter((t) => t !== undefined))) return true;
    const means = layerMeans(rows, run.seq, run.past);
    const mean = means.reduce((a, b) => a + b, 0) / means.length;
    const flat = means.length > 0 && (mean >= 0.99 || isUniform(mean, run.seq + run.past));
    return flat && (!patched || !theirs || attentionMoved(ours.outputs, theirs.outputs, original, patched));
  }

  judge(done: ReadonlyMap<CheckId, CheckResult>): CheckResult {
    const { setup } = this.ctx;
    if (setup.integerOutputs) {
      return skippedCheck('liveness', this.criterion, 'every output is an integer (token ids, say): a factor that works may change none of them, so equal outputs prove nothing', 'not applicable');
    }
    if (setup.preset.kind === 'none' && !setup.record.rope && setup.sites.every((s) => s.theta?.beta.every((b) => b === 0))) {
      return skippedCheck('liveness', this.criterion, 'a neutral prior (θβ = 0 at every head) without a factor changes nothing by design: fine-tune θ, then verify again', 'not applicable');
    }
    // The float noise of a patch that must equal the original: runs that did (a failed run is no noise).
    const noise: RunResult[] = [...(done.get('wiring')?.runs ?? []), ...(done.get('retrofit')?.runs ?? [])].filter((r) => r.passed);
    const longRuns = aliveRuns(this.longRuns, noise);
    if (this.errors.length) return check('liveness', 'FAILED', this.errors[0], this.criterion, longRuns);
    if (this.nonFinite.length) return check('liveness', 'FAILED', this.nonFinite[0], this.criterion, longRuns);
    const own = [...this.originalNonFinite];
    const finite = own.length
      ? `outputs finite wherever the original's are in ${this.finiteRuns} run(s) (the original's own outputs hold NaN or Inf in ${own.length}: ${own.join('; ')})`
      : `all outputs finite in ${this.finiteRuns} run(s)`;
    const bound = setup.bound;
    if (longRuns.length === 0 && bound?.longest !== undefined && bound.longest <= setup.liveFrom) {
      return skippedCheck('liveness', this.criterion, `no attention row of this model can see more than ${bound.longest} keys (${bound.why}), never beyond ${this.beyond}; ${longerAdvice(bound, 'to check SSMax beyond L')} (${finite})`, 'not applicable');
    }
    if (longRuns.length === 0 && bound?.kind === 'fixed' && !setup.seqFree && !setup.pastFree) {
      return skippedCheck('liveness', this.criterion, `the model's inputs fix every length (${bound.why}) and its one run is not beyond ${this.beyond}; re-export it with dynamic axes to check SSMax beyond L (${finite})`, 'not applicable');
    }
    if (longRuns.length === 0) return skippedCheck('liveness', this.criterion, `no run longer than ${this.beyond} (${finite}); ${noLongRun(this.ctx)}`);
    const dead = longRuns.find((r) => !r.passed && !this.saturatedRuns.has(r.run));
    if (dead) return check('liveness', 'FAILED', `${dead.run}: outputs equal the original's within tolerance: the factor has no effect beyond ${this.beyond}`, this.criterion, longRuns);
    const alive = longRuns.filter((r) => r.passed);
    if (alive.length === 0) {
      return skippedCheck('liveness', this.criterion, `the original's attention is saturated, uniform or tied at every length beyond ${this.beyond} (mean largest probability ≥ 0.99, about 1/n, or 1/m in every row: each row spread evenly over m equal keys): no factor can change the outputs (${finite})`, 'not applicable', longRuns);
    }
    const longest = alive[alive.length - 1];
    const o = longest.outputs.reduce((a, b) => (b.maxAbsFinite > a.maxAbsFinite ? b : a));
    return check('liveness', 'PASSED', `outputs differ from the original's at ${alive.map((r) => r.length.seq + r.length.past).join(', ')} (> ${this.beyond}; ${o.name} max abs ${e2(o.maxAbsFinite)} at ${longest.length.seq + longest.length.past}); ${finite}`, this.criterion, longRuns);
  }
}

/**
 * Some row maximum of some site differs between the patched run and the original's by more than float noise:
 * 1e-3 of the smaller of p and 1 − p (a saturated row moves in its runner-up mass), and 1e-6.
 */
function attentionMoved(ours: ReadonlyMap<number, string>, theirs: ReadonlyMap<number, string>, original: Outputs, patched: Outputs): boolean {
  for (const [site, name] of ours) {
    const [a, b] = [original[name]?.data, patched[theirs.get(site) ?? '']?.data];
    if (!a || !b || a.length !== b.length) continue;
    for (let i = 0; i < a.length; i++) if (Math.abs(a[i] - b[i]) > 1e-6 + 1e-3 * Math.min(a[i], 1 - a[i])) return true;
  }
  return false;
}

/** What to do when no run went beyond L although the model can: the cap that stopped the plan, or the lengths asked for. */
function noLongRun({ setup, notes }: UnitContext): string {
  const { plan } = setup;
  // The original itself failing at the first length beyond L ended the sweep there: that, not a longer cap, is why.
  const failed = sweepEnd(notes);
  if (failed) return failed;
  if (setup.bound) return `the model can run no longer than ${setup.bound.longest ?? '?'} (${setup.bound.why})`;
  if (plan.cap <= setup.liveFrom) return `the runs are capped at ${plan.cap} (${plan.capReason})`;
  if (!plan.sweep.length && notes[0]) return notes[0];
  return `give ${opt('lengths')} beyond L to check`;
}
