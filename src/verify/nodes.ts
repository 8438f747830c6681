/** Small builders for the nodes verification adds to its in-memory copies of a model. */
import { makeTensor } from '../graph/tensor';
import { Graph } from '../graph/graph';
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

/** A constant as a Constant node (valid in every graph: main, subgraph, function body). */
export function constant(graph: Graph, base: string, dataType: number, dims: number[], values: number[]): NodeProto {
  const out = graph.uniqueName(`${PREFIX}${base}`);
  return node('Constant', [], out, { value: makeTensor('', dataType, dims, values) });
}

/**
 * The last `count` rows (axis −2) of `x`, as nodes to add: Slice with inputs from opset 10, attributes before.
 * Returns the nodes and the sliced tensor (null: the rank an old opset needs is unknown).
 */
export function lastRows(graph: Graph, x: string, opset: number, rank: number | undefined,
  count: number): { nodes: NodeProto[]; out: string } | null {
  const out = graph.uniqueName(`${PREFIX}${x}/last_rows`);
  if (opset >= 10 && (opset >= 11 || rank !== undefined)) {
    const axis = opset >= 11 ? -2 : rank! - 2;
    const k = (base: string, v: number[]): NodeProto => constant(graph, `${x}/${base}`, DataType.INT64, [1], v);
    const [starts, ends, axes] = [k('starts', [-count]), k('ends', [2 ** 62]), k('axes', [axis])];
    return { nodes: [starts, ends, axes, node('Slice', [x, starts.output[0], ends.output[0], axes.output[0]], out)], out };
  }
  if (rank === undefined) return null;
  return { nodes: [node('Slice', [x], out, { starts: [-count], ends: [2 ** 62], axes: [rank - 2] })], out };
}
