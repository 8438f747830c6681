/** One CLI invocation: its report document, and whether it is printed as JSON or as lines for a log. */
import { oneLine } from '../errors';
import type { Warning } from '../policy/warnings';
import { CommandName, documentJson, newDocument, ReportDocument } from './report';

export class Run {
  readonly doc: ReportDocument;
  /** Set once the command printed its result: a later failure then adds only its stderr line. */
  printed = false;
  /** verify says FAILED in its own lines on stdout; patch adds "output not written" on stderr. */
  failureOnStderr = true;

  constructor(readonly command: CommandName, readonly json: boolean) {
    this.doc = newDocument(command);
  }

  /** Prints the document (--json) or the lines for a log. */
  print(lines: () => string[]): void {
    process.stdout.write(this.json ? documentJson(this.doc) : lines().join('\n') + '\n');
    this.printed = true;
  }
}

export function printWarnings(warnings: Warning[]): void {
  for (const w of warnings) process.stderr.write(`ssmax-patch: warning: ${oneLine(w.message)}\n`);
}
