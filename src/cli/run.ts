/**
 * One CLI invocation: whether it prints JSON or lines for a log, what its command has established so far (for the
 * report of a failure part-way), and the one place an outcome is printed.
 */
import { oneLine } from '../errors';
import type { Warning } from '../policy/warnings';
import { Known, Outcome, present } from './outcome';
import { CommandName, documentJson } from './report';

export class Run {
  /** What the command has established so far: a failure's document says it (outcome.ts documentOf). */
  known: Known = {};
  /** Set once the command printed its result: a later failure then adds only its stderr line. */
  printed = false;

  constructor(readonly command: CommandName, readonly json: boolean) {}

  /** Prints a finished outcome (its document with --json, else its lines) and returns its exit code. */
  show(outcome: Outcome): number {
    const shown = present(outcome);
    process.stdout.write(this.json ? documentJson(shown.doc) : shown.lines.join('\n') + '\n');
    this.printed = true;
    // verify says FAILED in its own lines on stdout; the other commands add their failure's line on stderr.
    if (shown.doc.error && outcome.command !== 'verify') process.stderr.write(`ssmax-patch: ${shown.doc.error.message}\n`);
    return shown.exitCode;
  }
}

export function printWarnings(warnings: Warning[]): void {
  for (const w of warnings) process.stderr.write(`ssmax-patch: warning: ${oneLine(w.message)}\n`);
}
