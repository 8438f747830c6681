/**
 * The ssmax-patch command line: subcommands patch (the default: `ssmax-patch MODEL` patches), verify, revert and
 * calibrate.
 * Every failure ends here as one line on stderr (and, with --json, a report on stdout with the error's code) and
 * an exit code: 1 a failed verification, 2 a usage or input error, 3 a bug, 4 no attention to patch.
 */
import { Command, CommanderError } from 'commander';
import { calibrateCommand, calibrateProgram } from './calibrate-command';
import { ERROR_CODES, ErrorCode, InputError, oneLine, SsmaxError } from '../errors';
import { VERSION } from '../version';
import { rejectEmptyValues, rejectRepeatedOptions } from './parse';
import { patchCommand, patchProgram } from './patch-command';
import { documentOf, Outcome } from './outcome';
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
A model file named like a command: ssmax-patch patch verify (or ./verify).
Exit codes: 0 done; 1 a verification check failed (or --strict found something unverified); 2 usage or input
error; 3 a bug; 4 no attention to patch. With --json, the report's error.code says which error.`;

/** A command's outcome, or null when it printed its own answer (patch --explain). */
type Action = (args: string[], options: never, run: Run) => Promise<Outcome | null>;

/** Runs the CLI and returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const run = new Run(commandOf(argv), wantsJson(argv));
  const stopSignals = cleanUpOnSignals();
  let code = 3;
  try {
    code = await dispatch(argv, run);
  } catch (err) {
    code = fail(err, run, argv[0] === 'help' ? 'ssmax-patch --help' : `ssmax-patch ${run.command} --help`);
  } finally {
    stopSignals(code);
  }
  return code;
}

async function dispatch(argv: string[], run: Run): Promise<number> {
  let code = 0;
  const program = quiet(new Command('ssmax-patch'))
    .description('Retrofit Scalable-Softmax (softmax((s·ln n)·z)) into the attention of ONNX models, and verify it on onnxruntime')
    .version(VERSION)
    .addHelpText('after', EXAMPLES);
  const add = (name: CommandName, build: (c: Command) => Command, action: Action): void => {
    const cmd = build(quiet(program.command(name, name === 'patch' ? { isDefault: true } : {})));
    rejectRepeatedOptions(cmd);
    cmd.allowExcessArguments(true).action(async (...a: unknown[]) => {
      const self = a[a.length - 1] as Command;
      rejectEmptyValues(self);
      const outcome = await action(self.args, self.opts() as never, run);
      code = outcome ? run.show(outcome) : 0;
    });
  };
  add('patch', patchProgram, patchCommand as Action);
  add('verify', verifyProgram, verifyCommand as Action);
  add('revert', revertProgram, revertCommand as Action);
  add('calibrate', calibrateProgram, calibrateCommand as Action);
  const helped = helpBeforeParsing(argv, program);
  if (helped !== null) return helped;
  await program.parseAsync(argv, { from: 'user' });
  return code;
}

/** The help commander would get wrong, answered here: its exit code, or null to parse the arguments. */
function helpBeforeParsing(argv: string[], program: Command): number | null {
  // Bare, it is asked what it is: the help, on stderr with exit 2, since a script whose model variable came out
  // empty (ssmax-patch $MODEL) must not pass as a success.
  if (argv.length === 0) {
    program.outputHelp({ error: true });
    return 2;
  }
  // commander's own help command has no help: it would print the whole help as an error, then "(outputHelp)".
  if (argv[0] === 'help' && argv[1] === 'help') {
    program.outputHelp();
    return 0;
  }
  refuseUnknownHelpTopic(argv);
  return null;
}

/** Commander throws instead of exiting, and prints nothing on errors: fail() prints the one line. */
function quiet(cmd: Command): Command {
  return cmd.exitOverride().configureOutput({ outputError: () => undefined }).showSuggestionAfterError(true);
}

/** commander answers `help bogus` with the whole help on stderr and an "(outputHelp)" error: one line instead. */
function refuseUnknownHelpTopic(argv: string[]): void {
  const topic = argv[0] === 'help' ? argv[1] : undefined;
  if (topic !== undefined && !(COMMANDS as readonly string[]).includes(topic)) {
    throw new InputError(`unknown command '${topic}' (commands: ${COMMANDS.join(', ')})`, 'usage');
  }
}

/** Prints the failure (with `help`, the command whose help to see) and returns its exit code; 0 for --help and --version. */
function fail(err: unknown, run: Run, help: string): number {
  const error = errorOf(err);
  if (!error) return 0;
  const exit = ERROR_CODES[error.code];
  const line = oneLine(exit === 2 ? `${error.message} (see ${help})` : error.message);
  const doc = documentOf(run.known, run.command);
  settle(doc, error.code, line);
  if (run.json && !run.printed) process.stdout.write(documentJson(doc));
  process.stderr.write(`ssmax-patch: ${line}\n`);
  return exit;
}

function errorOf(err: unknown): { code: ErrorCode; message: string } | null {
  if (err instanceof CommanderError) {
    if (err.exitCode === 0) return null; // --help, --version, help
    // commander puts its suggestion on a second line ('\n(Did you mean --train-len?)'): one line here.
    return { code: 'usage', message: err.message.replace(/^error: /, '').replace(/\s*\n\s*/g, ' ') };
  }
  if (err instanceof SsmaxError) return { code: err.code, message: err.cliMessage };
  const message = String((err as Error)?.message ?? err).replace(/^internal error: /, '');
  return { code: 'internal', message: `internal error: ${message} (a bug: please report it with the model)` };
}

/** The subcommand the arguments name; patch is the default, as commander dispatches it. */
function commandOf(argv: string[]): CommandName {
  return COMMANDS.find((c) => c === argv[0]) ?? 'patch';
}

function wantsJson(argv: string[]): boolean {
  const end = argv.indexOf('--');
  return (end < 0 ? argv : argv.slice(0, end)).includes('--json');
}
