/** Human-readable report lines: one line per site, per skipped Softmax, per check. */
import { Explanation } from '../detect/find-attention';
import { WriteReport } from '../io/model-file';
import { runtimeLabel } from '../onnxruntime';
import { RECORD_KEY } from '../identity';
import { PatchReport } from '../rewrite/patch';
import { RevertReport } from '../rewrite/revert';
import { LayerScale } from '../policy/scale';
import { VerifyReport } from '../verify/verify';
import { gb } from '../verify/memory';
import type { VerificationPlan } from '../verify/verification-plan';

const fmtS = (s: LayerScale | null): string => (s === null ? 'none' : (Array.isArray(s) ? `[${s.map((v) => v.toPrecision(4)).join(', ')}]` : s.toPrecision(4)));

export function formatPatch(report: PatchReport, dryRun = false): string[] {
  const shared = report.updated ? '' : `, preset ${report.preset}, n computed ${report.nSources} time(s)`;
  const verb = report.updated ? (dryRun ? 'would update s at' : 'updated s at') : dryRun ? 'would patch' : 'patched';
  const lines = report.notes.map((n) => `note: ${n}`);
  lines.push(`${verb} ${report.sites.length} attention site(s)${shared}:`);
  for (const s of report.sites) {
    const heads = s.heads === null ? 'heads=?' : `heads=${s.heads}${s.headAxis === null ? '' : `@axis${s.headAxis}`}`;
    const where = s.scope === 'main' ? '' : `  [${s.scope}]`;
    const kind = s.kind === 'Softmax' ? '' : `  ${s.kind}`;
    lines.push(`  L${s.layer}  ${s.node}${kind}${where}  n=${s.n} (${s.nReason})  ${heads}  rank=${s.logitsRank ?? '?'}  s=${fmtS(s.s)}  on ${s.target}${s.rule ? `  rule ${s.rule}` : ''}`);
    if (s.deviation) lines.push(`      forced, deviation accepted: ${s.deviation}`);
    if (s.expanded) lines.push(`      ${s.expanded}`);
    if (s.fused) lines.push(`      ${s.fused}`);
    if (s.prior) lines.push(`      prior θ: ${s.prior.alpha}, ${s.prior.beta}, ${s.prior.mu}`);
    for (const note of s.notes ?? []) lines.push(`      note: ${note}`);
  }
  const stop = (k: PatchReport['skipped'][number]): string => (k.stoppedAt ? ` (rule ${k.rule} stopped at '${k.stoppedAt}')` : '');
  const refused = report.skipped.filter((k) => k.attention);
  const others = report.skipped.filter((k) => !k.attention);
  if (refused.length) {
    lines.push(`refused ${refused.length} attention node(s):`);
    for (const k of refused) lines.push(`  ${k.layer === undefined ? '' : `L${k.layer}  `}${k.node}${k.scope ? `  [${k.scope}]` : ''}: ${k.reason}${stop(k)}${k.forcible ? ` (--force-site ${k.node} to patch anyway)` : ''}`);
  }
  if (others.length) {
    lines.push(`skipped ${others.length} Softmax:`);
    for (const k of others) lines.push(`  ${k.node}${k.scope ? `  [${k.scope}]` : ''}: ${k.reason}${stop(k)}`);
  }
  return lines;
}

/** One line per check for a CI log; the numbers behind each verdict are in the JSON report. */
/** `verify --dry-run`: per pair verified, its L, its runs and, per run, the checks each session's outputs go to. */
export function formatPlan(plan: VerificationPlan): string[] {
  const lines = ['verify --dry-run: nothing is run'];
  for (const s of plan.subjects) {
    if (s.notVerified) {
      lines.push(`${s.subject}: not verified: ${s.notVerified}`);
      continue;
    }
    const sweep = s.sweep.length ? `lengths ${s.sweep.join(', ')}` : 'no length sweep';
    lines.push(`${s.subject}: L = ${s.trainLen} (${s.trainLenSource}), checks ${s.checks.join(', ')}, ${sweep}, longest ${s.cap} (${s.capReason}), ${s.runs.length} runs`);
    for (const note of s.notes) lines.push(`  note: ${note}`);
    for (const r of s.runs) {
      const peak = r.estimatedPeakBytes === undefined ? '' : `, about ${gb(r.estimatedPeakBytes)}`;
      lines.push(`  ${r.kind.padEnd(8)} ${r.id} (${r.keys} keys${peak}): ${r.reads.map((x) => `${x.session} → ${x.checks.join(', ')}`).join('; ')}`);
    }
  }
  return lines;
}

