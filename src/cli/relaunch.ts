/**
 * Verification runs onnxruntime sessions one after another, each long run allocating and freeing hundreds of
 * megabytes in buffers of a few MB. glibc keeps freed buffers below its dynamic mmap threshold (which grows up to
 * 32 MB) in the heap, so the peak of a verification is the largest run plus what earlier runs left behind:
 * 2.62–2.71 GB against 2.2–2.5 GB for its largest run alone on the 100 M-parameter bench model. With
 * MALLOC_MMAP_THRESHOLD_ set, every buffer over 8 MB is its own mapping, returned to the system when freed. glibc
 * reads the variable only at process start, so a verifying command on Linux runs once more as a child process with
 * it set (unless the user set it, or SSMAX_PATCH_NO_RELAUNCH is set), passing signals on and returning its exit code.
 */
import { spawn } from 'node:child_process';
import { constants } from 'node:os';

// 8 MB: the peak of the bench's 100 M model falls from 2.66 to 2.32 GB for 6 % more time; 1 MB gives 2.18 GB for 15 %.
const THRESHOLD = String(8 * 2 ** 20);

/**
 * glibc.malloc.hugetlb=1 (glibc ≥ 2.35; ignored by older ones): mapped buffers are advised for transparent huge
 * pages, so each 805 MB attention tensor of a long run faults in 2 MB pages instead of 4 kB ones: 94 → 76 s on the
 * bench's verification, most of the difference being system time. Any tunables the user set are kept.
 */
function tunables(given: string | undefined): string {
  if (given && /glibc\.malloc\.hugetlb=/.test(given)) return given;
  return given ? `${given}:glibc.malloc.hugetlb=1` : 'glibc.malloc.hugetlb=1';
}

/** Whether this command line verifies (the verify subcommand, or patch with --verify) or calibrates (runs as verify does). */
function verifies(args: string[]): boolean {
  return args[0] === 'verify' || args[0] === 'calibrate' || args.includes('--verify');
}

/**
 * Runs `bin` with `args` in a child process with MALLOC_MMAP_THRESHOLD_ set and resolves to its exit code; null
 * when this process should do the work itself (not a verifying command, not Linux, or the child did not start).
 */
export async function relaunchForVerify(bin: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<number | null> {
  if (process.platform !== 'linux' || !verifies(args) || env.MALLOC_MMAP_THRESHOLD_ !== undefined || env.SSMAX_PATCH_NO_RELAUNCH) return null;
  const child = spawn(process.execPath, [...process.execArgv, bin, ...args], { stdio: 'inherit', env: { ...env, MALLOC_MMAP_THRESHOLD_: THRESHOLD, GLIBC_TUNABLES: tunables(env.GLIBC_TUNABLES) } });
  const forward = (signal: NodeJS.Signals): void => { child.kill(signal); };
  const signals = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
  for (const s of signals) process.on(s, forward);
  return new Promise((resolve) => {
    child.on('error', () => resolve(null));
    child.on('close', (code, signal) => {
      for (const s of signals) process.off(s, forward);
      resolve(code ?? 128 + (signal ? constants.signals[signal] : 0));
    });
  });
}
