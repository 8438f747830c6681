/**
 * Retrofit parity: where the preset promises a factor of 1 (ssmax with s = 1/ln L: n = L; qwen-logn, slope: n ≤ L;
 * llama4: n < floor_scale), the patch changes nothing.
 *   - Per site: from the model's own s, the factor at that n is 1 for every head; and at the rows of the retrofit
 *     runs whose n is there, the probe sees a factor of exactly 1 (after = before).
 *   - Whole model: in a run where every row of every site has such an n (one token after L − 1 cached ones, or
 *     the whole sequence at L in keys mode), every output equals the original's.
 * A site whose n never gets there (its key count is fixed by the model's inputs: cross attention over an
 * encoder's frames, say) is listed as not applicable; the whole-model comparison then does not apply either.
 */
import { longerAdvice } from '../../analysis/reach';
import { ropeText } from '../../policy/rope';
import { factorValue } from '../../policy/factor';
import { countsMasks, withMasksOfOnes } from '../../policy/n-mode';
import { CheckId, RunSpec } from '../plan';
import { fmt, ProbeView } from '../probe';
import { CheckResult, RunResult, SkipKind } from '../report';
import { Outputs } from '../run';
import { SessionKey } from '../sessions';
import { Identity, Setup } from '../setup';
import { readsLogits, VerifySite } from '../sites';
import { siteViews } from '../views';
import { check, describeStatsOf, skippedCheck } from './common';
import { liftedVerdicts, withLifted } from './lifted';
import { CheckUnit, compareRun, failedRun, Outcome, UnitContext } from './unit';

interface SiteSeen {
  rows: number;
  /** The smallest and largest n of any row, per run. */
  spans: Map<string, [number, number]>;
  failure?: string;
}

export class RetrofitCheck implements CheckUnit {
  readonly id: CheckId = 'retrofit';
  private readonly ids = new Set<string>();
  private readonly skip: { why: string; kind: SkipKind } | null = null;
  private readonly scaleFailures: string[] = [];
  private readonly seen: SiteSeen[];
  private readonly unseen = new Map<number, string>();
  /** Per run: why its outputs cannot be compared (null: they can). */
  private readonly whole = new Map<string, string | null>();
  private readonly runs: RunResult[] = [];

  constructor(private readonly ctx: UnitContext) {
    const setup = ctx.setup;
    this.seen = setup.sites.map(() => ({ rows: 0, spans: new Map() }));
    // Not selected, it is not judged, and adds no runs.
    if (!setup.checks.has('retrofit')) return;
    this.skip = this.plan(setup);
    if (!this.skip) this.checkScales(setup, setup.identity!);
  }

  get criterion(): string {
    const id = this.ctx.setup.identity;
    const t = this.ctx.setup.tolerance;
    return id ? `at ${id.text} every site's factor is 1 (from the model's s, and as the probe sees it), and where every row is there every output equals the original's (atol ${t.atol}, rtol ${t.rtol})`
      : 'where the preset promises a factor of 1, the patch changes nothing';
  }

  private plan(setup: Setup): { why: string; kind: SkipKind } | null {
    if (!setup.identity) return { why: noIdentity(setup), kind: 'not applicable' };
    const runs = setup.retrofitRuns!;
    const bound = setup.bound;
    if (typeof runs === 'string' && bound?.longest !== undefined && bound.longest < setup.identity.from) {
      return { why: `no attention row of this model can see ${setup.identity.text} keys: at most ${bound.longest} (${bound.why}); ${bound.kind === 'fixed' ? 're-export it with dynamic axes, or patch' : `${longerAdvice(bound, '')}; patch`} with --train-len ${bound.longest}`, kind: 'not applicable' };
    }
    if (typeof runs === 'string' && bound?.kind === 'fixed' && !setup.seqFree && !setup.pastFree) {
      return { why: `the model's inputs fix every length (${bound.why}) and no row of its one run is at ${setup.identity.text}; re-export it with dynamic axes`, kind: 'not applicable' };
    }
    if (typeof runs === 'string') return { why: runs, kind: 'not checked' };
    for (const id of runs) this.ids.add(id);
    return null;
  }

  /** From the model's own s: the factor at the promised n is 1 for every head of every site. */
  private checkScales(setup: Setup, identity: Identity): void {
    for (const site of setup.sites) {
      site.s.forEach((s, h) => {
        const c = factorValue(setup.preset, s, identity.upTo);
        if (!(Math.abs(c - 1) <= 1e-5)) {
          this.scaleFailures.push(`${site.label}${site.s.length > 1 ? ` head ${h}` : ''}: the factor at ${identity.text} is ${fmt(c)}, not 1 (s = ${fmt(s)} in the model): s is not what a retrofit for this length needs`);
        }
      });
    }
  }

