/**
 * Strict option values. Number('') is 0, Number(' 64 ') is 64 and Number('0x40') is 64: a typo would pass as a
 * number nobody meant, so integers are decimal digits only and numbers plain or scientific decimals.
 */
import { Command } from 'commander';
import { InputError } from '../errors';

const INTEGER = /^[0-9]+$/;
const REAL = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/;

/** Collects the values of a repeatable option. */
export const collect = (v: string, all: string[] = []): string[] => [...all, v];

export function optionalInteger(v: string | undefined, flag: string, min: number): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (!INTEGER.test(v) || !Number.isSafeInteger(x) || x < min) throw new InputError(`${flag}: expected an integer ≥ ${min}, got '${v}'`, 'usage');
  return x;
}

/** A finite decimal number (1.5, -2, 1e-4); `min` rejects smaller values. */
export function optionalReal(v: string | undefined, flag: string, min = -Infinity): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (!REAL.test(v) || !Number.isFinite(x)) throw new InputError(`${flag}: expected a number, got '${v}'`, 'usage');
  if (x < min) throw new InputError(`${flag}: expected a number ≥ ${min}, got '${v}'`, 'usage');
  return x;
}

/** A comma-separated list without empty items ("16,,64" and "16," are errors, not 16 and 64). */
export function listValue(v: string, flag: string): string[] {
  const items = v.split(',').map((t) => t.trim());
  if (items.some((t) => t === '')) throw new InputError(`${flag}: empty item in '${v}'`, 'usage');
  return items;
}

/**
 * An option that takes one value, given twice, is an error: commander would keep the last value silently
 * (`--s 0.3 --s 0.4`). Flags given twice mean the same as once; options that collect values are repeatable.
 */
export function rejectRepeatedOptions(cmd: Command): void {
  const seen = new Map<string, string>();
  for (const option of cmd.options) {
    if (option.isBoolean() || option.parseArg === collect) continue;
    const name = option.name();
    cmd.on(`option:${name}`, (value: string) => {
      const first = seen.get(name);
      if (first !== undefined) throw new InputError(`${option.long}: given twice ('${first}', then '${value}'); it takes one value`, 'usage');
      seen.set(name, value);
    });
  }
}

/** `--s ""` is an error, not 0 (or a silently ignored option): every option value must be non-empty. */
export function rejectEmptyValues(cmd: Command): void {
  const values = cmd.opts() as Record<string, unknown>;
  for (const option of cmd.options) {
    const value = values[option.attributeName()];
    const empty = value === '' || (Array.isArray(value) && value.some((x) => x === ''));
    if (empty) throw new InputError(`${option.long ?? option.short}: empty value`, 'usage');
  }
}

/** Every positional argument after the ones a command takes is an error, with what the user probably meant. */
export function rejectExtraArguments(args: string[], expected: number, what: string, hint = ''): void {
  if (args.length <= expected) return;
  const extra = args.slice(expected).map((a) => `'${a}'`).join(', ');
  throw new InputError(`unexpected argument ${extra}: ${what}${hint}`, 'usage');
}

/** `NAME=VALUE` items of a repeatable option, each with both sides non-empty. */
export function pairs(list: string[], flag: string, what: string): [string, string][] {
  return list.map((item) => {
    const eq = item.indexOf('=');
    if (eq <= 0 || eq === item.length - 1) throw new InputError(`${flag} ${item}: expected ${what}`, 'usage');
    return [item.slice(0, eq), item.slice(eq + 1)];
  });
}

/** `--dim NAME=SIZE` items as sizes by dim name. */
export function dimsValue(list: string[]): Record<string, number> {
  return Object.fromEntries(pairs(list, '--dim', 'name=size').map(([k, v]) => [k, optionalInteger(v, `--dim ${k}`, 0)!]));
}
