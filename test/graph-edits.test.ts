/**
 * Graph's edit methods keep its index live: after every edit the producers, consumers, outputs and declarations
 * are what a fresh index of the edited GraphProto says. Verification's exposer and revert edit only through them.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { DataType, GraphProto, NodeProto } from '../src/io/onnx';
import { node, value } from './support/build';

/** The index as comparable data: consumer lists as sorted names (their order is the edits', not the file's). */
function indexOf(g: Graph): unknown {
  const names = (nodes: NodeProto[]): string[] => nodes.map((n) => n.name).sort();
  return {
    producer: [...g.producer].map(([t, n]) => [t, n.name]).sort(),
    consumers: [...g.consumers].map(([t, ns]) => [t, names(ns)]).filter(([, ns]) => ns.length).sort(),
    outputs: [...g.outputs].sort(),
    valueInfo: [...g.valueInfo].map(([t, v]) => [t, v.type?.tensorType?.elemType ?? null]).sort(),
  };
}

function assertLive(g: Graph): void {
  assert.deepEqual(indexOf(g), indexOf(new Graph(g.proto)));
}

/** x → A → a → B → b (graph output), and a → C → c with c declared in value_info as fp16. */
function chain(): Graph {
  const proto: GraphProto = {
    name: 'g', initializer: [], input: [value('x', DataType.FLOAT, [2])], output: [value('b', DataType.FLOAT, [2])],
    valueInfo: [value('c', DataType.FLOAT16, [2])],
    node: [node('Relu', ['x'], ['a'], {}, 'A'), node('Neg', ['a'], ['b'], {}, 'B'), node('Abs', ['a'], ['c'], {}, 'C')],
  };
  return new Graph(proto);
}

describe('Graph edits keep the index live', () => {
  it('addOutput: a new output, its value_info entry still telling its type', () => {
    const g = chain();
    g.addOutput({ name: 'c' });
    g.addOutput({ name: 'a', type: { tensorType: { elemType: DataType.FLOAT } } });
    assert.deepEqual(g.proto.output.map((o) => o.name), ['b', 'c', 'a']);
    assert.equal(g.elemType('c'), DataType.FLOAT16);
    assert.equal(g.elemType('a'), DataType.FLOAT);
    assertLive(g);
  });

  it('removeValueInfo: the entry goes, an output declaration of the name stands', () => {
    const g = chain();
    g.proto.valueInfo.push(value('b', DataType.FLOAT16, [2]));
    g.reindex();
    g.removeValueInfo(new Set(['b', 'c']));
    assert.deepEqual(g.proto.valueInfo, []);
    assert.equal(g.elemType('b'), DataType.FLOAT);
    assert.equal(g.elemType('c'), undefined);
    assertLive(g);
  });

  it('setOutput: a new output after skipped ones, and a renamed one', () => {
    const g = chain();
    const c = g.nodes[2];
    g.setOutput(c, 2, 'c2');
    assert.deepEqual(c.output, ['c', '', 'c2']);
    g.setOutput(c, 0, 'c0');
    assert.equal(g.producer.get('c'), undefined);
    assert.equal(g.producer.get('c0'), c);
    assertLive(g);
  });

  it('redirect and truncateInputs: readers move, dropped inputs stop reading', () => {
    const g = chain();
    g.redirect('a', 'x');
    assert.deepEqual(g.nodes.map((n) => n.input), [['x'], ['x'], ['x']]);
    assert.deepEqual(g.consumersOf('a'), []);
    const b = g.nodes[1];
    g.setInput(b, 2, 'a');
    assert.deepEqual(b.input, ['x', '', 'a']);
    g.truncateInputs(b, 1);
    assert.deepEqual(b.input, ['x']);
    assert.deepEqual(g.consumersOf('a'), []);
    assertLive(g);
  });

  it('reorderNodes: the same nodes in another order, and nothing else', () => {
    const g = chain();
    const [a, b, c] = g.nodes;
    g.reorderNodes([a, c, b]);
    assert.deepEqual(g.nodes.map((n) => n.name), ['A', 'C', 'B']);
    assertLive(g);
    assert.throws(() => g.reorderNodes([a, c, c]), /not of the graph's nodes/);
    assert.throws(() => g.reorderNodes([a, c]), /not of the graph's nodes/);
    assert.throws(() => g.reorderNodes([a, b, node('Relu', ['x'], ['z'])]), /not of the graph's nodes/);
  });
});
