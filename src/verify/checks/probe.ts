/**
 * The semantic probe as a check: on the short runs, every site's tensors before and after its factor (brought
 * out of whichever graph holds it) against the preset's formula, site by site (probe.ts). A site that cannot be
 * seen is listed with the reason; a site whose tensors are not where the journal says fails.
 */
import { DataType } from '../../io/onnx';
import { factorValue, Preset } from '../../policy/factor';
import { priorValue } from '../../policy/prior';
import { CheckId, RunSpec } from '../plan';
import { fmt, ProbeSiteResult, ProbeSubject, ProbeView, SiteProbe } from '../probe';
import { ProbeOutputs, ProbeWiring } from '../probe-model';
import { CheckResult } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { VerifySite } from '../sites';
import { priorView, siteViews, Unchanged, windowView } from '../views';
import { RopeProbe } from '../rope-probe';
import { windowHidden, windowKeeps, WindowSpec } from '../../policy/window';
import { check, e2, skippedCheck } from './common';
import { CheckUnit, Outcome, UnitContext } from './unit';

/** The preset's formula as the probe's lines write it. */
export function formulaText(p: Preset): string {
  if (p.kind === 'qwen-logn') return 'max(1, s·ln n)';
  if (p.kind === 'slope') return `(1 + s·max(0, ln n − ln ${p.trainLen}))`;
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
    layer: site.record.layer, scope: site.record.scope, label: `${site.label} prior`, n: site.record.n, s: [1],
    additive: { kind: 'prior', expected: 'c·B', from: 'θ as the model holds it' },
    prior: (v, g, i, j) => factorValue(preset, s[v.head(g) % s.length], v.n(g, i)) * priorValue(theta, v.head(g) % theta.alpha.length, j - v.pos!(g, i)),
  };
}

/** How the probe copy's window differs from the model's, in the report's words; undefined where it is the model's. */
function windowCut(spec: WindowSpec, model: WindowSpec): string | undefined {
  return spec.size !== model.size || spec.sinks !== model.sinks ? `W = ${spec.size}, S = ${spec.sinks} for the model's W = ${model.size}, S = ${model.sinks}` : undefined;
}

/** The window's probe: after its Add = before it + its bias, 0 on the keys it keeps and windowHidden on the others. */
function windowSubject(site: VerifySite, w: ProbeOutputs['window'] & object): ProbeSubject {
  const hidden = windowHidden(w.type), spec = w.spec;
  const model = site.window!;
  const copy = windowCut(spec, model) ? ` (the probe copy's; the model has W = ${model.size}, S = ${model.sinks})` : '';
  return {
    layer: site.record.layer, scope: site.record.scope, label: `${site.label} window`, n: site.record.n, s: [1],
    additive: { kind: 'window', expected: 'its bias', from: `W = ${spec.size}, S = ${spec.sinks}${copy}` },
    prior: (v, g, i, j) => (windowKeeps(spec, v.pos!(g, i), j) ? 0 : hidden),
  };
}

/** Keys of a view the window hides from rows that could see them (the causal mask does not hide them already). */
function hiddenKeys(v: ProbeView, spec: WindowSpec): number {
  let count = 0;
  for (let g = 0; g < v.blocks; g++) {
    for (let i = 0; i < v.rows; i++) {
      const p = v.pos!(g, i);
      for (let j = 0; j <= Math.min(p, v.cols - 1); j++) if (!windowKeeps(spec, p, j)) count++;
    }
  }
  return count;
}

/**
 * A factor that is 1 up to some n (qwen-logn and slope up to L, llama4 below floor_scale) is 1 on every row of
 * the short runs when that n is beyond them: its formula past the flat part would go unprobed. The shortest
 * sweep run beyond it is probed too, on the last rows (the last-row probe copy, small at any length).
 */
function beyondFlat(setup: UnitContext['setup']): string | undefined {
  const flat = setup.identity && setup.identity.from === 1 ? setup.identity.upTo : 0;
  const short = Math.max(0, ...setup.plan.runs.filter((r) => r.kind === 'short').map((r) => r.seq + r.past));
  if (flat < short) return undefined;
  return setup.plan.runs.find((r) => r.kind === 'sweep' && r.seq + r.past > flat)?.id;
}

function subject(site: VerifySite): ProbeSubject {
  return { layer: site.record.layer, scope: site.record.scope, label: site.label, n: site.record.n, s: site.s.length ? site.s : [NaN] };
}

