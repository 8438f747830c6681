/**
 * Where model bytes come from: a buffer in memory or a file read at positions. A file is opened only for
 * the duration of one operation (a scan, a lazy read, a copy), and its identity (device, inode, size,
 * mtime) is checked each time, so a file changed behind our back is reported instead of mixed into the output.
 */
import * as fs from 'node:fs';

export interface Reader {
  /** Bytes [start, end): a view for memory sources, a fresh copy for files (so nothing pins a read window). */
  bytes(start: number, end: number): Uint8Array;
  byte(pos: number): number;
}

export interface Source {
  readonly size: number;
  /** The file path, or a label for bytes in memory. */
  readonly name: string;
  /** Runs `fn` with the source open. */
  session<T>(fn: (r: Reader) => T): T;
  /** One read of [start, end). */
  read(start: number, end: number): Uint8Array;
}

export class MemorySource implements Source {
  readonly size: number;
  constructor(readonly buffer: Uint8Array, readonly name: string) {
    this.size = buffer.length;
  }

  session<T>(fn: (r: Reader) => T): T {
    return fn({ bytes: (s, e) => this.buffer.subarray(s, e), byte: (p) => this.buffer[p] });
  }

  read(start: number, end: number): Uint8Array {
    return this.buffer.subarray(start, end);
  }
}

/** Thrown when a file changed between reading its structure and using its bytes. */
export class SourceChangedError extends Error {}

const WINDOW = 64 * 1024;
/** After a jump (past a tensor's data), read little: the next field header is all the scan needs. */
const JUMP_WINDOW = 4 * 1024;

export class FileSource implements Source {
  readonly size: number;
  private readonly identity: string;

  constructor(readonly name: string) {
    const st = fs.statSync(name);
    this.size = st.size;
    this.identity = identityOf(st);
  }

  /** Opens the file, checking it is still the file we first saw. */
  open(): number {
    const fd = fs.openSync(this.name, 'r');
    try {
      this.check(fd);
    } catch (e) {
      fs.closeSync(fd);
      throw e;
    }
    return fd;
  }

  /** Throws if the open file is no longer the one first seen (replaced, resized or modified). */
  check(fd: number): void {
    if (identityOf(fs.fstatSync(fd)) !== this.identity) throw new SourceChangedError(`${this.name}: changed while being read`);
  }

  session<T>(fn: (r: Reader) => T): T {
    const fd = this.open();
    try {
      return fn(new WindowReader(fd, this.size));
    } finally {
      fs.closeSync(fd);
    }
  }

  read(start: number, end: number): Uint8Array {
    return this.session((r) => r.bytes(start, end));
  }
}

function identityOf(st: fs.Stats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
}

/** Positioned reads through a small window, so scanning field headers costs few system calls. */
class WindowReader implements Reader {
  private window = Buffer.alloc(0);
  private windowStart = 0;

  constructor(private readonly fd: number, private readonly size: number) {}

  byte(pos: number): number {
    const end = this.windowStart + this.window.length;
    if (pos < this.windowStart || pos >= end) this.fill(pos, pos === end ? WINDOW : JUMP_WINDOW);
    return this.window[pos - this.windowStart];
  }

  bytes(start: number, end: number): Uint8Array {
    const length = end - start;
    if (start >= this.windowStart && end <= this.windowStart + this.window.length) {
      return Uint8Array.prototype.slice.call(this.window, start - this.windowStart, end - this.windowStart);
    }
    if (length <= WINDOW) {
      this.fill(start, WINDOW);
      return Uint8Array.prototype.slice.call(this.window, 0, length);
    }
    return readExact(this.fd, start, length);
  }

  private fill(pos: number, length: number): void {
    this.window = Buffer.from(readExact(this.fd, pos, Math.min(length, this.size - pos)));
    this.windowStart = pos;
  }
}

export function readExact(fd: number, pos: number, length: number): Uint8Array {
  const out = Buffer.allocUnsafe(length);
  let done = 0;
  while (done < length) {
    const n = fs.readSync(fd, out, done, length - done, pos + done);
    if (n === 0) throw new SourceChangedError(`file ended at byte ${pos + done}, before the ${length} bytes expected`);
    done += n;
  }
  return out;
}
