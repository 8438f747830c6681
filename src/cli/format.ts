/** Human-readable report lines: one line per site, per skipped Softmax, per check. */
import { WriteReport } from '../io/model-file';
import { PatchReport } from '../rewrite/patch';
import { RevertReport } from '../rewrite/revert';
import { LayerScale } from '../policy/scale';
import { VerifyReport } from '../verify/verify';

const fmtS = (s: LayerScale): string => (Array.isArray(s) ? `[${s.map((v) => v.toPrecision(4)).join(', ')}]` : s.toPrecision(4));

export function formatPatch(report: PatchReport): string[] {
  const lines = [`${report.updated ? 'updated s at' : 'patched'} ${report.sites.length} attention site(s):`];
  for (const s of report.sites) {
    const heads = s.heads === null ? 'heads=?' : `heads=${s.heads}`;
    lines.push(`  L${s.layer}  ${s.node}  n=${s.n} (${s.nReason})  ${heads}  rank=${s.logitsRank ?? '?'}  s=${fmtS(s.s)}`);
  }
  if (report.skipped.length) {
    lines.push(`skipped ${report.skipped.length} Softmax:`);
    for (const k of report.skipped) lines.push(`  ${k.node}: ${k.reason}`);
  }
  return lines;
}

export function formatVerify(report: VerifyReport): string[] {
  const lines = ['verify:'];
  for (const c of report.checks) {
    lines.push(`  ${c.status.padEnd(7)} ${c.name}: ${c.detail}`);
    for (const r of c.runs) {
      const len = `batch=${r.length.batch} seq=${r.length.seq}${r.length.past ? ` past=${r.length.past}` : ''}`;
      if (r.error) lines.push(`    ${r.passed ? 'ok  ' : 'FAIL'} ${len}: ${r.error}`);
      else if (r.outputs.length === 0) lines.push(`    ${r.passed ? 'ok  ' : 'FAIL'} ${len}`);
      for (const o of r.outputs) {
        lines.push(`    ${r.passed ? 'ok  ' : 'FAIL'} ${len} ${o.name}: max abs ${o.maxAbs.toExponential(2)}, max rel ${o.maxRel.toExponential(2)}${o.finite ? '' : ', NOT FINITE'}`);
      }
    }
  }
  lines.push(`verify: ${report.passed ? 'PASSED' : 'FAILED'}`);
  return lines;
}

export function formatRevert(report: RevertReport): string[] {
  const lines = [`reverted ${report.sites.length} SSMax site(s):`];
  for (const s of report.sites) {
    const sv = s.s === null ? 's=?' : `s=${fmtS(s.s)}`;
    lines.push(`  L${s.layer}  ${s.apply}${s.softmax ? ` → ${s.softmax}` : ''}  ${sv}  removed ${s.removedNodes} nodes, ${s.removedInitializers.length} initializers`);
  }
  if (!report.hadRecord) lines.push('(the model had no ssmax_patch metadata record: found from the graph)');
  return lines;
}

export function formatWrite(written: WriteReport | null): string[] {
  if (!written) return ['nothing written'];
  const lines = written.externalData.map((e) => `external data ${e.how}: ${e.file}`);
  lines.push(`wrote ${written.output}`);
  return lines;
}
