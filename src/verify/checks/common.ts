/** Turns what the runs collected into one verdict per check, each with a one-line summary for the CI log. */
import { OutputStats, Tolerance } from '../compare';
import { CheckId } from '../plan';
import { CheckResult, RunResult, SkipKind, Status } from '../report';
import { opt } from '../../errors';
import { elementCount } from '../tensors';
import { isUniform, MIN_KEPT, NO_FADE, SharpnessCurve } from '../sharpness';

export const CHECK_NAMES: Record<CheckId, string> = {
  wiring: 'wiring parity', probe: 'semantic probe', retrofit: 'retrofit parity', liveness: 'liveness', sharpness: 'attention sharpness',
};

export function e2(x: number): string {
  return Number.isFinite(x) ? x.toExponential(1) : String(x);
}

/** A SKIPPED verdict; `kind` says whether it counts against --strict ('not checked' does). */
export function skippedCheck(id: CheckId, criterion: string, why: string, kind: SkipKind = 'not checked', runs: RunResult[] = []): CheckResult {
  return { id, name: CHECK_NAMES[id], status: 'SKIPPED', summary: why, criterion, runs, skip: kind };
}

export function check(id: CheckId, status: Status, summary: string, criterion: string, runs: RunResult[] = []): CheckResult {
  return { id, name: CHECK_NAMES[id], status, summary, criterion, runs };
}

/** The output with the largest error over all runs, with the run it came from. */
function worstOutput(runs: RunResult[]): { run: RunResult; o: OutputStats } | null {
  let best: { run: RunResult; o: OutputStats } | null = null;
  for (const run of runs) {
    for (const o of run.outputs) {
      const score = o.mismatches * 1e9 + o.maxRel;
      const bestScore = best ? best.o.mismatches * 1e9 + best.o.maxRel : -1;
      if (score > bestScore) best = { run, o };
    }
  }
  return best;
}

function describeStats(o: OutputStats, tol: Tolerance): string {
  if (o.error) return `${o.name}: ${o.error}`;
  const base = `${o.name}: max abs ${e2(o.maxAbs)}, max rel ${e2(o.maxRel)}, mean abs ${e2(o.meanAbs)}`;
  if (o.passed) return base;
  const n = elementCount(o.dims);
  return `${base}; ${o.mismatches} of ${n} elements outside atol ${e2(tol.atol)} / rtol ${e2(tol.rtol)} (would pass with atol ${e2(o.neededAtol)} or rtol ${e2(o.neededRtol)})`;
}

/** The worst output over runs, with its run: `batch=1 seq=64 logits: max abs …`. */
export function describeStatsOf(runs: RunResult[], tol: Tolerance): string {
  const worst = worstOutput(runs);
  return worst ? `${worst.run.run} ${describeStats(worst.o, tol)}` : 'no outputs';
}

/** Parity of two models over runs: every output of every run within tolerance. */
export function parityCheck(id: 'wiring' | 'retrofit', criterion: string, runs: RunResult[], tol: Tolerance, what: string): CheckResult {
  if (runs.length === 0) return skippedCheck(id, criterion, 'no run could be compared (see the notes)');
  const failed = runs.find((r) => r.error);
  if (failed) return check(id, 'FAILED', `${failed.run}: ${failed.error}`, criterion, runs);
  const blind = blindOutput(runs);
  if (blind) return skippedCheck(id, criterion, blind, 'not checked', runs);
  const worst = worstOutput(runs)!;
  const passed = runs.every((r) => r.passed);
  const head = passed ? `${what} in ${runs.length} run(s); worst` : 'differs at';
  return check(id, passed ? 'PASSED' : 'FAILED', `${head} ${worst.run.run} ${describeStats(worst.o, tol)}`, criterion, runs);
}

/**
 * An output the original gives as NaN or Inf everywhere in some run: two NaNs agree, so parity there would pass
 * without comparing anything. Usually synthesised inputs the model does not accept (a mask that hides every key).
 */
function blindOutput(runs: RunResult[]): string | undefined {
  for (const r of runs) {
    const o = r.outputs.find((x) => x.expectedNonFinite > 0 && x.expectedNonFinite === elementCount(x.dims));
    if (o) return `${r.run}: the original's ${o.name} is NaN or Inf everywhere, so nothing was compared; give inputs the model accepts with ${opt('inputFiles', 'NAME=FILE')}`;
  }
  return undefined;
}

