/**
 * Verification runs onnxruntime sessions one after another, each long run allocating and freeing hundreds of
 * megabytes in buffers of a few MB. glibc keeps freed buffers below its dynamic mmap threshold (which grows up to
 * 32 MB) in the heap, so the peak of a verification is the largest run plus what earlier runs left behind:
 * 2.62–2.71 GB against 2.2–2.5 GB for its largest run alone on the 100 M-parameter bench model. With
 * MALLOC_MMAP_THRESHOLD_ set, every buffer over 8 MB is its own mapping, returned to the system when freed. glibc
 * reads the variable only at process start, so a verifying command on Linux runs once more as a child process with
 * it set (unless the user set it, or SSMAX_PATCH_NO_RELAUNCH is set), passing signals on and returning its exit code.
 * The child also makes Ctrl-C prompt: onnxruntime-node runs a session on the JavaScript thread, so an in-process
 * signal handler waits for the run to end (seconds on a long run); this process says it is stopping at once, and
 * kills the child if it has not stopped within half a second, unless it has written its output by then: a child
 * that has is left to finish, and its own exit code is the command's (signals.ts tells the parent; issue 33).
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import { constants } from 'node:os';
import * as path from 'node:path';
import { Command } from 'commander';
import { checkTarget } from '../io/model-file';
import { defaultOutput, PatchCliOptions, patchProgram } from './patch-command';
import { OUTCOME_FILE } from './signals';

/**
 * How long a child that was sent a signal may take to stop by itself (its handler runs between onnxruntime calls,
 * which cannot be interrupted) before it is killed.
 */
const STOP_GRACE_MS = 500;

// 8 MB: the peak of the bench's 100 M model falls from 2.66 to 2.32 GB for 6 % more time; 1 MB gives 2.18 GB for 15 %.
const THRESHOLD = String(8 * 2 ** 20);

/**
 * calibrate's: its curve starts at L/4, so over a cache it synthesises a few layers' caches of 4–8 MB each per
 * input (6.3 MB at 2048 keys on the bench decoder) that stay in the heap under 8 MB once freed; at 4 MB they are
 * returned: 1.55 → 1.36 GB peak at L = 8192, no slower.
 */
const CALIBRATE_THRESHOLD = String(4 * 2 ** 20);

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
 * A patch whose output the write would refuse (it exists without --force, its folder is missing): this process
 * refuses it at once, as it does without --verify, instead of starting a child to do so.
 */
function refusedOutput(args: string[]): boolean {
  const cmd = patchProgram(new Command('patch').exitOverride().configureOutput({ outputError: () => undefined }));
  try {
    const { operands } = cmd.parseOptions(args[0] === 'patch' ? args.slice(1) : args);
    const o = cmd.opts<PatchCliOptions>();
    if (operands.length !== 1 || o.dryRun) return false;
    checkTarget(defaultOutput(operands[0], o.output), { force: o.force, protect: [operands[0]] });
    return false;
  } catch {
    return true;
  }
}

/**
 * Runs `bin` with `args` in a child process with MALLOC_MMAP_THRESHOLD_ set and resolves to its exit code; null
 * when this process should do the work itself (not a verifying command, not Linux, or the child did not start).
 */
export async function relaunchForVerify(bin: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<number | null> {
  if (process.platform !== 'linux' || !verifies(args) || refusedOutput(args) || env.MALLOC_MMAP_THRESHOLD_ !== undefined || env.SSMAX_PATCH_NO_RELAUNCH) return null;
  // The child's temporary folders go in one of this process's, which it removes however the child ends.
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-patch-'));
  const outcome = path.join(scratch, 'outcome');
  const child = spawn(process.execPath, [...process.execArgv, bin, ...args], {
    stdio: 'inherit',
    env: {
      ...env, TMPDIR: scratch, [OUTCOME_FILE]: outcome, MALLOC_MMAP_THRESHOLD_: args[0] === 'calibrate' ? CALIBRATE_THRESHOLD : THRESHOLD,
      GLIBC_TUNABLES: tunables(env.GLIBC_TUNABLES),
    },
  });
  let stopping: NodeJS.Signals | null = null;
  const forward = (signal: NodeJS.Signals): void => {
    child.kill(signal);
    if (stopping) return;
    stopping = signal;
    const told = childOutcome(outcome);
    if (told.wrote !== null) {
      process.stderr.write(`${process.stderr.isTTY ? '\n' : ''}ssmax-patch: ${signal} after ${told.wrote} was written: finishing with its own outcome\n`);
      return;
    }
    process.stderr.write(`${process.stderr.isTTY ? '\n' : ''}ssmax-patch: stopping ...\n`);
    // An onnxruntime run holds the child's only thread until it ends: past the grace time the child is killed,
    // unless it has written its output meanwhile (then only printing is left, and the outcome is the child's).
    setTimeout(() => {
      if (childOutcome(outcome).wrote === null) child.kill('SIGKILL');
    }, STOP_GRACE_MS).unref();
  };
  const signals = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
  for (const s of signals) process.on(s, forward);
  return new Promise((resolve) => {
    child.on('error', () => resolve(null));
    child.on('close', (code, signal) => {
      for (const s of signals) process.off(s, forward);
      const told = childOutcome(outcome);
      fs.rmSync(scratch, { recursive: true, force: true });
      resolve(code ?? endedBySignal(signal!, stopping, told));
    });
  });
}

interface Outcome { wrote: string | null; exit: number | null }

/** What the child has told of its outcome so far (signals.ts writes it): the output it placed, its exit code. */
function childOutcome(file: string): Outcome {
  let text = '';
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    // not written yet: nothing told
  }
  const wrote = /^wrote (.*)$/m.exec(text);
  const exit = /^exit (\d+)$/m.exec(text);
  return { wrote: wrote ? wrote[1] : null, exit: exit ? Number(exit[1]) : null };
}

/**
 * The exit code of a child a signal ended: 128 + the signal only when it had not finished and had written
 * nothing. A child that had decided its exit code (the signal came as it was exiting) ends with that code.
 */
function endedBySignal(signal: NodeJS.Signals, stopping: NodeJS.Signals | null, told: Outcome): number {
  if (told.exit !== null) return told.exit;
  if (told.wrote !== null) {
    process.stderr.write(`ssmax-patch: ${signal} ended the run after it wrote ${told.wrote}: that file is complete, but its report files may be missing\n`);
    return 128 + constants.signals[signal];
  }
  if (stopping && signal === 'SIGKILL') {
    process.stderr.write(`ssmax-patch: interrupted by ${stopping}: onnxruntime stopped mid-run, its temporary files removed\n`);
    return 128 + constants.signals[stopping];
  }
  return 128 + constants.signals[signal];
}
