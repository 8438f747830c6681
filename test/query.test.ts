/** Ancestry queries see what a node's subgraphs capture from the enclosing graph (an If reads more than its condition). */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { DataType } from '../src/io/onnx';
import { graphAttr, model, node, value } from './support/build';

function ifModel() {
  const branch = (op: string, out: string) => ({ name: op, node: [node(op, ['x'], [out])], input: [], output: [value(out, DataType.FLOAT, [2])], initializer: [], valueInfo: [] });
  const choose = { ...node('If', ['c'], ['z']), attribute: [graphAttr('then_branch', branch('Neg', 'zt')), graphAttr('else_branch', branch('Abs', 'ze'))] };
  return model({
    nodes: [node('Exp', ['w'], ['x']), choose, node('Relu', ['z'], ['y'])],
    inputs: [value('w', DataType.FLOAT, [2]), value('c', DataType.BOOL, [])], outputs: [value('y', DataType.FLOAT, [2])],
  });
}

describe('ancestry through subgraphs', () => {
  it("an If's output depends on the names its branches capture, not only on its condition", () => {
    const g = new Graph(ifModel().graph!);
    assert.equal(g.query.dependsOn('y', 'x'), true);
    assert.equal(g.query.dependsOn('y', 'w'), true);
    assert.equal(g.query.reachesOp('y', 'Exp'), true);
    assert.equal(g.query.dependsOn('x', 'c'), false);
  });
});
