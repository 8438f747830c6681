/** Human-readable report lines: one line per site, per skipped Softmax, per check. */
import { PatchReport } from '../rewrite/patch';
import { LayerScale } from '../policy/scale';
import { VerifyReport } from '../verify/verify';

const fmtS = (s: LayerScale): string => (Array.isArray(s) ? `[${s.map((v) => v.toPrecision(4)).join(', ')}]` : s.toPrecision(4));

export function formatPatch(report: PatchReport): string[] {
  const shared = report.updated ? '' : `, preset ${report.preset}, n computed ${report.nSources} time(s)`;
  const lines = [`${report.updated ? 'updated s at' : 'patched'} ${report.sites.length} attention site(s)${shared}:`];
  for (const s of report.sites) {
    const heads = s.heads === null ? 'heads=?' : `heads=${s.heads}${s.headAxis === null ? '' : `@axis${s.headAxis}`}`;
    const where = s.scope === 'main' ? '' : `  [${s.scope}]`;
    const kind = s.kind === 'Softmax' ? '' : `  ${s.kind}`;
    lines.push(`  L${s.layer}  ${s.node}${kind}${where}  n=${s.n} (${s.nReason})  ${heads}  rank=${s.logitsRank ?? '?'}  s=${fmtS(s.s)}  on ${s.target}`);
    if (s.deviation) lines.push(`      forced, deviation accepted: ${s.deviation}`);
  }
  const refused = report.skipped.filter((k) => k.attention);
  const others = report.skipped.filter((k) => !k.attention);
  if (refused.length) {
    lines.push(`refused ${refused.length} attention node(s):`);
    for (const k of refused) lines.push(`  ${k.layer === undefined ? '' : `L${k.layer}  `}${k.node}${k.scope ? `  [${k.scope}]` : ''}: ${k.reason}${k.forcible ? ` (--force-site ${k.node} to patch anyway)` : ''}`);
  }
  if (others.length) {
    lines.push(`skipped ${others.length} Softmax:`);
    for (const k of others) lines.push(`  ${k.node}${k.scope ? `  [${k.scope}]` : ''}: ${k.reason}`);
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