export interface LivenessData {
  longRuns: RunResult[];
  /** Long runs whose original attention is saturated (mean largest probability ≥ 0.99): no factor can show there. */
  saturated: Set<string>;
  finiteRuns: number;
  nonFinite: string[];
  errors: string[];
  /** Where the factor must show: `L = 64`, `n ≥ floor_scale = 8192`. */
  beyond: string;
}

/**
 * A long run is alive when some output differs from the original's by more than 10× the float noise the
 * factor-1 model shows on that output, and by more than 1e-6 of the output's scale: a factor that does
 * nothing leaves the outputs bit-identical or within that noise.
 */
export function aliveRuns(longRuns: RunResult[], noiseRuns: RunResult[]): RunResult[] {
  const noise = new Map<string, number>();
  for (const r of noiseRuns) for (const o of r.outputs) noise.set(o.name, Math.max(noise.get(o.name) ?? 0, Number.isFinite(o.maxAbs) ? o.maxAbs : 0));
  return longRuns.map((r) => ({
    ...r,
    // Only a difference that is a number shows the factor: NaN or Inf against the original's own NaN or Inf does not.
    passed: r.outputs.some((o) => o.maxAbsFinite > 10 * (noise.get(o.name) ?? 0) && o.maxAbsFinite > 1e-6 * o.scale && o.maxAbsFinite > 0),
  }));
}

export function livenessCheck(criterion: string, d: LivenessData): CheckResult {
  if (d.errors.length) return check('liveness', 'FAILED', d.errors[0], criterion, d.longRuns);
  if (d.nonFinite.length) return check('liveness', 'FAILED', d.nonFinite[0], criterion, d.longRuns);
  const finite = `all outputs finite in ${d.finiteRuns} run(s)`;
  if (d.longRuns.length === 0) return skippedCheck('liveness', criterion, `no run longer than ${d.beyond} (${finite}); raise the longest length to check`);
  const dead = d.longRuns.find((r) => !r.passed && !d.saturated.has(r.run));
  if (dead) return check('liveness', 'FAILED', `${dead.run}: outputs equal the original's within tolerance: the factor has no effect beyond ${d.beyond}`, criterion, d.longRuns);
  const alive = d.longRuns.filter((r) => r.passed);
  if (alive.length === 0) {
    return skippedCheck('liveness', criterion, `the original's attention is saturated or uniform at every length beyond ${d.beyond} (mean largest probability ≥ 0.99, or about 1/n): no factor can change the outputs (${finite})`, 'not applicable', d.longRuns);
  }
  const longest = alive[alive.length - 1];
  const o = longest.outputs.reduce((a, b) => (b.maxAbsFinite > a.maxAbsFinite ? b : a));
  return check('liveness', 'PASSED', `outputs differ from the original's at ${alive.map((r) => r.length.seq + r.length.past).join(', ')} (> ${d.beyond}; ${o.name} max abs ${e2(o.maxAbsFinite)} at ${longest.length.seq + longest.length.past}); ${finite}`, criterion, d.longRuns);
}

export function sharpnessCheck(criterion: string, curve: SharpnessCurve): CheckResult {
  const first = curve.points[0], last = curve.points[curve.points.length - 1];
  const p = (x: number): string => x.toPrecision(3);
  const keeps = (fall: number): string => `keeps ${Math.round(Math.exp(-fall) * 100)} %`;
  const text = `mean max attention probability ${first.length} → ${last.length}: original ${p(first.original)} → ${p(last.original)} (${keeps(curve.originalFall)}), patched ${p(first.patched)} → ${p(last.patched)} (${keeps(curve.patchedFall)})`;
  if (curve.points.every((x) => isUniform(x.original, x.length))) {
    return skippedCheck('sharpness', criterion, `${text}: the original's attention is uniform at every length (largest probability about 1/n: logits near 0), so no factor can sharpen it`, 'not applicable');
  }
  if (-curve.originalFall >= Math.log(NO_FADE)) {
    return skippedCheck('sharpness', criterion, `${text}: the original does not fade over these lengths, so there is nothing for SSMax to keep`, 'not applicable');
  }
  if (curve.kept >= MIN_KEPT) return check('sharpness', 'PASSED', `${text}: ${p(Math.exp(curve.kept))}× the original's retention`, criterion);
  return check('sharpness', 'FAILED', `${text}: the patched model fades like the original`, criterion);
}
