/**
 * The semantic probe as a check: on the short runs, every site's tensors before and after its factor (brought
 * out of whichever graph holds it) against the preset's formula, site by site (probe.ts). A site that cannot be
 * seen is listed with the reason; a site whose tensors are not where the journal says fails.
 */
import { DataType } from '../../io/onnx';
import { Preset } from '../../policy/factor';
import { CheckId, RunSpec } from '../plan';
import { fmt, ProbeSiteResult, SiteProbe } from '../probe';
import { ProbeWiring } from '../probe-model';
import { CheckResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { VerifySite } from '../sites';
import { siteViews, Unchanged } from '../views';
import { opt } from '../../errors';
import { check, e2, skippedCheck } from './common';
import { CheckUnit, Outcome, UnitContext } from './unit';

/** The preset's formula as the probe's lines write it. */
export function formulaText(p: Preset): string {
  if (p.kind === 'qwen-logn') return 'max(1, s·ln n)';
  if (p.kind === 'llama4') return `(ln(⌊n/${p.floorScale}⌋ + 1)·s + 1)`;
  return p.b !== undefined ? `(s·ln n + ${p.b})` : 's·ln(n)';
}

/**
 * Rounding of one value of the observed type: the probe reads what the factor's Mul wrote against what it read
 * (logits, or a query), one rounding apart (float32 1e-5 of the value, with 1e-6 of the row's largest value for
 * entries near 0; float16 1e-3; bfloat16 8e-3).
 */
function tolerances(type: number | undefined): { rtol: number; rowEps: number } {
  if (type === DataType.FLOAT16) return { rtol: 1e-3, rowEps: 1e-3 };
  if (type === DataType.BFLOAT16) return { rtol: 8e-3, rowEps: 8e-3 };
  return { rtol: 1e-5, rowEps: 1e-6 };
}

/** A probe over one set of runs, reading one probe copy's outputs. */
export class Prober {
  readonly probes: SiteProbe[];
  private readonly problems = new Map<number, string>();
  private readonly unprobed = new Map<number, string>();
  readonly runIds: string[] = [];

  constructor(private readonly ctx: UnitContext, private readonly key: 'probe' | 'probeLast') {
    const sites = ctx.setup.sites;
    const others = sites.map((s) => ({ layer: s.record.layer, s: s.s }));
    this.probes = sites.map((site) => new SiteProbe(subject(site), ctx.setup.preset, others.filter((o) => o.layer !== site.record.layer)));
  }

  /** Feeds one run's outputs to every site; returns each site's views, for callers that look further. */
  observe(run: RunSpec, outcome: Outcome): void {
    if ('error' in outcome) {
      this.ctx.setup.sites.forEach((_, i) => this.problems.set(i, `the patched model fails on ${run.id}: ${outcome.error}`));
      return;
    }
    this.runIds.push(run.id);
    const wirings = this.ctx.factory.probes[this.key] ?? [];
    this.ctx.setup.sites.forEach((site, i) => this.observeSite(run, site, i, wirings[i], outcome.outputs));
  }

  private observeSite(run: RunSpec, site: VerifySite, i: number, w: ProbeWiring | undefined, out: Outputs): void {
    if (!w) return;
    if ('problem' in w) { this.problems.set(i, w.problem); return; }
    if ('unprobed' in w) { this.unprobed.set(i, w.unprobed); return; }
    const probe = this.probes[i];
    probe.setTolerance(tolerances(w.type));
    const before = out[w.before], after = out[w.after];
    if (!before || !after) { this.problems.set(i, `${site.label}: the probe outputs were not produced (${run.id})`); return; }
    if (before.data.length === 0 && after.data.length === 0) return; // an If branch this run did not take
    const views = siteViews(site, w, out, run, this.key === 'probeLast');
    if (typeof views === 'string') { probe.fail(views); return; }
    for (const v of views.views) probe.observe(v);
    for (const u of views.unchanged) this.checkUnchanged(probe, u, tolerances(w.type).rtol, run);
  }

  private checkUnchanged(probe: SiteProbe, u: Unchanged, rtol: number, run: RunSpec): void {
    let worst = 0;
    for (let k = 0; k < u.before.length; k++) {
      const d = Math.abs(u.after[k] - u.before[k]);
      if (!(d <= rtol * Math.abs(u.before[k]) + 1e-30)) worst = Math.max(worst, Number.isNaN(d) ? Infinity : d);
    }
    if (worst > 0) probe.fail(`${u.what} changed (max abs difference ${fmt(worst)}, ${run.id}): the factor must scale the query only`);
  }

  /** Per site: the result, or why it could not be seen. */
  results(): { results: ProbeSiteResult[]; unprobed: string[] } {
    const results: ProbeSiteResult[] = [];
    const unprobed: string[] = [];
    this.probes.forEach((p, i) => {
      const problem = this.problems.get(i);
      if (problem) p.fail(problem.replace(/^[^:]*: /, ''));
      const why = this.unprobed.get(i);
      const lifted = why ? this.ctx.lifted?.get(i) : undefined;
      if (lifted && typeof lifted !== 'string' && !problem) { results.push(lifted); return; }
      if (why && !problem) { unprobed.push(typeof lifted === 'string' ? `${p.label}: ${lifted}` : why); return; }
      const r = p.result();
      if (r.runs === 0 && !problem) { unprobed.push(`${p.label}: ${this.runIds.length ? 'the graph holding it never ran on the synthesised inputs (an If branch not taken)' : 'no run'}`); return; }
      results.push(r);
    });
    return { results, unprobed };
  }
}

function subject(site: VerifySite): ConstructorParameters<typeof SiteProbe>[0] {
  return { layer: site.record.layer, scope: site.record.scope, label: site.label, n: site.record.n, s: site.s.length ? site.s : [NaN], rtol: 1e-5 };
}

export class ProbeCheck implements CheckUnit {
  readonly id: CheckId = 'probe';
  private readonly prober: Prober;

  constructor(private readonly ctx: UnitContext) {
    this.prober = new Prober(ctx, 'probe');
  }

  private get criterion(): string {
    return `after each factor = ${formulaText(this.ctx.setup.preset)}·before it, every batch item, head and row, with s as the model holds it`;
  }

  sessions(run: RunSpec): SessionKey[] {
    return this.ctx.setup.checks.has('probe') && run.kind === 'short' ? ['probe'] : [];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome): void {
    if (key === 'probe') this.prober.observe(run, outcome);
  }

  judge(): CheckResult {
    if (!this.ctx.setup.checks.has('probe')) return skippedCheck('probe', this.criterion, `not selected (${opt('checks')})`, 'not selected');
    const { results, unprobed } = this.prober.results();
    const failed = results.filter((s) => !s.passed);
    let result: CheckResult;
    if (failed.length) {
      result = check('probe', 'FAILED', `${failed[0].message}${failed.length > 1 ? ` (${failed.length} of ${results.length} sites fail)` : ''}`, this.criterion);
    } else if (results.length === 0) {
      result = skippedCheck('probe', this.criterion, `no site could be probed: ${unprobed[0] ?? 'no sites'}`);
    } else {
      const entries = results.reduce((a, s) => a + s.entries, 0);
      const ids = this.prober.runIds;
      const left = unprobed.length ? `; ${unprobed.length} site(s) not probed: ${unprobed[0]}${unprobed.length > 1 ? ', …' : ''}` : '';
      result = check('probe', 'PASSED', `after = ${formulaText(this.ctx.setup.preset)}·before at all ${results.length} site(s), ${entries} values in ${ids.length} run(s) (${ids.join('; ')}); max rel error ${e2(Math.max(...results.map((s) => s.maxRelError)))}${left}`, this.criterion);
    }
    result.sites = results;
    if (unprobed.length) result.unchecked = unprobed;
    return result;
  }
}
