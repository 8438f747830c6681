/**
 * Sites a model cannot bring out as outputs (in a graph an operator such as BeamSearch holds, whose outputs the
 * operator defines) are judged on that graph lifted into a model of its own (lift.ts). A check whose verdict
 * needs those sites' tensors (retrofit parity, sharpness) states the lifted pair's verdict for them, naming the
 * graph it ran on, beside its own verdict for the sites it could see.
 */
import { Lifted, LiftedGraph } from '../lift';
import { CheckId } from '../plan';
import { CheckResult } from '../report';
import { check, skippedCheck } from './common';

export interface LiftedVerdict {
  /** `the decoder graph of BeamSearch 'X', run on its own`. */
  where: string;
  /** The outer verification's site indices in that graph. */
  sites: number[];
  /** The lifted pair's verdict of the check, or why the graph could not be verified on its own (a sentence naming it). */
  result: CheckResult | string;
}

/** The lifted graphs holding any of `sites`, each once, with its verdict of check `id`. */
export function liftedVerdicts(lifted: Lifted | undefined, id: CheckId, sites: Iterable<number>): LiftedVerdict[] {
  const out = new Map<LiftedGraph, LiftedVerdict>();
  for (const i of sites) {
    const g = lifted?.graphs.get(i);
    if (!g || out.has(g)) continue;
    const result = typeof g.checks === 'string' ? g.checks : g.checks.get(id) ?? `${g.where} was not verified on its own`;
    out.set(g, { where: `${g.where}, run on its own`, sites: g.sites, result });
  }
  return [...out.values()];
}

/**
 * One verdict from the check's own (null: every site is in a lifted graph) and the lifted graphs': failed if any
 * failed, passed if any passed (what the others could not look at listed), else skipped. A part skipped as not
 * checked, or a lifted graph that could not run, is left unverified (it fails --strict).
 */
export function withLifted(id: CheckId, criterion: string, own: CheckResult | null, verdicts: LiftedVerdict[]): CheckResult {
  const parts = [
    ...(own ? [{ text: own.summary, r: own, prefix: '' }] : []),
    ...verdicts.map((v) => (typeof v.result === 'string'
      ? { text: v.result, r: skippedCheck(id, criterion, v.result), prefix: '' }
      : { text: `${v.where}: ${v.result.summary}`, r: v.result, prefix: `${v.where}: ` })),
  ];
  const texts = (xs: typeof parts): string => xs.map((x) => x.text).join(' | ');
  const failed = parts.filter((x) => x.r.status === 'FAILED');
  const passed = parts.filter((x) => x.r.status === 'PASSED');
  const skipped = parts.filter((x) => x.r.status === 'SKIPPED');
  const notChecked = skipped.filter((x) => x.r.skip !== 'not applicable');
  const notApplicable = skipped.filter((x) => x.r.skip === 'not applicable');
  const runs = own?.runs ?? [];
  const shown = failed.length ? failed : passed.length ? passed : notChecked.length ? notChecked : notApplicable;
  const result = shown === failed ? check(id, 'FAILED', texts(shown), criterion, runs)
    : shown === passed ? check(id, 'PASSED', texts(shown), criterion, runs)
      : skippedCheck(id, criterion, texts(shown), shown === notChecked ? 'not checked' : 'not applicable', runs);
  const listed = (x: (typeof parts)[number], key: 'unchecked' | 'notApplicable'): string[] => (x.r[key] ?? []).map((u) => `${x.prefix}${u}`);
  // Parts the summary does not speak for are listed, so --strict sees what was not looked at.
  const rest = (xs: typeof parts): string[] => xs.filter((x) => !shown.includes(x)).map((x) => x.text);
  const unchecked = [...rest(notChecked), ...parts.flatMap((x) => listed(x, 'unchecked'))];
  const na = [...rest(notApplicable), ...parts.flatMap((x) => listed(x, 'notApplicable'))];
  if (unchecked.length) result.unchecked = unchecked;
  if (na.length) result.notApplicable = na;
  return result;
}