  sessions(run: RunSpec): SessionKey[] {
    return this.ids.has(run.id) ? ['probeLast', 'original', 'patched'] : [];
  }

  observe(run: RunSpec, key: SessionKey, outcome: Outcome, original: Outputs | undefined): void {
    if (key === 'probeLast') this.observeProbe(run, outcome);
    if (key !== 'patched' || !original) return;
    if (this.whole.get(run.id) !== null) return;
    this.runs.push('error' in outcome ? failedRun(run, `the patched model fails: ${outcome.error}`) : compareRun(this.ctx.setup, run, outcome.outputs, original));
  }

  private observeProbe(run: RunSpec, outcome: Outcome): void {
    if ('error' in outcome) {
      this.whole.set(run.id, `the patched model with probe outputs fails: ${outcome.error}`);
      return;
    }
    const { setup, factory } = this.ctx;
    const wirings = factory.probes.probeLast ?? [];
    let blocked: string | null = null;
    setup.sites.forEach((site, i) => {
      const w = wirings[i];
      if (!w || 'problem' in w || 'unprobed' in w) {
        const why = !w ? `${site.label}: not wired` : 'problem' in w ? w.problem : w.unprobed;
        // Not seen: the outputs count only where the run's shape puts every row of the site at n = L.
        this.unseen.set(i, why);
        if (!atIdentityByShape(site, run, setup.identity!)) blocked ??= `${site.label} cannot be seen, and ${run.id} has rows away from ${setup.identity!.text}`;
        return;
      }
      const out = outcome.outputs;
      const before = out[w.before], after = out[w.after];
      if (!before || !after || before.data.length === 0) return;
      const view = siteViews(site, w, out, run, true);
      if (typeof view === 'string') {
        this.seen[i].failure ??= `${site.label}: ${view}`;
        return;
      }
      for (const v of view.views) this.observeView(i, site, v, run);
      const span = this.seen[i].spans.get(run.id);
      const id = setup.identity!;
      if (span && (span[0] < id.from || span[1] > id.upTo)) blocked ??= `${site.label} has rows at n = ${span[0] === span[1] ? span[0] : `${span[0]} … ${span[1]}`}`;
    });
    this.whole.set(run.id, blocked);
  }

  /** Rows whose n is where the factor must be 1: after = before. Notes the span of n over all rows of the run. */
  private observeView(i: number, site: VerifySite, v: ProbeView, run: RunSpec): void {
    const id = this.ctx.setup.identity!;
    const seen = this.seen[i];
    let lo = Infinity, hi = -Infinity;
    for (let g = 0; g < v.blocks; g++) for (let r = 0; r < v.rows; r++) {
      const n = v.n(g, r);
      lo = Math.min(lo, n);
      hi = Math.max(hi, n);
      if (n < id.from || n > id.upTo) continue;
      seen.rows++;
      const at = (g * v.rows + r) * v.cols;
      let top = 0;
      for (let j = 0; j < v.cols; j++) if (Number.isFinite(v.before[at + j])) top = Math.max(top, Math.abs(v.before[at + j]));
      for (let j = 0; j < v.cols; j++) {
        const x = v.before[at + j], y = v.after[at + j];
        if (!Number.isFinite(x)) continue;
        if (!(Math.abs(y - x) <= 1e-5 * Math.abs(x) + 1e-7 * top + 1e-30)) {
          seen.failure ??= `${site.label} ${v.where(g, r)}: ratio ${fmt(y / x)} where the factor must be 1 (n = ${n}, ${id.text})`;
          break;
        }
      }
    }
    // A logits view of the last-row probe holds one row; a fused query view holds them all.
    if (v.rows > 0 && readsLogits(site)) [lo, hi] = otherRows(site, lo, hi, run);
    const old = seen.spans.get(run.id);
    seen.spans.set(run.id, old ? [Math.min(old[0], lo), Math.max(old[1], hi)] : [lo, hi]);
  }

  judge(): CheckResult {
    if (this.skip) return skippedCheck('retrofit', this.criterion, this.skip.why, this.skip.kind);
    // Sites this model cannot bring out are judged on their graph run on its own (lift.ts).
    const verdicts = liftedVerdicts(this.ctx.lifted, 'retrofit', this.unseen.keys());
    const lifted = new Set(verdicts.flatMap((v) => v.sites).filter((i) => this.unseen.has(i)));
    const own = this.ownVerdict(lifted);
    return verdicts.length ? withLifted('retrofit', this.criterion, own, verdicts) : own!;
  }

