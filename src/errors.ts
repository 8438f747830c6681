/** Errors that reach the user as one line and an exit code, never as a stack trace. */
export class SsmaxError extends Error {
  constructor(message: string, readonly exitCode: number) {
    super(oneLine(message));
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
  const clean = message.replace(/[\u0000-\u001f\u007f\u2028\u2029]/g, (c) => (c === '\n' ? '\\n' : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`));
  return clean.length > MAX_MESSAGE ? `${clean.slice(0, MAX_MESSAGE)}…` : clean;
}
