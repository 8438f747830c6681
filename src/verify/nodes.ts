/** Small builders for the nodes verification adds to its in-memory copies of a model. */
import { makeTensor } from '../graph/tensor';
import { Graph } from '../graph/graph';
import { formAt } from '../graph/ops';
import { AttributeProto, AttributeType, DataType, NodeProto, TensorProto } from '../io/onnx';

/** Every name verification adds starts with this, so nothing it adds can be mistaken for the model's or the patch's. */
export const PREFIX = 'ssmax_verify/';

export function attribute(name: string, v: number | number[] | TensorProto): AttributeProto {
  const base = { name, floats: [], ints: [], strings: [], tensors: [], graphs: [] };
  if (Array.isArray(v)) return { ...base, type: AttributeType.INTS, ints: v };
  if (typeof v === 'number') return { ...base, type: AttributeType.INT, i: v };
  return { ...base, type: AttributeType.TENSOR, t: v };
}

/** A node named after its output, in the default domain. */
export function node(opType: string, input: string[], output: string, attrs: Record<string, number | number[] | TensorProto> = {}): NodeProto {
  return { opType, domain: '', input, output: [output], name: output, attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)) };
}

/**
 * A default-domain node in the form of `opset` (int-list attributes such as axes given as attributes; graph/ops.ts
 * formAt moves them to inputs where the opset has them there), after the Constant nodes those inputs need.
 */
export function versionedNodes(graph: Graph, opType: string, input: string[], output: string, opset: number,
  attrs: Record<string, number | number[] | TensorProto> = {}): NodeProto[] {
  const constants: NodeProto[] = [];
  const form = formAt(opType, opset, input, attrs, (attr, values) => {
    const c = constant(graph, `${output.replace(PREFIX, '')}/${attr}`, DataType.INT64, [values.length], values);
    constants.push(c);
    return c.output[0];
  });
  return [...constants, node(opType, form.inputs, output, form.attrs)];
}

/** A constant as a Constant node (valid in every graph: main, subgraph, function body). */
export function constant(graph: Graph, base: string, dataType: number, dims: number[], values: number[]): NodeProto {
  const out = graph.uniqueName(`${PREFIX}${base}`);
  return node('Constant', [], out, { value: makeTensor('', dataType, dims, values) });
}

/**
 * The last `count` rows (axis −2) of `x`, as nodes to add (Slice takes a negative axis from opset 11). Returns the
 * nodes and the sliced tensor (null: the rank an older opset needs is unknown).
 */
export function lastRows(graph: Graph, x: string, opset: number, rank: number | undefined,
  count: number): { nodes: NodeProto[]; out: string } | null {
  if (opset < 11 && rank === undefined) return null;
  const out = graph.uniqueName(`${PREFIX}${x}/last_rows`);
  const axis = opset >= 11 ? -2 : rank! - 2;
  return { nodes: versionedNodes(graph, 'Slice', [x], out, opset, { starts: [-count], ends: [2 ** 62], axes: [axis] }), out };
}
