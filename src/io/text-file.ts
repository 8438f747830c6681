/** Atomic writes of small text outputs (reports, plots): temporary file beside the target, then rename. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { InputError } from '../errors';
import { tempPath } from './sink';

export function writeTextFile(file: string, text: string, protect: string[] = []): void {
  const target = path.resolve(file);
  if (protect.some((p) => path.resolve(p) === target)) throw new InputError(`${file}: refusing to overwrite an input model`, 'usage');
  // Named as the model writer names its own, so a later write into the folder removes it if this process is killed.
  const tmp = tempPath(target);
  try {
    fs.writeFileSync(tmp, text, { flag: 'wx' });
    fs.renameSync(tmp, target);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new InputError(`${file}: cannot write (${code})`, 'io');
  }
}

/** Fails early, before a long run, when `file` could not be written later. */
export function checkWritable(file: string, protect: string[] = []): void {
  const target = path.resolve(file);
  if (protect.some((p) => path.resolve(p) === target)) throw new InputError(`${file}: refusing to overwrite an input model`, 'usage');
  const dir = path.dirname(target);
  try {
    fs.accessSync(dir, fs.constants.W_OK);
  } catch {
    throw new InputError(`${file}: cannot write (folder ${dir} is missing or not writable)`, 'io');
  }
  if (fs.existsSync(target) && fs.statSync(target).isDirectory()) throw new InputError(`${file}: is a folder`, 'io');
}
