/**
 * Ctrl-C (SIGINT) and SIGTERM: remove the temporary files of a write in progress and exit 130 or 143, the
 * shell's 128 + signal number. Writes pause after every chunk, so the handler runs mid-write; outputs already
 * renamed into place are complete and stay. Verification's temporary folders are removed too; its onnxruntime runs hold
 * the thread, so the handler runs when the current one ends (relaunch.ts makes that prompt).
 */
import { constants } from 'node:os';
import { removeTemporaryFiles } from '../io/sink';
import { removeScratchFolders } from '../verify/scratch';

const SIGNALS = ['SIGINT', 'SIGTERM'] as const;

/** Installs the handlers; returns a function that removes them. */
export function cleanUpOnSignals(): () => void {
  const handler = (signal: NodeJS.Signals): void => {
    const removed = removeTemporaryFiles();
    const folders = removeScratchFolders();
    const files = removed ? `removed ${removed} temporary file(s)` : 'no temporary file left';
    const what = folders ? `${files}; removed ${folders} temporary verification folder(s)` : files;
    process.stderr.write(`${process.stderr.isTTY ? '\n' : ''}ssmax-patch: interrupted by ${signal}: ${what}\n`);
    process.exit(128 + constants.signals[signal]);
  };
  for (const s of SIGNALS) process.on(s, handler);
  return () => {
    for (const s of SIGNALS) process.off(s, handler);
  };
}