export class ProbeCheck implements CheckUnit {
  readonly id: CheckId = 'probe';
  private readonly probes: SiteProbe[];
  /** Per site with a positional prior: the probe of the prior's Add, after = before + c·B. */
  private readonly priorProbes: (SiteProbe | undefined)[];
  /** Per site with a sliding window: the probe of its Add (made at the first run, which gives the bias's type). */
  private readonly windowProbes: (SiteProbe | undefined)[] = [];
  /** Keys the windows hid from rows that could see them, over every run: a window probe that saw none looked at nothing. */
  private windowHidden = 0;
  /** The rescaled RoPE of the record, if any (rope-probe.ts). */
  private readonly rope?: RopeProbe;
  /** The windows the probe copy ran cut shorter than the model's, as the report says them. */
  private readonly windowCuts = new Set<string>();
  private readonly problems = new Map<number, string>();
  private readonly unprobed = new Map<number, string>();
  private readonly runIds: string[] = [];
  /** The shortest sweep run beyond a flat factor's end, probed on its last rows (see beyondFlat). */
  private readonly beyond?: string;
  /** Sites the last-row probe copy cannot show on that run: their formula past the flat part is unchecked. */
  private readonly beyondUnseen = new Map<number, string>();

  constructor(private readonly ctx: UnitContext) {
    const sites = ctx.setup.sites;
    this.beyond = beyondFlat(ctx.setup);
    const others = sites.map((s) => ({ layer: s.record.layer, s: s.s }));
    this.probes = sites.map((site) => new SiteProbe(subject(site), ctx.setup.preset, others));
    this.priorProbes = sites.map((site) => (site.theta && site.tensors?.prior ? new SiteProbe(priorSubject(site, ctx.setup.preset), NO_FACTOR) : undefined));
    const rope = ctx.setup.record.rope;
    if (rope) this.rope = new RopeProbe(rope, rope.sites, ctx.setup.graph);
  }

  get criterion(): string {
    const sites = this.ctx.setup.sites;
    const prior = sites.some((s) => s.theta) ? '; after each positional prior\'s Add = before it + c·B, B from θ as the model holds it, every head, row and key' : '';
    const window = sites.some((s) => s.window) ? '; after each sliding window\'s Add = before it + its bias (0 on the last W keys and the first S, far below any logit on the others), in a copy with W cut below the probe runs\' lengths' : '';
    const rope = this.ctx.setup.record.rope ? '; RoPE\'s rescaled frequencies = the method\'s formula on the original constant, and (YaRN) every Cos and Sin its readers read × 0.1·ln(scale) + 1' : '';
    return `after each factor = ${formulaText(this.ctx.setup.preset)}·before it, every batch item, head and row, with s as the model holds it${prior}${window}${rope}`;
  }

  sessions(run: RunSpec): SessionKey[] {
    return run.kind === 'short' ? ['probe'] : run.id === this.beyond ? ['probeLast'] : [];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome): void {
    if (key !== 'probe' && key !== 'probeLast') return;
    if ('error' in outcome) {
      this.ctx.setup.sites.forEach((_, i) => this.problems.set(i, `the patched model fails on ${run.id}: ${outcome.error}`));
      return;
    }
    const last = key === 'probeLast';
    this.runIds.push(last ? `${run.id}, last row` : run.id);
    if (!last) this.rope?.observe(this.ctx.factory.rope, outcome.outputs, run.id);
    const wirings = this.ctx.factory.probes[key] ?? [];
    this.ctx.setup.sites.forEach((site, i) => this.observeSite(run, site, i, wirings[i], outcome.outputs, last));
  }

  private observeSite(run: RunSpec, site: VerifySite, i: number, w: ProbeWiring | undefined, out: Outputs, last = false): void {
    if (!w) return;
    if (last && ('problem' in w || 'unprobed' in w)) {
      this.beyondUnseen.set(i, `${site.label}: its factor beyond ${this.ctx.setup.identity!.text} not probed (${'problem' in w ? w.problem : w.unprobed})`);
      return;
    }
    if ('problem' in w) { this.problems.set(i, w.problem); return; }
    if ('unprobed' in w) { this.unprobed.set(i, w.unprobed); return; }
    const probe = this.probes[i];
    probe.setTolerance(tolerances(w.type));
    const before = out[w.before], after = out[w.after];
    if (!before || !after) { this.problems.set(i, `${site.label}: the probe outputs were not produced (${run.id})`); return; }
    if (before.data.length === 0 && after.data.length === 0) return; // an If branch this run did not take
    const prior = this.priorProbes[i];
    if (prior && w.prior && !last) {
      prior.setTolerance(tolerances(w.prior.type));
      const v = priorView(site, w, out, run);
      if (typeof v === 'string') prior.fail(v);
      else prior.observe(v);
    }
    if (w.window && !last) this.observeWindow(site, i, w, out, run);
    if (site.s.length === 0) return; // the none preset: a prior or a window, and no factor
    const views = siteViews(site, w, out, run, last);
    if (typeof views === 'string') { probe.fail(views); return; }
    for (const v of views.views) probe.observe(v);
    if (!last) for (const u of views.unchanged) this.checkUnchanged(probe, u, tolerances(w.type).rtol, run);
  }

