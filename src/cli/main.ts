/**
 * The ssmax-patch command line: subcommands patch (the default: `ssmax-patch MODEL` patches), verify, revert and
 * calibrate.
 * Every failure ends here as one line on stderr (and, with --json, a report on stdout) and an exit code:
 * 1 a failed verification, 2 a usage or input error, 3 a bug.
 */
import { Command, CommanderError } from 'commander';
import { calibrateCommand, calibrateProgram } from './calibrate-command';
import { oneLine, SsmaxError } from '../errors';
import { VERSION } from '../version';
import { rejectEmptyValues } from './parse';
import { patchCommand, patchProgram } from './patch-command';
import { CommandName, documentJson, settle } from './report';
import { revertCommand, revertProgram } from './revert-command';
import { Run } from './run';
import { cleanUpOnSignals } from './signals';
import { verifyCommand, verifyProgram } from './verify-command';

const COMMANDS: readonly CommandName[] = ['patch', 'verify', 'revert', 'calibrate'];

const EXAMPLES = `
Examples:
  ssmax-patch model.onnx --train-len 4096                 patch (the same as: ssmax-patch patch model.onnx ...)
  ssmax-patch model.onnx --train-len 4096 --verify --strict --report r.json --junit j.xml
  ssmax-patch verify model.onnx model.ssmax.onnx --strict
  ssmax-patch revert model.ssmax.onnx
  ssmax-patch calibrate model.onnx --train-len 4096        the slope preset, s chosen for 8·L from the model's attention
A model file named like a command: ssmax-patch patch verify (or ./verify).`;

type Action = (args: string[], options: never, run: Run) => Promise<number>;

/** Runs the CLI and returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const run = new Run(commandOf(argv), wantsJson(argv));
  const stopSignals = cleanUpOnSignals();
  try {
    const code = await dispatch(argv, run);
    if (code !== 0 && run.doc.error && run.failureOnStderr) process.stderr.write(`ssmax-patch: ${run.doc.error}\n`);
    return code;
  } catch (err) {
    return fail(err, run);
  } finally {
    stopSignals();
  }
}

async function dispatch(argv: string[], run: Run): Promise<number> {
  let code = 0;
  const program = quiet(new Command('ssmax-patch'))
    .description('Retrofit Scalable-Softmax (softmax((s·ln n)·z)) into the attention of ONNX models, and verify it on onnxruntime')
    .version(VERSION)
    .addHelpText('after', EXAMPLES);
  const add = (name: CommandName, build: (c: Command) => Command, action: Action): void => {
    const cmd = build(quiet(program.command(name, name === 'patch' ? { isDefault: true } : {})));
    cmd.allowExcessArguments(true).action(async (...a: unknown[]) => {
      const self = a[a.length - 1] as Command;
      rejectEmptyValues(self);
      code = await action(self.args, self.opts() as never, run);
    });
  };
  add('patch', patchProgram, patchCommand as Action);
  add('verify', verifyProgram, verifyCommand as Action);
  add('revert', revertProgram, revertCommand as Action);
  add('calibrate', calibrateProgram, calibrateCommand as Action);
  await program.parseAsync(argv, { from: 'user' });
  return code;
}

/** Commander throws instead of exiting, and prints nothing on errors: fail() prints the one line. */
function quiet(cmd: Command): Command {
  return cmd.exitOverride().configureOutput({ outputError: () => undefined }).showSuggestionAfterError(true);
}

function fail(err: unknown, run: Run): number {
  let code: number;
  let message: string;
  if (err instanceof CommanderError) {
    if (err.exitCode === 0) return 0; // --help, --version, help
    code = 2;
    message = err.message.replace(/^error: /, '');
  } else if (err instanceof SsmaxError) {
    code = err.exitCode;
    message = err.cliMessage;
  } else {
    code = 3;
    message = `internal error: ${String((err as Error)?.message ?? err).replace(/^internal error: /, '')} (a bug: please report it with the model)`;
  }
  const line = oneLine(code === 2 ? `${message} (see ssmax-patch ${run.command} --help)` : message);
  settle(run.doc, code, line);
  if (run.json && !run.printed) process.stdout.write(documentJson(run.doc));
  process.stderr.write(`ssmax-patch: ${line}\n`);
  return code;
}

/** The subcommand the arguments name; patch is the default, as commander dispatches it. */
function commandOf(argv: string[]): CommandName {
  return COMMANDS.find((c) => c === argv[0]) ?? 'patch';
}

function wantsJson(argv: string[]): boolean {
  const end = argv.indexOf('--');
  return (end < 0 ? argv : argv.slice(0, end)).includes('--json');
}
