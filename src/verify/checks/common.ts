/** Verdicts as the checks write them, each with a one-line summary for the CI log. */
import { OutputStats, Tolerance } from '../compare';
import { CheckId } from '../plan';
import { CheckResult, RunResult, SkipKind, Status } from '../report';
import { opt } from '../../errors';
import { elementCount } from '../tensors';

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

/**
 * The error on the output's scale, max |a − e| / max |e|: a relative error per element is huge (or Infinity) where
 * the original's value is near 0 (fp16 logits, a padded row), so a passing output is described by this instead.
 */
export function scaledError(o: Pick<OutputStats, 'maxAbs' | 'scale'>): number {
  if (o.maxAbs === 0) return 0;
  return o.scale > 0 ? o.maxAbs / o.scale : Infinity;
}

function describeStats(o: OutputStats, tol: Tolerance): string {
  if (o.error) return `${o.name}: ${o.error}`;
  const scale = o.maxAbs === 0 ? '' : o.scale > 0 ? ` (${e2(scaledError(o))} of its largest |value| ${e2(o.scale)})` : ' (the original\'s values are all 0)';
  const base = `${o.name}: max abs ${e2(o.maxAbs)}${scale}, mean abs ${e2(o.meanAbs)}`;
  if (o.passed) return base;
  const n = elementCount(o.dims);
  return `${base}, max rel ${e2(o.maxRel)}; ${o.mismatches} of ${n} elements outside atol ${e2(tol.atol)} / rtol ${e2(tol.rtol)} (would pass with atol ${e2(o.neededAtol)} or rtol ${e2(o.neededRtol)})`;
}

/** The output with the largest error over runs, with its run: `batch=1 seq=64 logits: max abs …`. */
export function describeStatsOf(runs: RunResult[], tol: Tolerance): string {
  // The worst output on its own scale: one whose values are near 0 is not the worst for a large relative error.
  const score = (o: OutputStats): number => (o.error ? Infinity : o.mismatches * 1e9 + Math.min(scaledError(o), 1e8));
  let worst: { run: RunResult; o: OutputStats } | null = null;
  for (const run of runs) for (const o of run.outputs) if (!worst || score(o) > score(worst.o)) worst = { run, o };
  return worst ? `${worst.run.run} ${describeStats(worst.o, tol)}` : 'no outputs';
}

/** Parity of two models over runs: every output of every run within tolerance. */
export function parityCheck(id: 'wiring' | 'retrofit', criterion: string, runs: RunResult[], tol: Tolerance, what: string): CheckResult {
  if (runs.length === 0) return skippedCheck(id, criterion, 'no run could be compared (see the notes)');
  const failed = runs.find((r) => r.error);
  if (failed) return check(id, 'FAILED', `${failed.run}: ${failed.error}`, criterion, runs);
  const blind = blindOutput(runs);
  if (blind) return skippedCheck(id, criterion, blind, 'not checked', runs);
  const passed = runs.every((r) => r.passed);
  const head = passed ? `${what} in ${runs.length} run(s); worst` : 'differs at';
  return check(id, passed ? 'PASSED' : 'FAILED', `${head} ${describeStatsOf(runs, tol)}`, criterion, runs);
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
