/**
 * The type check every patch passes before it is returned (rewrite/type-check.ts): an inserted node whose inputs
 * break its op's element types (the fp32 factor multiplied into an fp16 tensor) is an internal error, not a file.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DataType } from '../src/io/onnx';
import { checkInsertedTypes } from '../src/rewrite/type-check';
import { f32, model, node, value } from './support/build';

describe('type check of inserted nodes', () => {
  it('Mul(fp16, float) inserted by the patch is an internal error naming the node', () => {
    const m = model({
      nodes: [node('Mul', ['q', 'c'], ['q_scaled'], {}, 'ssmax/L0/apply'), node('Relu', ['q_scaled'], ['y'])],
      inputs: [value('q', DataType.FLOAT16, [2, 3])], outputs: [value('y', DataType.FLOAT16, [2, 3])], initializers: [f32('c', [], [0.5])],
    });
    assert.throws(() => checkInsertedTypes(m), /internal error: inserted node 'ssmax\/L0\/apply' \(Mul\) mixes element types input 0: 10, input 1: 1/);
  });

  it('the same Mul in the model itself (not inserted) is not the patch\'s to judge', () => {
    const m = model({
      nodes: [node('Mul', ['q', 'c'], ['y'], {}, 'user_mul')],
      inputs: [value('q', DataType.FLOAT16, [2, 3])], outputs: [value('y', DataType.FLOAT16, [2, 3])], initializers: [f32('c', [], [0.5])],
    });
    checkInsertedTypes(m);
  });

  it('a Where whose condition is not bool, and a Reshape with an int32 shape, are caught too', () => {
    const m = model({
      nodes: [node('Where', ['q', 'q', 'q'], ['w'], {}, 'ssmax/L0/where'), node('Reshape', ['w', 'shape'], ['y'], {}, 'ssmax/L0/reshape')],
      inputs: [value('q', DataType.FLOAT, [2, 3]), value('shape', DataType.INT32, [1])], outputs: [value('y', DataType.FLOAT, [6])],
    });
    assert.throws(() => checkInsertedTypes(m), /'ssmax\/L0\/where' \(Where\) reads element type 1 at input 0, where it needs 9/);
  });
});
