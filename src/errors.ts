/** Errors that reach the user as one line and an exit code, never as a stack trace. */
export class SsmaxError extends Error {
  constructor(message: string, readonly exitCode: number) {
    super(message);
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
