/**
 * --junit FILE: the verification as JUnit XML, the format GitLab, Jenkins, Azure Pipelines and the GitHub test
 * reporters read. One test case per check, and per site for the checks that report sites (the semantic probe);
 * one per refused attention node. SKIPPED maps to <skipped>, FAILED to <failure>; under --strict every skip for lack of evidence
 * is a failure, as in the exit code. The suite's `runtime` property names the onnxruntime that ran.
 */
import type { SkippedSoftmax } from '../detect/find-attention';
import { runtimeLabel } from '../onnxruntime';
import type { CheckResult, VerifyReport } from '../verify/verify';

interface Case {
  classname: string;
  name: string;
  outcome: 'passed' | 'failed' | 'skipped';
  message?: string;
  /** A skip --strict fails: a check skipped for lack of evidence (not one not selected or not applicable), a refused site. */
  strictFails?: boolean;
}

/** `suite` names the test suite, e.g. "ssmax-patch verify model.onnx". */
export function junitXml(suite: string, report: VerifyReport, refused: SkippedSoftmax[], strict: boolean): string {
  const cases = [...report.checks.flatMap(checkCases), ...refused.map(refusedCase)]
    .map(({ strictFails, ...c }) => (strict && c.outcome === 'skipped' && strictFails ? { ...c, outcome: 'failed' as const, message: `--strict: ${c.message}` } : c));
  const failures = cases.filter((c) => c.outcome === 'failed').length;
  const skipped = cases.filter((c) => c.outcome === 'skipped').length;
  const time = (report.totalMs / 1000).toFixed(3);
  const counts = `tests="${cases.length}" failures="${failures}" errors="0" skipped="${skipped}" time="${time}"`;
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<testsuites name="ssmax-patch" ${counts}>`,
    `  <testsuite name="${attr(suite)}" ${counts}>`,
    `    <properties><property name="runtime" value="${attr(runtimeLabel(report.runtime))}"/></properties>`,
    ...cases.map(caseXml),
    '  </testsuite>',
    '</testsuites>',
    '',
  ].join('\n');
}

function checkCases(c: CheckResult): Case[] {
  const classname = `ssmax-patch.${c.id}`;
  if (!c.sites?.length) return [{ classname, name: c.name, outcome: outcomeOf(c.status), message: c.summary, strictFails: c.status === 'SKIPPED' && c.skip === 'not checked' }];
  return c.sites.map((s, i, all) => ({
    classname, name: `${c.name}: layer ${s.layer} (site ${i + 1} of ${all.length}, n ${s.n})`,
    outcome: s.passed ? 'passed' : 'failed', message: s.message ?? c.summary,
  }));
}

function refusedCase(k: SkippedSoftmax): Case {
  const where = `${k.layer === undefined ? '' : `layer ${k.layer} `}${k.node}${k.scope ? ` [${k.scope}]` : ''}`;
  return { classname: 'ssmax-patch.sites', name: `attention ${where}`, outcome: 'skipped', message: `refused: ${k.reason}`, strictFails: true };
}

const outcomeOf = (status: CheckResult['status']): Case['outcome'] => (status === 'PASSED' ? 'passed' : status === 'FAILED' ? 'failed' : 'skipped');

function caseXml(c: Case): string {
  const open = `    <testcase classname="${attr(c.classname)}" name="${attr(c.name)}"`;
  if (c.outcome === 'passed') return `${open}/>`;
  const tag = c.outcome === 'failed' ? 'failure' : 'skipped';
  const body = c.outcome === 'failed' ? `>${text(c.message ?? '')}</failure>` : '/>';
  return `${open}>\n      <${tag} message="${attr(c.message ?? '')}"${c.outcome === 'failed' ? ' type="FAILED"' : ''}${body}\n    </testcase>`;
}

/** XML 1.0 cannot carry most control characters at all, even escaped: they become U+FFFD. */
// eslint-disable-next-line no-control-regex
const clean = (s: string): string => s.replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]/g, '\ufffd');
const text = (s: string): string => clean(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const attr = (s: string): string => text(s).replace(/"/g, '&quot;').replace(/\n/g, '&#10;').replace(/\r/g, '&#13;').replace(/\t/g, '&#9;');
