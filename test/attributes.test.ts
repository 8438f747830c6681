/**
 * Attribute readers (graph/node.ts) go by the attribute's type. A decoded attribute has every value field, the
 * unset ones reading as their defaults (i = 0, f = 0, ints = []), so a reader that only looked for a value read a
 * FLOAT epsilon as the INT 0 and an INT as an empty INTS list.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { attrFloat, attrInt, attrInts } from '../src/graph/node';
import { parseModel, serializeModel } from '../src/io/model-file';
import { DataType, NodeProto } from '../src/io/onnx';
import { model, node, value } from './support/build';

/** One node with a FLOAT, an INT, an INTS and an empty INTS attribute, as read back from its bytes. */
function decoded(): NodeProto {
  const n = node('LayerNormalization', ['x', 'scale'], ['y'], { epsilon: 0.25, axis: -1, perm: [2, 0, 1], empty: [] });
  const m = model({ nodes: [n], inputs: [value('x', DataType.FLOAT, [2, 3]), value('scale', DataType.FLOAT, [3])], outputs: [value('y', DataType.FLOAT, [2, 3])] });
  return parseModel(serializeModel(m), 'attributes').graph!.node[0];
}

describe('attribute readers', () => {
  it('read an attribute of their own type', () => {
    const n = decoded();
    assert.equal(attrFloat(n, 'epsilon'), 0.25);
    assert.equal(attrInt(n, 'axis'), -1);
    assert.deepEqual(attrInts(n, 'perm'), [2, 0, 1]);
    assert.deepEqual(attrInts(n, 'empty'), []);
  });

  it('read nothing from an attribute of another type, though its other value fields read as defaults', () => {
    const n = decoded();
    const epsilon = n.attribute.find((a) => a.name === 'epsilon')!;
    assert.equal(Number(epsilon.i), 0, 'the decoded FLOAT attribute has an INT field reading 0');
    assert.equal(attrInt(n, 'epsilon'), undefined);
    assert.equal(attrInts(n, 'epsilon'), undefined);
    assert.equal(attrFloat(n, 'axis'), undefined);
    assert.equal(attrInts(n, 'axis'), undefined);
    assert.equal(attrInt(n, 'perm'), undefined);
    assert.equal(attrFloat(n, 'perm'), undefined);
  });

  it('read nothing from an absent attribute', () => {
    const n = decoded();
    assert.equal(attrInt(n, 'stash_type'), undefined);
    assert.equal(attrInts(n, 'axes'), undefined);
    assert.equal(attrFloat(n, 'alpha'), undefined);
  });
});
