/**
 * Each option a library message can name, as the library calls it and as the command line spells it. Library
 * messages name options through opt(), so an API caller reads `option trainLen` and a CLI user `--train-len`.
 */
const OPTIONS: Record<string, [string, string]> = {
  s: ['s', '--s'], sOrFile: ['s', '--s or --s-file'], trainLen: ['trainLen', '--train-len'], sFile: ['sFile', '--s-file'], n: ['n', '--n'], updateS: ['updateS', '--update-s'],
  force: ['force', '--force-site'], preset: ['preset', '--preset'], b: ['b', '--b'], floorScale: ['floorScale', '--floor-scale'],
  attnScale: ['attnScale', '--attn-scale'], layers: ['layers', '--layers'],
  dims: ['dims', '--dim'], inputFiles: ['inputFiles', '--input'], inputs: ['inputs', '--input'], maxLen: ['maxLen', '--max-len'], lengths: ['lengths', '--lengths'],
  checks: ['checks', '--checks'], batch: ['batch', '--batch'], atol: ['atol', '--atol'], rtol: ['rtol', '--rtol'],
  externalData: ['externalData', '--external-data'], overwrite: ['force', '--force'], prior: ['prior', '--prior'],
  priorFile: ['priorFile', '--prior-file'],
  // calibrate (src/calibrate/)
  targetLen: ['targetLen', '--max-len'], match: ['match', '--match'], granularity: ['granularity', '--per'], maxRuns: ['maxRuns', '--max-runs'], maxS: ['maxS', '--max-s'],
};

const MARK = '\u2060';
const VALUE = '\u2061';
const TOKEN = new RegExp(`${MARK}([A-Za-z_]+)(?:${VALUE}([^${MARK}]*))?${MARK}`, 'g');

/** An option named in a message, optionally with a value: `opt('dims', 'seq=128')`. */
export function opt(name: keyof typeof OPTIONS, value?: string): string {
  return `${MARK}${name}${value === undefined ? '' : `${VALUE}${value}`}${MARK}`;
}

/** A message as an API caller reads it (`option dims (seq=128)`) or as the CLI prints it (`--dim seq=128`). */
export function render(message: string, audience: 'api' | 'cli'): string {
  return message.replace(TOKEN, (_m, name: string, value?: string) => {
    const [api, cli] = OPTIONS[name] ?? [name, `--${name}`];
    return audience === 'cli' ? `${cli}${value === undefined ? '' : ` ${value}`}` : `option ${api}${value === undefined ? '' : ` (${value})`}`;
  });
}

/** Errors that reach the user as one line and an exit code, never as a stack trace. */
export class SsmaxError extends Error {
  /** The message with options named by their command-line flags. */
  readonly cliMessage: string;

  /** `raw`: the message with its option tokens, to be prefixed by a caller that adds context. */
  constructor(readonly raw: string, readonly exitCode: number) {
    super(oneLine(render(raw, 'api')));
    this.cliMessage = oneLine(render(raw, 'cli'));
    this.name = new.target.name;
  }
}

/** Bad model file, bad option value, nothing to patch: exit code 2. */
export class InputError extends SsmaxError {
  constructor(message: string) {
    super(message, 2);
  }
}

/** A verification check failed: exit code 1. */
export class VerificationError extends SsmaxError {
  constructor(message: string) {
    super(message, 1);
  }
}

const MAX_MESSAGE = 1000;

/**
 * Messages quote names taken from the model, which may hold anything: control characters are escaped so
 * the message stays one line, and a message is cut at MAX_MESSAGE characters.
 */
export function oneLine(message: string): string {
  // eslint-disable-next-line no-control-regex
  const clean = message.replace(/[\u0000-\u001f\u007f\u2028\u2029\u2060\u2061]/g, (c) => (c === '\n' ? '\\n' : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`));
  return clean.length > MAX_MESSAGE ? `${clean.slice(0, MAX_MESSAGE)}…` : clean;
}
