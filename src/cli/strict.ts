/**
 * --strict, for CI: a verification only passes when nothing was left unproven. verifyPatch lists what it could
 * not look at (a check skipped for lack of evidence, a site it could not probe, attention the patch refused);
 * with --strict each of them fails with exit code 1, like a failed check.
 */
import type { VerifyReport } from '../verify/verify';

export interface StrictResult {
  passed: boolean;
  /** One line per reason the strict verdict failed. */
  failures: string[];
}

export function strictVerdict(report: VerifyReport): StrictResult {
  return { passed: report.unverified.length === 0, failures: report.unverified };
}