export function formatVerify(report: VerifyReport): string[] {
  const lengths = report.sweep.length ? `lengths ${report.sweep.join(', ')}` : 'no length sweep';
  const lines = [`verify: L = ${report.trainLen} (${report.trainLenSource}), ${lengths}, ${report.runs.length} runs`];
  for (const note of report.notes) lines.push(`  note: ${note}`);
  for (const i of report.inputs) for (const d of i.sized ?? []) lines.push(`  note: input '${i.name}' ${d}`);
  for (const c of report.checks) {
    lines.push(`  ${c.status.padEnd(7)} ${c.name}: ${c.summary}`);
    for (const u of c.unchecked ?? []) lines.push(`          not checked: ${u}`);
    for (const u of c.notApplicable ?? []) lines.push(`          not applicable: ${u}`);
  }
  for (const r of report.refusedAttention) lines.push(`  note: ${r}`);
  const count = (s: string): number => report.checks.filter((c) => c.status === s).length;
  const tally = [`${count('PASSED')} passed`, count('FAILED') ? `${count('FAILED')} failed` : '', count('SKIPPED') ? `${count('SKIPPED')} skipped` : '']
    .filter(Boolean).join(', ');
  const strict = report.strictMode ? `; ${report.unverified.length ? `${report.unverified.length} left unverified` : 'nothing left unverified'}` : '';
  lines.push(`verify: ${report.passed ? 'PASSED' : 'FAILED'} (${tally}${strict}) in ${(report.totalMs / 1000).toFixed(1)} s on ${runtimeLabel(report.runtime)}`);
  return lines;
}

export function formatRevert(report: RevertReport): string[] {
  const lines = [`reverted ${report.sites.length} SSMax site(s):`];
  for (const s of report.sites) {
    const sv = s.s === null ? 's=?' : `s=${fmtS(s.s)}`;
    const where = s.scope ? `  [${s.scope}]` : '';
    lines.push(`  L${s.layer}  ${s.apply}${s.softmax ? ` → ${s.softmax}` : ''}${where}  ${sv}  removed ${s.removedNodes} nodes, ${s.removedInitializers.length} initializers`);
  }
  if (!report.hadRecord) lines.push(`(the model had no ${RECORD_KEY} metadata record: found from the graph)`);
  else if (report.note) lines.push(`(the patch journal could not be replayed (${report.note}): found from the graph)`);
  return lines;
}

export function formatWrite(written: WriteReport | null, dryRun = false): string[] {
  if (!written) return [dryRun ? 'nothing written (--dry-run)' : 'nothing written'];
  const lines = written.externalData.map((e) => `external data ${e.how}: ${e.file}`);
  const strays = written.removedTemporaryFiles;
  if (strays.length) lines.push(`note: ${straysNote(strays)}`);
  lines.push(`wrote ${written.output}`);
  return lines;
}

/** `removed 1 temporary file (81 MB) left by an interrupted run (process 1234, no longer running): <file>`. */
function straysNote(strays: WriteReport['removedTemporaryFiles']): string {
  const mb = strays.reduce((n, s) => n + s.bytes, 0) / 2 ** 20;
  const pids = [...new Set(strays.map((s) => s.pid))];
  const files = strays.length > 3 ? [...strays.slice(0, 3).map((s) => s.file), `${strays.length - 3} more`] : strays.map((s) => s.file);
  const one = strays.length === 1;
  return `removed ${strays.length} temporary file${one ? '' : 's'} (${mb < 1 ? '< 1' : mb.toFixed(0)} MB) left by ${pids.length === 1 ? 'an interrupted run' : 'interrupted runs'} `
    + `(process${pids.length === 1 ? '' : 'es'} ${pids.join(', ')}, no longer running): ${files.join(', ')}`;
}

/** --explain NODE: the detection rules tried on a candidate node, each matched or stopped at a node with a reason. */
export const formatExplain = (list: Explanation[]): string[] => list.flatMap((e) => [
  `${e.node}  ${e.op}${e.scope === 'main' ? '' : `  [${e.scope}]`}: ${e.verdict}`,
  ...e.attempts.map((a) => (a.matched ? `  matched  ${a.rule}`
    : `  stopped  ${a.rule} at '${a.stoppedAt}' after ${a.steps} check(s): ${a.reason}${a.rule === e.rule ? '  (closest)' : ''}`)),
]);
