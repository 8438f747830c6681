/**
 * Each option a library message can name, as the library calls it and as the command line spells it. Library
 * messages name options through opt(), so an API caller reads `option trainLen` and a CLI user `--train-len`.
 */
const OPTIONS: Record<string, [string, string]> = {
  s: ['s', '--s'], sOrFile: ['s', '--s or --s-file'], trainLen: ['trainLen', '--train-len'], sFile: ['sFile', '--s-file'], n: ['n', '--n'], updateS: ['updateS', '--update-s'],
  force: ['force', '--force-site'], preset: ['preset', '--preset'], b: ['b', '--b'], floorScale: ['floorScale', '--floor-scale'],
  attnScale: ['attnScale', '--attn-scale'], layers: ['layers', '--layers'], fusedAttention: ['fusedAttention', '--fused-attention'], cacheLayout: ['cacheLayout', '--cache-layout'],
  dims: ['dims', '--dim'], inputFiles: ['inputFiles', '--input'], inputs: ['inputs', '--input'], maxLen: ['maxLen', '--max-len'], lengths: ['lengths', '--lengths'],
  maxMemory: ['maxMemory', '--max-memory'],
  checks: ['checks', '--checks'], batch: ['batch', '--batch'], atol: ['atol', '--atol'], rtol: ['rtol', '--rtol'],
  externalData: ['externalData', '--external-data'], overwrite: ['force', '--force'], prior: ['prior', '--prior'],
  priorFile: ['priorFile', '--prior-file'], window: ['window', '--window'], sinks: ['sinks', '--sinks'],
  rope: ['rope', '--rope'], ropeScale: ['ropeScale', '--rope-scale'],
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

/** Every message in a report (strings at any depth of plain objects and arrays) with options named for its reader. */
export function rendered<T>(value: T, audience: 'api' | 'cli'): T {
  if (typeof value === 'string') return render(value, audience) as T;
  if (Array.isArray(value)) return value.map((v) => rendered(v, audience)) as T;
  if (value && typeof value === 'object' && !(value instanceof Map) && !(value instanceof Set) && !ArrayBuffer.isView(value)) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, rendered(v, audience)])) as T;
  }
  return value;
}

/**
 * What went wrong, in words a pipeline can branch on (stable across versions), and the exit code each gives at the
 * command line. The exit-code table of docs/cli.md and docs/report.schema.json list the same codes.
 */
export const ERROR_CODES = {
  /** A bad option, option value, argument or combination, for the CLI as for the library. */
  usage: 2,
  /** A file cannot be read or written: missing, a folder, no permission, a full disk, changed while being read. */
  io: 2,
  /** The output exists and overwriting it was not asked for (--force). */
  'output-exists': 2,
  /** Not an ONNX model this tool reads (truncated, corrupt, another format), or its graph is invalid. */
  'bad-model': 2,
  /** External data missing, too short, or where it cannot be placed. */
  'bad-external-data': 2,
  /** Too large for one protobuf (2 GB) where the model must be one. */
  'too-large': 2,
  /** No attention in the model: nothing to patch. Exit 4, so that a loop over models can skip these. */
  'no-attention': 4,
  /** Attention found, but every node was refused (--force-site patches one anyway). */
  'attention-refused': 2,
  /** The model's attention cannot take the patch as asked (its opset, an unknown head count or mask layout). */
  'cannot-patch': 2,
  /** The model is patched already (--update-s replaces s). */
  'already-patched': 2,
  /** revert: the patch cannot be taken out (the model was edited after patching). */
  'cannot-revert': 2,
  /** The model has no patch of this tool to revert, update or verify. */
  'not-patched': 2,
  /** verify: the patched model is not a patch of the original given. */
  'wrong-original': 2,
  /** Verification needs onnxruntime, which cannot be loaded. */
  'no-runtime': 2,
  /** Verification cannot run this model: inputs it cannot make, an original that fails on them or does not load. */
  'cannot-verify': 2,
  /** A verification check failed. */
  'verify-failed': 1,
  /** --strict: a check was skipped or an attention node refused. */
  'strict-failed': 1,
  /** calibrate: no s reaches the target (attention that does not fade, or out of reach); no model written. */
  'calibrate-failed': 1,
  /** A bug of this tool. */
  internal: 3,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

/** The codes an InputError takes: every code but the verdicts of a verification and a bug. */
export type InputErrorCode = Exclude<ErrorCode, 'verify-failed' | 'strict-failed' | 'calibrate-failed' | 'internal'>;

/**
 * Each error's message with its option tokens (invisible characters), kept off the error object so that a user who
 * prints or inspects an error sees plain text only.
 */
const TEMPLATES = new WeakMap<SsmaxError, string>();

/** Errors that reach the user as one line and an exit code, never as a stack trace. */
export class SsmaxError extends Error {
  /** The message with options named by their command-line flags. */
  readonly cliMessage: string;
  /** The exit code of the command line, from the code. */
  readonly exitCode: number;

  /** `template`: the message with its option tokens (opt()). */
  constructor(template: string, readonly code: ErrorCode) {
    super(oneLine(render(template, 'api')));
    TEMPLATES.set(this, template);
    this.cliMessage = oneLine(render(template, 'cli'));
    this.exitCode = ERROR_CODES[code];
    this.name = new.target.name;
  }
}

/** The same error with context before its message, options still named for each audience. */
export function prefixed(prefix: string, e: InputError): InputError {
  return new InputError(`${prefix}${TEMPLATES.get(e) ?? e.message}`, e.code);
}

/** Bad model file, bad option value, nothing to patch: exit code 2 (4 for no-attention). */
export class InputError extends SsmaxError {
  declare readonly code: InputErrorCode;

  constructor(message: string, code: InputErrorCode) {
    super(message, code);
  }
}

/** A verification check failed: exit code 1. */
export class VerificationError extends SsmaxError {
  constructor(message: string) {
    super(message, 'verify-failed');
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
