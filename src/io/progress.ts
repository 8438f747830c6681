/** Progress of long writes on stderr: one line rewritten in place, only on a terminal and only for big jobs. */

export interface Progress {
  start(label: string, total: number): void;
  advance(bytes: number): void;
  end(): void;
}

/** Jobs smaller than this finish before a progress line would be worth reading. */
export const PROGRESS_THRESHOLD = 100 * 1024 * 1024;

export interface ProgressOptions {
  quiet?: boolean;
  stream?: { isTTY?: boolean; write(s: string): boolean };
  threshold?: number;
  /** Minimum milliseconds between redraws. */
  interval?: number;
}

const mb = (n: number): string => (n / (1024 * 1024)).toFixed(0);

/** A progress line on `stream` (stderr by default), or null when it would not be shown. */
export function terminalProgress(options: ProgressOptions = {}): Progress | null {
  const stream = options.stream ?? process.stderr;
  if (options.quiet || !stream.isTTY) return null;
  const threshold = options.threshold ?? PROGRESS_THRESHOLD;
  const interval = options.interval ?? 200;
  let label = '';
  let total = 0;
  let done = 0;
  let shown = false;
  let last = 0;
  const draw = (): void => {
    const pct = total > 0 ? Math.floor((100 * done) / total) : 100;
    stream.write(`\rssmax-patch: ${label} ${pct}% (${mb(done)} of ${mb(total)} MB)`);
    shown = true;
  };
  return {
    start(l: string, t: number): void {
      label = l;
      total = t;
      done = 0;
    },
    advance(bytes: number): void {
      done += bytes;
      const now = Date.now();
      if (total >= threshold && now - last >= interval) {
        last = now;
        draw();
      }
    },
    end(): void {
      if (shown) {
        draw();
        stream.write('\n');
      }
      shown = false;
    },
  };
}