  private observeWindow(site: VerifySite, i: number, w: ProbeOutputs, out: Outputs, run: RunSpec): void {
    const probe = (this.windowProbes[i] ??= new SiteProbe(windowSubject(site, w.window!), NO_FACTOR));
    probe.setTolerance(tolerances(w.window!.type));
    const v = windowView(site, w, out, run);
    if (typeof v === 'string') { probe.fail(v); return; }
    probe.observe(v);
    this.windowHidden += hiddenKeys(v, w.window!.spec);
    const cut = windowCut(w.window!.spec, site.window!);
    if (cut) this.windowCuts.add(cut);
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
      const lifted = why ? this.ctx.lifted?.probes.get(i) : undefined;
      if (lifted && typeof lifted !== 'string' && !problem) { results.push(lifted); return; }
      if (why && !problem) { unprobed.push(typeof lifted === 'string' ? `${p.label}: ${lifted}` : why); return; }
      const site = this.ctx.setup.sites[i];
      const notRun = this.runIds.length ? 'the graph holding it never ran on the synthesised inputs (an If branch not taken)' : 'no run';
      for (const probe of [site.s.length ? p : undefined, this.priorProbes[i], this.windowProbes[i]]) {
        if (!probe) continue;
        if (problem) probe.fail(problem.replace(/^[^:]*: /, ''));
        const r = probe.result();
        if (r.runs === 0 && !problem) unprobed.push(`${probe.label}: ${notRun}`);
        else results.push(r);
      }
      if (site.theta && !this.priorProbes[i]) unprobed.push(`${p.label}: its prior is inside the nodes its operator was expanded into, which the probe does not read`);
      if (site.window && !this.windowProbes[i] && !problem) unprobed.push(`${p.label} window: ${notRun}`);
    });
    return { results, unprobed };
  }

  judge(): CheckResult {
    const { results, unprobed } = this.results();
    unprobed.push(...(this.rope?.notProbed ?? []));
    const failed = results.filter((s) => !s.passed);
    const ropeFailure = this.rope?.failure;
    const rope = this.rope ? `; ${this.rope.summary()}` : '';
    let result: CheckResult;
    if (failed.length) {
      result = check('probe', 'FAILED', `${failed[0].message}${failed.length > 1 ? ` (${failed.length} of ${results.length} sites fail)` : ''}`, this.criterion);
    } else if (ropeFailure) {
      result = check('probe', 'FAILED', ropeFailure, this.criterion);
    } else if (results.length === 0 && this.rope && !this.rope.notProbed.length && this.runIds.length) {
      result = check('probe', 'PASSED', this.rope.summary(), this.criterion);
    } else if (results.length === 0) {
      result = skippedCheck('probe', this.criterion, `no site could be probed: ${unprobed[0] ?? 'no sites'}`);
    } else {
      const entries = results.reduce((a, s) => a + s.entries, 0);
      const ids = this.runIds;
      const left = unprobed.length ? `; ${unprobed.length} site(s) not probed: ${unprobed[0]}${unprobed.length > 1 ? ', …' : ''}` : '';
      const priors = results.filter((r) => r.prior).length, windows = results.filter((r) => r.window).length;
      const factors = results.length - priors - windows;
      const nanRows = results.reduce((a, r) => a + (r.rowsWithoutN ?? 0), 0);
      const nan = nanRows ? `; ${nanRows} row(s) not probed: the original's logits there hold NaN or +Inf (its attention row is NaN, on these inputs)` : '';
      const what = [factors ? `after = ${formulaText(this.ctx.setup.preset)}·before at all ${factors} site(s)` : '', priors ? `after = before + c·B at ${priors} prior(s)` : '',
        windows ? `after = before + its bias at ${windows} window(s), which hid ${this.windowHidden} key(s) from rows that could see them${this.windowCuts.size ? ` (in a copy with ${[...this.windowCuts].join('; ')})` : ''}` : ''].filter(Boolean).join(', ');
      result = check('probe', 'PASSED', `${what}, ${entries} values in ${ids.length} run(s) (${ids.join('; ')}); max error ${e2(Math.max(...results.map((s) => s.maxScaledError)))} of a row's largest value${rope}${nan}${left}`, this.criterion);
    }
    result.sites = results;
    // A window that hid nothing in the runs probed only that it hides nothing there: --strict must not pass it.
    const windows = this.windowProbes.some(Boolean) && this.windowHidden === 0 ? ['the sliding windows hid no key in the probe runs, so what they hide is not probed'] : [];
    const unchecked = [...unprobed, ...[...this.beyondUnseen].filter(([i]) => !this.unprobed.has(i)).map(([, why]) => why), ...windows];
    if (unchecked.length) result.unchecked = unchecked;
    return result;
  }
}
