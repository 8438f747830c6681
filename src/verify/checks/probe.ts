/**
 * The semantic probe as a check: on the short runs, every site's tensors before and after its factor (brought
 * out of whichever graph holds it) against the preset's formula, site by site (probe.ts). A site that cannot be
 * seen is listed with the reason; a site whose tensors are not where the journal says fails.
 */
import { DataType } from '../../io/onnx';
import { factorValue, Preset } from '../../policy/factor';
import { priorValue } from '../../policy/prior';
import { CheckId, RunSpec } from '../plan';
import { fmt, ProbeSiteResult, ProbeSubject, SiteProbe } from '../probe';
import { ProbeWiring } from '../probe-model';
import { CheckResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { VerifySite } from '../sites';
import { priorView, siteViews, Unchanged } from '../views';
import { check, e2, skippedCheck } from './common';
import { CheckUnit, Outcome, UnitContext } from './unit';

/** The preset's formula as the probe's lines write it. */
export function formulaText(p: Preset): string {
  if (p.kind === 'qwen-logn') return 'max(1, s·ln n)';
  if (p.kind === 'llama4') return `(ln(⌊n/${p.floorScale}⌋ + 1)·s + 1)`;
  if (p.kind === 'none') return '1';
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

const NO_FACTOR: Preset = { kind: 'none' };

/** The prior's probe: after its Add = before it + c·B, with c from the preset and B from θ as the model holds them. */
function priorSubject(site: VerifySite, preset: Preset): ProbeSubject {
  const theta = site.theta!;
  const s = site.s.length ? site.s : [1];
  return {
    layer: site.record.layer, scope: site.record.scope, label: `${site.label} prior`, n: site.record.n, s: [1], additive: true,
    prior: (v, g, i, j) => factorValue(preset, s[v.head(g) % s.length], v.n(g, i)) * priorValue(theta, v.head(g) % theta.alpha.length, j - v.pos!(g, i)),
  };
}

function subject(site: VerifySite): ProbeSubject {
  return { layer: site.record.layer, scope: site.record.scope, label: site.label, n: site.record.n, s: site.s.length ? site.s : [NaN] };
}

export class ProbeCheck implements CheckUnit {
  readonly id: CheckId = 'probe';
  private readonly probes: SiteProbe[];
  /** Per site with a positional prior: the probe of the prior's Add, after = before + c·B. */
  private readonly priorProbes: (SiteProbe | undefined)[];
  private readonly problems = new Map<number, string>();
  private readonly unprobed = new Map<number, string>();
  private readonly runIds: string[] = [];

  constructor(private readonly ctx: UnitContext) {
    const sites = ctx.setup.sites;
    const others = sites.map((s) => ({ layer: s.record.layer, s: s.s }));
    this.probes = sites.map((site) => new SiteProbe(subject(site), ctx.setup.preset, others));
    this.priorProbes = sites.map((site) => (site.theta && site.tensors?.prior ? new SiteProbe(priorSubject(site, ctx.setup.preset), NO_FACTOR) : undefined));
  }

  get criterion(): string {
    const prior = this.ctx.setup.sites.some((s) => s.theta) ? '; after each positional prior\'s Add = before it + c·B, B from θ as the model holds it, every head, row and key' : '';
    return `after each factor = ${formulaText(this.ctx.setup.preset)}·before it, every batch item, head and row, with s as the model holds it${prior}`;
  }

  sessions(run: RunSpec): SessionKey[] {
    return run.kind === 'short' ? ['probe'] : [];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome): void {
    if (key !== 'probe') return;
    if ('error' in outcome) {
      this.ctx.setup.sites.forEach((_, i) => this.problems.set(i, `the patched model fails on ${run.id}: ${outcome.error}`));
      return;
    }
    this.runIds.push(run.id);
    const wirings = this.ctx.factory.probes.probe ?? [];
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
    const prior = this.priorProbes[i];
    if (prior && w.prior) {
      prior.setTolerance(tolerances(w.prior.type));
      const v = priorView(site, w, out, run);
      if (typeof v === 'string') prior.fail(v);
      else prior.observe(v);
    }
    if (site.s.length === 0) return; // the none preset: a prior and no factor
    const views = siteViews(site, w, out, run, false);
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
  private results(): { results: ProbeSiteResult[]; unprobed: string[] } {
    const results: ProbeSiteResult[] = [];
    const unprobed: string[] = [];
    this.probes.forEach((p, i) => {
      const problem = this.problems.get(i);
      const why = this.unprobed.get(i);
      const lifted = why ? this.ctx.lifted?.get(i) : undefined;
      if (lifted && typeof lifted !== 'string' && !problem) { results.push(lifted); return; }
      if (why && !problem) { unprobed.push(typeof lifted === 'string' ? `${p.label}: ${lifted}` : why); return; }
      const site = this.ctx.setup.sites[i];
      const notRun = this.runIds.length ? 'the graph holding it never ran on the synthesised inputs (an If branch not taken)' : 'no run';
      for (const probe of [site.s.length ? p : undefined, this.priorProbes[i]]) {
        if (!probe) continue;
        if (problem) probe.fail(problem.replace(/^[^:]*: /, ''));
        const r = probe.result();
        if (r.runs === 0 && !problem) unprobed.push(`${probe.label}: ${notRun}`);
        else results.push(r);
      }
      if (site.theta && !this.priorProbes[i]) unprobed.push(`${p.label}: its prior is inside the nodes its operator was expanded into, which the probe does not read`);
    });
    return { results, unprobed };
  }

  judge(): CheckResult {
    const { results, unprobed } = this.results();
    const failed = results.filter((s) => !s.passed);
    let result: CheckResult;
    if (failed.length) {
      result = check('probe', 'FAILED', `${failed[0].message}${failed.length > 1 ? ` (${failed.length} of ${results.length} sites fail)` : ''}`, this.criterion);
    } else if (results.length === 0) {
      result = skippedCheck('probe', this.criterion, `no site could be probed: ${unprobed[0] ?? 'no sites'}`);
    } else {
      const entries = results.reduce((a, s) => a + s.entries, 0);
      const ids = this.runIds;
      const left = unprobed.length ? `; ${unprobed.length} site(s) not probed: ${unprobed[0]}${unprobed.length > 1 ? ', …' : ''}` : '';
      const priors = results.filter((r) => r.prior).length;
      const what = `${priors < results.length ? `after = ${formulaText(this.ctx.setup.preset)}·before at all ${results.length - priors} site(s)` : ''}${priors && priors < results.length ? ', ' : ''}${priors ? `after = before + c·B at ${priors} prior(s)` : ''}`;
      result = check('probe', 'PASSED', `${what}, ${entries} values in ${ids.length} run(s) (${ids.join('; ')}); max rel error ${e2(Math.max(...results.map((s) => s.maxRelError)))}${left}`, this.criterion);
    }
    result.sites = results;
    if (unprobed.length) result.unchecked = unprobed;
    return result;
  }
}
