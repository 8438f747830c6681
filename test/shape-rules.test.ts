/**
 * The shape pass (graph/shapes.ts) leaves a dim unknown only when it grew past what poly.ts tracks; anything else a
 * shape rule throws is a bug in the rule and fails the pass, instead of reading as "unknown shape". So every rule
 * must answer, however odd the node: unknown shapes, scalars, missing inputs, empty, negative and huge constants,
 * axes out of range (Slice of a 1-D value with empty starts, and Split of a scalar, threw here).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Graph } from '../src/graph/graph';
import { OpInfo, OPS } from '../src/graph/ops';
import { DimOverflow, num, Poly, show, sym } from '../src/graph/poly';
import { OutSym, Sym } from '../src/graph/shape-rules';
import { Shapes } from '../src/graph/shapes';
import { makeTensor } from '../src/graph/tensor';
import { AttributeProto, DataType, GraphProto, NodeProto } from '../src/io/onnx';
import { node, value } from './support/build';

function graphOf(nodes: NodeProto[], dims: string[]): GraphProto {
  return { name: 'g', node: nodes, input: [value('x', DataType.FLOAT, dims)], output: [{ name: 'y' }], initializer: [], valueInfo: [] };
}

describe('the shape pass', () => {
  it('leaves a dim past the tracked size unknown, and computes one within it', () => {
    const flat = (rank: number): Shapes => new Shapes(new Graph(graphOf([node('Flatten', ['x'], ['y'], { axis: 0 })], Array.from({ length: rank }, (_, i) => `d${i}`))));
    assert.deepEqual(flat(3).shape('y')?.map(show), ['1', 'd0*d1*d2']);
    // 13 symbols multiplied: past MAX_DEGREE.
    assert.equal(flat(13).rank('y'), undefined);
  });

  it('FusedMatMul: transA / transB swap the operands\' last two axes, so q·kᵀ ends in the keys (not k\'s head dim)', () => {
    // q [B, 2, T, 4], k [B, 2, Tk, 4]: FusedMatMul(q, k, transB=1) is [B, 2, T, Tk] (xe_llama_export_static read 4).
    const ms = (inputs: string[], attrs: Record<string, number>): NodeProto => ({ ...node('FusedMatMul', inputs, ['y'], attrs), domain: 'com.microsoft' });
    const shapes = (n: NodeProto, a: (string | number)[], b: (string | number)[]): string[] | undefined => new Shapes(new Graph({
      name: 'g', node: [n], input: [value('a', DataType.FLOAT, a), value('b', DataType.FLOAT, b)], output: [{ name: 'y' }], initializer: [], valueInfo: [],
    })).shape('y')?.map((d) => (d ? show(d) : '?'));
    assert.deepEqual(shapes(ms(['a', 'b'], { transB: 1, alpha: 0.5 }), ['B', 2, 'T', 4], ['B', 2, 'Tk', 4]), ['B', '2', 'T', 'Tk']);
    assert.deepEqual(shapes(ms(['a', 'b'], { transA: 1, transB: 1 }), ['B', 2, 4, 'T'], ['B', 2, 'Tk', 4]), ['B', '2', 'T', 'Tk']);
    assert.deepEqual(shapes(ms(['a', 'b'], {}), ['B', 2, 'T', 'Tk'], ['B', 2, 'Tk', 4]), ['B', '2', 'T', '4']);
    assert.equal(shapes(ms(['a', 'b'], { transBatchB: 1 }), ['B', 2, 'T', 4], ['B', 2, 'Tk', 4]), undefined);
  });

  it('fails when a rule throws anything but an overflow', () => {
    const table = OPS as Record<string, OpInfo>;
    const saved = table.Relu;
    const g = (): Graph => new Graph(graphOf([node('Relu', ['x'], ['y'])], ['a', 'b']));
    try {
      table.Relu = { shape: (_n, ins) => [{ shape: ins[3].shape }] };
      assert.throws(() => new Shapes(g()), TypeError);
      table.Relu = { shape: () => { throw new DimOverflow(); } };
      assert.equal(new Shapes(g()).rank('y'), undefined);
    } finally {
      table.Relu = saved;
    }
  });
});

describe('every shape rule answers for odd nodes', () => {
  const attr = (name: string, v: number | number[] | string): AttributeProto => node('X', [], [], { [name]: v }).attribute[0];
  const attributes: AttributeProto[][] = [
    [], [attr('axis', 5)], [attr('axis', -9)], [attr('perm', [3, 0])], [attr('perm', [])], [attr('axes', [7])], [attr('axes', [-1, 0])],
    [attr('split', [1])], [attr('equation', 'ij,jk->ik')], [attr('equation', '...ij,...jk')], [attr('transA', 1)],
    [attr('start', -3), attr('end', 99)], [attr('keepdims', 0)], [attr('allowzero', 1)],
  ];
  const shapes: (Poly[] | undefined)[] = [undefined, [], [sym('a')], [sym('a'), num(3)], [num(2), sym('b'), num(4), sym('d')], [num(0)], [num(1), num(1)]];
  const values: (Poly[] | undefined)[] = [undefined, [], [num(2)], [sym('v'), num(-1)]];
  // The constant inputs the rules read from the graph (starts, axes, shapes, repeats).
  const graphs = [[], [0], [-1, 2], [2 ** 40]].map((c) => new Graph({
    name: 'g', node: [], input: [], output: [], valueInfo: [], initializer: [1, 2, 3, 4].map((i) => makeTensor(`x${i}`, DataType.INT64, [c.length], c)),
  }));

  for (const [op, info] of Object.entries(OPS).filter(([, i]) => i.shape)) {
    it(op, () => {
      for (const graph of graphs) for (const inputs of [0, 1, 2, 3, 5]) for (const s of shapes) for (const v of values) for (const w of values) {
        for (const attribute of attributes) {
          const n: NodeProto = { opType: op, domain: '', name: 'n', attribute, input: Array.from({ length: inputs }, (_, i) => `x${i}`), output: ['y0', 'y1'] };
          // Input 0 has the shape and values given; the others are 1-D with the values `w`, or of that shape.
          const ins: Sym[] = n.input.map((_, i) => (i === 0 || !w ? { shape: s, value: v } : { shape: [num(w.length)], value: w }));
          check(op, info, n, ins, graph, `input shape ${s ? `[${s.map(show)}]` : 'unknown'}, values ${v ? `[${v.map(show)}]` : 'unknown'} `
            + `and ${w ? `[${w.map(show)}]` : 'unknown'}`);
        }
      }
    });
  }
});

/** Runs one rule: it answers, or overflows, and what it answers has no hole in its values. */
function check(op: string, info: OpInfo, n: NodeProto, ins: Sym[], graph: Graph, inputs: string): void {
  const where = (): string => `${op} with ${n.input.length} inputs, ${inputs}, attributes ${n.attribute.map((a) => a.name).join(',') || 'none'}, `
    + `constants ${graph.proto.initializer[0]?.dims}`;
  let out: OutSym[];
  try {
    out = info.shape!(n, ins, graph);
  } catch (e) {
    if (e instanceof DimOverflow) return;
    assert.fail(`${where()}: ${(e as Error).message}`);
  }
  // Values are known whole or not at all: a hole would fail the rule that reads them next.
  for (const o of out) if (o.value && !o.value.every((p) => p instanceof Map)) assert.fail(`${where()}: values with a hole`);
}
