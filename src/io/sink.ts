/**
 * Writes outputs all-or-nothing: every file goes to a temporary name in its target folder, and only when
 * all are complete are they renamed into place (data files first, the model last). On any error every
 * temporary and every file already renamed is removed. Spans of input files are streamed in chunks, so
 * memory stays flat whatever the size; all-zero chunks are skipped, leaving holes, so sparse inputs stay sparse.
 * The copy loops are generators that pause after every chunk: `commit` runs them straight through,
 * `commitAsync` lets the event loop run between chunks, so a SIGINT or SIGTERM handler can remove the
 * temporary files (`removeTemporaryFiles`) while a large write is under way.
 *
 * A process killed outright (SIGKILL: a CI timeout, the OOM killer) cannot clean up. Its temporary files are named
 * `.<target>.ssmax-patch.<pid>@<host>.<random>.tmp`, so a later write into the same folder knows them for strays
 * when that process is gone, and removes them before it writes (`Committed.strays`). Files of a process still
 * running (another write in progress), of another host (a shared folder), and every other name are left alone.
 */
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { memo } from '../memo';
import { Out } from './emit';
import { Progress } from './progress';
import { FileSource, Source, SourceChangedError } from './source';

/**
 * Puts an existing file at `target`: a hard link (one file under two names: a write through either changes both),
 * or a copy of its own, which is a copy-on-write clone where the file system has them (Btrfs, XFS, APFS, ...): made
 * at once and sharing blocks until either side writes, so no write through the copy reaches the source.
 */
export interface PlaceJob {
  kind: 'link' | 'copy';
  target: string;
  source: string;
}

export type Job = { kind: 'write'; target: string; out: Out } | PlaceJob;

export interface JobResult {
  target: string;
  how: 'written' | 'linked' | 'cloned' | 'copied';
}

/** A temporary file an earlier, killed process left behind, removed before this write. */
export interface Stray {
  file: string;
  pid: number;
  bytes: number;
}

export interface Committed {
  results: JobResult[];
  strays: Stray[];
}

/** Small enough to stay in cache between the read and the write of each chunk (measured: 1 MB beats 8 MB). */
const CHUNK = 1024 * 1024;

/** Temporary files of every write in progress, not yet renamed into place. */
const live = new Set<string>();

/** Called with each output the moment it is renamed into place (signal handlers: an output in place is a result). */
const placedListeners = new Set<(target: string) => void>();

/** Calls `listener` with every output renamed into place from now on; returns a function that stops it. */
export function onPlaced(listener: (target: string) => void): () => void {
  placedListeners.add(listener);
  return () => placedListeners.delete(listener);
}

/** A listener's failure cannot undo a write already in place, so it is not this write's failure. */
function tellPlaced(target: string): void {
  for (const l of placedListeners) {
    try {
      l(target);
    } catch {
      // ignored: see above
    }
  }
}

/** Removes the temporary files of every write in progress (for signal handlers); returns how many existed. */
export function removeTemporaryFiles(): number {
  let removed = 0;
  for (const f of live) {
    if (fs.existsSync(f)) removed++;
    fs.rmSync(f, { force: true });
  }
  live.clear();
  return removed;
}

/** `result`: the write is a command's output, so the onPlaced listeners are told (not a working copy in a scratch folder). */
export function commit(jobs: Job[], progress: Progress | null, result = true): Committed {
  const steps = transaction(jobs, progress, result);
  let step = steps.next();
  while (!step.done) step = steps.next();
  return step.value;
}

/** As commit, letting the event loop run after every chunk (signal handlers, timers). */
export async function commitAsync(jobs: Job[], progress: Progress | null, result = true): Promise<Committed> {
  const steps = transaction(jobs, progress, result);
  let step = steps.next();
  while (!step.done) {
    await new Promise<void>((resolve) => setImmediate(resolve));
    step = steps.next();
  }
  return step.value;
}

function* transaction(jobs: Job[], progress: Progress | null, result: boolean): Generator<void, Committed> {
  const strays = removeStrays([...new Set(jobs.map((j) => path.dirname(j.target)))]);
  const temps = jobs.map((j) => tempPath(j.target));
  for (const t of temps) live.add(t);
  const total = jobs.reduce((n, j) => n + (j.kind === 'write' ? j.out.size : j.kind === 'copy' ? fs.statSync(j.source).size : 0), 0);
  progress?.start(`writing ${path.basename(jobs[jobs.length - 1].target)}`, total);
  const renamed: string[] = [];
  try {
    const results: JobResult[] = [];
    for (const [i, job] of jobs.entries()) results.push(yield* run(job, temps[i], progress));
    // Every temporary is renamed into place in one synchronous stretch: no signal handler runs in between.
    jobs.forEach((job, i) => {
      fs.renameSync(temps[i], job.target);
      live.delete(temps[i]);
      renamed.push(job.target);
    });
    // Still in the synchronous stretch: a signal cannot come between the rename and its listeners.
    if (result) tellPlaced(jobs[jobs.length - 1].target);
    return { results, strays };
  } catch (e) {
    for (const f of [...temps, ...renamed]) fs.rmSync(f, { force: true });
    throw e;
  } finally {
    for (const t of temps) live.delete(t);
    progress?.end();
  }
}

/** This machine's name as a temporary file name carries it: letters, digits and dashes. */
const HOST = os.hostname().replace(/[^A-Za-z0-9-]/g, '-').slice(0, 32) || 'localhost';
const TEMP_NAME = /^\.(.+)\.ssmax-patch\.([1-9]\d*)@([A-Za-z0-9-]+)\.[0-9a-f]{8}\.tmp$/;

