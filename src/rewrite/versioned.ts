/**
 * Inserted ops whose form depends on the opset: axes became inputs at opset 13 (Unsqueeze, Squeeze, ReduceSum).
 * Every op the patch inserts exists from opset 11 on; patch.ts raises older opsets or refuses (see opset.ts).
 */
import { Builder } from './builder';

export function unsqueeze(b: Builder, x: string, axes: number[], opset: number, name: string): string {
  return opset >= 13 ? b.op('Unsqueeze', [x, b.int64('axes', axes)], {}, name) : b.op('Unsqueeze', [x], { axes }, name);
}

export function squeeze(b: Builder, x: string, axes: number[], opset: number, name: string): string {
  return opset >= 13 ? b.op('Squeeze', [x, b.int64('axes', axes)], {}, name) : b.op('Squeeze', [x], { axes }, name);
}

/** Sum over the last axis; `keep`: keep it as size 1. */
export function sumLastAxis(b: Builder, x: string, opset: number, keep: boolean, name: string): string {
  const keepdims = keep ? 1 : 0;
  return opset >= 13
    ? b.op('ReduceSum', [x, b.int64('key_axis', [-1])], { keepdims }, name)
    : b.op('ReduceSum', [x], { axes: [-1], keepdims }, name);
}

/** Max or min over the last axis, kept as size 1 (axes became an input of ReduceMax and ReduceMin at opset 18). */
export function extremeLastAxis(b: Builder, x: string, op: 'ReduceMax' | 'ReduceMin', opset: number, name: string): string {
  return opset >= 18
    ? b.op(op, [x, b.int64('key_axis', [-1])], { keepdims: 1 }, name)
    : b.op(op, [x], { axes: [-1], keepdims: 1 }, name);
}
