/**
 * --strict, for CI: a verification only passes when nothing was left unproven. Any SKIPPED check, any refused
 * attention site (left unpatched), fails with exit code 1, like a failed check.
 */
import type { SkippedSoftmax } from '../detect/find-attention';
import type { CheckResult } from '../verify/verify';

export interface StrictResult {
  passed: boolean;
  /** One line per reason the strict verdict failed. */
  failures: string[];
}

export function strictVerdict(checks: CheckResult[], refused: SkippedSoftmax[]): StrictResult {
  const failures = [
    ...checks.filter((c) => c.status === 'SKIPPED').map((c) => `${c.name} SKIPPED: ${c.summary}`),
    ...refused.map((k) => `attention node ${k.node}${k.scope ? ` [${k.scope}]` : ''} refused: ${k.reason}`),
  ];
  return { passed: failures.length === 0, failures };
}
