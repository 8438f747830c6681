/**
 * Attention sharpness: over the sweep, the patched model's largest attention probability (mean over the last
 * rows of every site it can read) must fall less than the original's. Sites whose probabilities no output shows
 * are listed.
 */
import { CheckId, RunSpec } from '../plan';
import { CheckResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { isUniform, layerMeans, MIN_KEPT, NO_FADE, sharpnessCurve, SharpnessCurve, sharpnessPoint, SharpnessPoint } from '../sharpness';
import { opt } from '../../errors';
import { longerAdvice } from '../../analysis/reach';
import { check, skippedCheck } from './common';
import { liftedVerdicts, withLifted } from './lifted';
import { CheckUnit, Outcome, UnitContext } from './unit';

export class SharpnessCheck implements CheckUnit {
  readonly id: CheckId = 'sharpness';
  private readonly points: SharpnessPoint[] = [];
  curve?: SharpnessCurve;

  constructor(private readonly ctx: UnitContext) {}

  readonly criterion = `from the shortest to the longest length the patched model keeps at least ${Math.round((Math.exp(MIN_KEPT) - 1) * 100)} % more of its mean largest attention probability than the original`;

  sessions(run: RunSpec): SessionKey[] {
    return run.kind === 'sweep' ? ['original', 'patched'] : [];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void {
    const rows = this.ctx.factory.rowMax;
    if (key !== 'patched' || 'error' in outcome || !original || !rows.original || !rows.patched) return;
    const seen = [...rows.patched.outputs.keys()].filter((i) => rows.original!.outputs.has(i));
    const means = (out: Outputs, names: Map<number, string>): number[] =>
      layerMeans(new Map(seen.map((i) => [i, out[names.get(i)!]])), run.seq, run.past);
    const point = sharpnessPoint(this.ctx.setup.keysOf(run), means(original, rows.original.outputs), means(outcome.outputs, rows.patched.outputs));
    // An original with no finite attention (a run whose rows see no key: a cross-attention cache left empty) has no sharpness to keep.
    if (Number.isFinite(point.original)) this.points.push(point);
  }

  judge(): CheckResult {
    const { setup, factory } = this.ctx;
    if (setup.preset.kind === 'none') {
      return skippedCheck('sharpness', this.criterion, 'the none preset adds no factor (a prior, a window or a rescaled RoPE), which promises no sharper attention at long lengths (the probe checks what it adds)', 'not applicable');
    }
    // A site counts where both models show its probabilities: the original's operator may hide what the patch's kernel shows.
    const { original, patched } = factory.rowMax;
    const hidden = setup.sites.map((_, i) => i).filter((i) => !patched?.outputs.has(i) || !original?.outputs.has(i));
    // Sites this model cannot bring out are judged on their graph run on its own (lift.ts).
    const verdicts = liftedVerdicts(this.ctx.lifted, 'sharpness', hidden);
    const lifted = new Set(verdicts.flatMap((v) => v.sites).filter((i) => hidden.includes(i)));
    const reasons = (m: Map<number, string> | undefined): string[] => [...(m ?? [])].filter(([i]) => !lifted.has(i)).map(([, u]) => u);
    const unseen = [...new Set([...reasons(patched?.unseen), ...reasons(original?.unseen).map((u) => `${u} (the original)`)])];
    const own = lifted.size === setup.sites.length ? null : this.verdict(unseen);
    if (own && unseen.length && own.status !== 'SKIPPED') own.unchecked = unseen;
    return verdicts.length ? withLifted('sharpness', this.criterion, own, verdicts) : own!;
  }

  private verdict(unseen: string[]): CheckResult {
    const { setup, factory } = this.ctx;
    const { original, patched } = factory.rowMax;
    const bound = setup.bound;
    if (this.points.length < 2 && bound && (bound.kind === 'fixed' || (bound.longest ?? 0) <= setup.liveFrom)) {
      const what = bound.kind === 'fixed' ? `the model runs at one length only (${bound.why})` : `no length beyond ${bound.longest} (${bound.why})`;
      return skippedCheck('sharpness', this.criterion, `${what}: no curve over lengths beyond L can exist; ${longerAdvice(bound, 'to check it')}`, 'not applicable');
    }
    if (![...(patched?.outputs.keys() ?? [])].some((i) => original?.outputs.has(i))) {
      return skippedCheck('sharpness', this.criterion, unseen.length ? `no site shows its attention probabilities (${unseen[0]})` : 'no run reached the sweep');
    }
    const broken = this.points.find((x) => !Number.isFinite(x.patched) && Number.isFinite(x.original));
    if (broken) {
      return check('sharpness', 'FAILED', `the patched model's attention probabilities are not finite at ${broken.length} (NaN or Inf where the original's are finite): the factor overflows or divides by zero`, this.criterion);
    }
    if (this.points.length < 2) return skippedCheck('sharpness', this.criterion, `needs two or more lengths (${this.ctx.notes[0] ?? `ran ${this.points.length}`})`);
    const curve = sharpnessCurve(setup.L, this.points);
    // Reported (and plotted) even when no length reaches where the factor must show: the curves are still what ran.
    this.curve = curve;
    const first = curve.points[0], last = curve.points[curve.points.length - 1];
    if (last.length <= setup.liveFrom && setup.bound?.longest !== undefined && setup.bound.longest <= setup.liveFrom) {
      return skippedCheck('sharpness', this.criterion, `no attention row of this model can see more than ${setup.bound.longest} keys (${setup.bound.why}), never beyond L = ${setup.liveFrom}; ${longerAdvice(setup.bound, 'to check it')}`, 'not applicable');
    }
    if (last.length <= setup.liveFrom) {
      return skippedCheck('sharpness', this.criterion, `no length beyond ${setup.liveFrom} ran (${this.ctx.notes[0] ?? `give ${opt('lengths')} beyond L`})`);
    }
    const p = (x: number): string => x.toPrecision(3);
    const keeps = (fall: number): string => `keeps ${Math.round(Math.exp(-fall) * 100)} %`;
    const text = `mean max attention probability ${first.length} → ${last.length}: original ${p(first.original)} → ${p(last.original)} (${keeps(curve.originalFall)}), patched ${p(first.patched)} → ${p(last.patched)} (${keeps(curve.patchedFall)})`;
    if (curve.points.every((x) => isUniform(x.original, x.length))) {
      return skippedCheck('sharpness', this.criterion, `${text}: the original's attention is uniform at every length (largest probability about 1/n: logits near 0), so no factor can sharpen it`, 'not applicable');
    }
    if (-curve.originalFall >= Math.log(NO_FADE)) {
      return skippedCheck('sharpness', this.criterion, `${text}: the original does not fade over these lengths, so there is nothing for SSMax to keep`, 'not applicable');
    }
    if (curve.kept >= MIN_KEPT) return check('sharpness', 'PASSED', `${text}: ${p(Math.exp(curve.kept))}× the original's retention`, this.criterion);
    return check('sharpness', 'FAILED', `${text}: the patched model fades like the original`, this.criterion);
  }
}
