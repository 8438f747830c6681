/**
 * Verification's temporary folders (model files of its sessions, the original's large outputs), registered so that
 * a signal handler can remove them: Ctrl-C ends the process without running the code that would have.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const live = new Set<string>();

/** A new folder in the system's temporary folder, removed by removeScratch or removeScratchFolders. */
export function makeScratch(prefix: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  live.add(dir);
  return dir;
}

export function removeScratch(dir: string): void {
  fs.rmSync(dir, { recursive: true, force: true });
  live.delete(dir);
}

/** Removes every folder still registered (for signal handlers); returns how many there were. */
export function removeScratchFolders(): number {
  const count = live.size;
  for (const dir of [...live]) removeScratch(dir);
  return count;
}