  /** The verdict from what this model showed of the sites not in `lifted`; null when there are none and no outputs were compared. */
  private ownVerdict(lifted: ReadonlySet<number>): CheckResult | null {
    const { setup } = this.ctx;
    const id = setup.identity!;
    const siteFailure = this.seen.find((s) => s.failure)?.failure;
    const parity = this.runs.find((r) => !r.passed);
    const failure = this.scaleFailures[0] ?? siteFailure ?? (parity ? parityText(parity, setup) : undefined);
    if (!failure && lifted.size > 0 && lifted.size === setup.sites.length && !this.runs.length) return null;
    const unchecked = [...this.unseen].filter(([i]) => !lifted.has(i)).map(([, why]) => why);
    const notAt = setup.sites.flatMap((site, i) => {
      if (this.unseen.has(i) || this.seen[i].rows > 0) return [];
      const spans = [...this.seen[i].spans.values()];
      const cap = site.window && site.window.size + site.window.sinks;
      const why = cap && spans.every(([, hi]) => hi <= cap) ? `its sliding window leaves a row at most W + S = ${cap} keys` : 'its key count is fixed by the model\'s inputs';
      return spans.length ? [`${site.label}: n = ${spans.map(([a, b]) => (a === b ? a : `${a} … ${b}`)).join(', ')} in the retrofit runs, never ${id.text}: ${why}`] : [];
    });
    let result: CheckResult;
    if (failure) result = check('retrofit', 'FAILED', failure, this.criterion, this.runs);
    else {
      const checked = this.seen.filter((s) => s.rows > 0);
      if (checked.length === 0 && this.unseen.size === setup.sites.length && this.runs.length) {
        result = check('retrofit', 'PASSED', `every output equals the original's in ${this.runs.length} run(s) placing each row at ${id.text}; worst ${describeStatsOf(this.runs, setup.tolerance)} (no site's rows seen${unchecked.length ? `: ${unchecked[0]}` : ' in the model'})`, this.criterion, this.runs);
      } else if (checked.length === 0) {
        result = skippedCheck('retrofit', this.criterion, notAt[0] ?? unchecked[0] ?? `no run put a row at ${id.text}`, notAt.length && !unchecked.length ? 'not applicable' : 'not checked', this.runs);
      } else {
        const rows = checked.reduce((a, s) => a + s.rows, 0);
        const reasons = [...this.whole.values()].filter((w): w is string => w !== null);
        const whole = this.runs.length
          ? `every output equals the original's in ${this.runs.length} run(s); worst ${describeStatsOf(this.runs, setup.tolerance)}`
          : `outputs not compared: no run puts every row at ${id.text}${reasons[0] ? ` (${reasons[0]})` : ''}`;
        result = check('retrofit', 'PASSED', `at ${id.text} the factor is 1 at ${checked.length} site(s) (${rows} rows seen); ${whole}`, this.criterion, this.runs);
      }
    }
    if (unchecked.length) result.unchecked = unchecked;
    if (notAt.length) result.notApplicable = notAt;
    return result;
  }
}

/** Every row of the site has n in the identity range by the run's shape alone (an unpadded run; causal: one row after a cache). */
function atIdentityByShape(site: VerifySite, run: RunSpec, id: Identity): boolean {
  const mode = withMasksOfOnes(site.record.n);
  if (run.padded || (mode !== 'keys' && mode !== 'causal')) return false;
  const total = run.seq + run.past;
  const first = mode === 'causal' ? total - run.seq + 1 : total;
  return first >= id.from && total <= id.upTo;
}

/** The n of the rows a last-row view leaves out: every row alike (keys), or counting down from it (causal). */
function otherRows(site: VerifySite, lo: number, hi: number, run: RunSpec): [number, number] {
  const mode = withMasksOfOnes(site.record.n);
  if (mode === 'keys') return [lo, hi];
  if (mode === 'causal') return [Math.max(1, hi - run.seq + 1), hi];
  return countsMasks(site.record.n) && run.seq === 1 ? [lo, hi] : [1, hi];
}

function parityText(r: RunResult, setup: Setup): string {
  return r.error ? `${r.run}: ${r.error}` : `differs at ${describeStatsOf([r], setup.tolerance)}`;
}

function noIdentity(setup: Setup): string {
  const p = setup.preset;
  if (setup.record.rope) return `RoPE rescaled (${ropeText(setup.record.rope)}) changes the angles at every position, inside L too: no length reproduces the original (the probe checks the frequencies; wiring parity checks the rest with the rescaling undone)`;
  if (p.kind === 'none') return 'the none preset adds a positional prior or a sliding window only: no factor is 1 anywhere, and what it adds changes the logits (the probe checks it)';
  if (setup.sites.some((s) => s.theta?.beta.some((b) => b !== 0))) return 'a positional prior with θβ ≠ 0 changes the logits at every length: no length reproduces the original (the probe checks the prior; wiring parity checks it at neutral θ)';
  if (p.kind === 'ssmax' && p.b !== undefined && p.b !== 0) return `the bias variant's factor s·ln n + ${p.b} is 1 at no length the patch promises`;
  return 'the patch was made with s given directly (no train length): it promises no length where it equals the original';
}
