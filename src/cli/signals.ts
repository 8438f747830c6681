/**
 * Ctrl-C (SIGINT) and SIGTERM: remove the temporary files of a write in progress and exit 130 or 143, the
 * shell's 128 + signal number. Writes pause after every chunk, so the handler runs mid-write; outputs already
 * renamed into place are complete and stay. Verification's temporary folders are removed too; its onnxruntime runs hold
 * the thread, so the handler runs when the current one ends (relaunch.ts makes that prompt).
 * Once the output is in place the command's outcome is decided (what is left is printing and small report files):
 * a signal then no longer turns it into 130, the command finishes with its own exit code.
 * A relaunched child tells its parent (relaunch.ts) each output it placed and its exit code, one line each, in the
 * file SSMAX_PATCH_OUTCOME_FILE names: the parent reads it when the child ends by a signal.
 */
import * as fs from 'node:fs';
import { constants } from 'node:os';
import { onPlaced, removeTemporaryFiles } from '../io/sink';
import { removeScratchFolders } from '../verify/scratch';

const SIGNALS = ['SIGINT', 'SIGTERM'] as const;

/** The environment variable naming the file a relaunched child writes its outcome to. */
export const OUTCOME_FILE = 'SSMAX_PATCH_OUTCOME_FILE';

function tellParent(line: string): void {
  const file = process.env[OUTCOME_FILE];
  if (file) fs.appendFileSync(file, `${line}\n`);
}

/** Installs the handlers; returns a function that removes them, given the command's exit code. */
export function cleanUpOnSignals(): (code: number) => void {
  let placed: string | null = null;
  const stopPlaced = onPlaced((target) => {
    placed = target;
    tellParent(`wrote ${target}`);
  });
  const handler = (signal: NodeJS.Signals): void => {
    if (placed !== null) {
      process.stderr.write(`${process.stderr.isTTY ? '\n' : ''}ssmax-patch: ${signal} after ${placed} was written: finishing with its own outcome\n`);
      return;
    }
    const removed = removeTemporaryFiles();
    const folders = removeScratchFolders();
    const files = removed ? `removed ${removed} temporary file(s)` : 'no temporary file left';
    const what = folders ? `${files}; removed ${folders} temporary verification folder(s)` : files;
    process.stderr.write(`${process.stderr.isTTY ? '\n' : ''}ssmax-patch: interrupted by ${signal}: ${what}\n`);
    process.exit(128 + constants.signals[signal]);
  };
  for (const s of SIGNALS) process.on(s, handler);
  return (code) => {
    // Told before the handlers go: a signal after this ends the process by default, and the parent reports this code.
    tellParent(`exit ${code}`);
    stopPlaced();
    for (const s of SIGNALS) process.off(s, handler);
  };
}