/** A fresh temporary name beside `target`, naming this process and host. */
export function tempPath(target: string): string {
  const name = `.${path.basename(target)}.ssmax-patch.${process.pid}@${HOST}.${randomBytes(4).toString('hex')}.tmp`;
  return path.join(path.dirname(target), name);
}

/** Removes the temporary files in `dirs` whose process is gone; returns them. */
function removeStrays(dirs: string[]): Stray[] {
  const removed: Stray[] = [];
  for (const dir of dirs) {
    let names: string[];
    try {
      names = fs.readdirSync(dir);
    } catch {
      continue; // a folder still to be made
    }
    for (const name of names) {
      const file = path.join(dir, name);
      const pid = strayPid(name, file);
      const st = pid === null ? null : fs.lstatSync(file, { throwIfNoEntry: false });
      if (pid === null || !st?.isFile()) continue;
      try {
        fs.rmSync(file);
        removed.push({ file, pid, bytes: st.size });
      } catch {
        // Removed meanwhile by another run, or not ours to remove (permissions): left as it is.
      }
    }
  }
  return removed;
}

/** The process that left `name`, when it is a temporary file of this tool on this host whose process is gone. */
function strayPid(name: string, file: string): number | null {
  const m = TEMP_NAME.exec(name);
  if (!m || m[3] !== HOST) return null;
  const pid = Number(m[2]);
  // This process's own pid: one of its writes in progress, or a file of an earlier process that had the same pid.
  if (pid === process.pid) return live.has(file) ? null : pid;
  return running(pid) ? null : pid;
}

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: it runs, as another user.
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function* run(job: Job, temp: string, progress: Progress | null): Generator<void, JobResult> {
  fs.mkdirSync(path.dirname(temp), { recursive: true });
  if (job.kind === 'write') {
    yield* writePieces(job.out, temp, progress);
    return { target: job.target, how: 'written' };
  }
  if (job.kind === 'link') {
    fs.linkSync(job.source, temp);
    return { target: job.target, how: 'linked' };
  }
  if (clone(job.source, temp)) return { target: job.target, how: 'cloned' };
  const src = new FileSource(job.source);
  const out = new Out();
  out.span(src, 0, src.size);
  yield* writePieces(out, temp, progress);
  return { target: job.target, how: 'copied' };
}

/**
 * A copy-on-write clone of `source` at `temp`; false where the file system has none (ENOTSUP, EXDEV across file
 * systems, ...), and then nothing was created. Without the FORCE flag libuv would fall back to a copy of its own,
 * which would neither keep holes, nor pause for signals, nor show progress.
 */
function clone(source: string, temp: string): boolean {
  try {
    fs.copyFileSync(source, temp, fs.constants.COPYFILE_EXCL | fs.constants.COPYFILE_FICLONE_FORCE);
    return true;
  } catch {
    fs.rmSync(temp, { force: true });
    return false;
  }
}

function* writePieces(out: Out, file: string, progress: Progress | null): Generator<void> {
  const fd = fs.openSync(file, 'wx');
  const open = new Map<Source, number>();
  try {
    let pos = 0;
    for (const p of out.pieces) {
      if (!(p instanceof Uint8Array) && p.src instanceof FileSource) {
        const src = p.src;
        const sfd = memo(open, src, () => src.open());
        yield* copyRange(src.name, sfd, p.start, p.end, fd, pos, progress);
      } else {
        // Bytes in memory: a piece of its own, or a span of a buffer.
        const bytes = p instanceof Uint8Array ? p : p.src.read(p.start, p.end);
        writeAt(fd, bytes, pos);
        progress?.advance(bytes.length);
      }
      pos += p instanceof Uint8Array ? p.length : p.end - p.start;
    }
    fs.ftruncateSync(fd, pos);
    // The inputs must not have changed while we copied them.
    for (const [src, sfd] of open) (src as FileSource).check(sfd);
  } finally {
    for (const sfd of open.values()) fs.closeSync(sfd);
    fs.closeSync(fd);
  }
}

let chunk: Buffer | null = null;
let zeros: Buffer | null = null;

function* copyRange(name: string, sfd: number, start: number, end: number, fd: number, pos: number, progress: Progress | null): Generator<void> {
  chunk ??= Buffer.allocUnsafe(CHUNK);
  let offset = start;
  while (offset < end) {
    const want = Math.min(CHUNK, end - offset);
    let got = 0;
    while (got < want) {
      const n = fs.readSync(sfd, chunk, got, want - got, offset + got);
      // Shortened after it was opened: the identity check at the end would say so too, but this read comes first.
      if (n === 0) throw new SourceChangedError(`${name}: changed while being read (it ended at byte ${offset + got})`);
      got += n;
    }
    if (!isZero(chunk, want)) writeAt(fd, chunk.subarray(0, want), pos + offset - start);
    offset += want;
    progress?.advance(want);
    yield;
  }
}

/** True for an all-zero chunk; random data fails on the first bytes, so the full compare is rare. */
function isZero(buf: Buffer, length: number): boolean {
  if (length < 4096 || buf[0] !== 0 || buf[length - 1] !== 0 || buf.readBigUInt64LE(0) !== 0n) return false;
  zeros ??= Buffer.alloc(CHUNK);
  return buf.compare(zeros, 0, length, 0, length) === 0;
}

function writeAt(fd: number, bytes: Uint8Array, pos: number): void {
  let done = 0;
  while (done < bytes.length) done += fs.writeSync(fd, bytes, done, bytes.length - done, pos + done);
}
