/**
 * Inserted ops by what they compute; the Builder writes each in the form of the scope's opset (axes as an input
 * from opset 13 for Unsqueeze, Squeeze and ReduceSum, from 18 for ReduceMax and ReduceMin: graph/ops.ts formAt).
 */
import { Builder } from './builder';

export function unsqueeze(b: Builder, x: string, axes: number[], name: string): string {
  return b.op('Unsqueeze', [x], { axes }, name);
}

export function squeeze(b: Builder, x: string, axes: number[], name: string): string {
  return b.op('Squeeze', [x], { axes }, name);
}

/** Sum over the last axis; `keep`: keep it as size 1. */
export function sumLastAxis(b: Builder, x: string, keep: boolean, name: string): string {
  return b.op('ReduceSum', [x], { axes: [-1], keepdims: keep ? 1 : 0 }, name);
}

/** Max or min over the last axis, kept as size 1. */
export function extremeLastAxis(b: Builder, x: string, op: 'ReduceMax' | 'ReduceMin', name: string): string {
  return b.op(op, [x], { axes: [-1], keepdims: 1 }, name);
}
