/** Element types of tensors, from declarations and simple per-op rules, for choosing the dtype of inserted ops. */
import { DataType, NodeProto } from '../io/onnx';
import { attr, attrInt, Graph } from './graph';
import { topoOrder } from './toposort';

const boolOps = new Set(['Equal', 'Less', 'Greater', 'LessOrEqual', 'GreaterOrEqual', 'And', 'Or', 'Not', 'Xor', 'IsNaN', 'IsInf']);
const int64Ops = new Set(['Shape', 'Size', 'NonZero', 'ArgMax', 'ArgMin']);

/** `outer`: types already known in the enclosing scope, for the names a subgraph reads from it. */
export function inferElemTypes(graph: Graph, outer?: Map<string, number>): Map<string, number> {
  const types = new Map<string, number>(outer ?? []);
  const typeOf = (name: string): number | undefined => types.get(name) ?? graph.elemType(name);
  for (const node of topoOrder(graph.proto)) {
    const declared = node.output.map((o) => graph.elemType(o));
    const t = ruleType(node, typeOf, graph);
    node.output.forEach((o, i) => {
      const v = declared[i] ?? (i === 0 || node.opType === 'Split' ? t : undefined);
      if (o && v !== undefined) types.set(o, v);
    });
  }
  return types;
}

function ruleType(node: NodeProto, typeOf: (n: string) => number | undefined, graph: Graph): number | undefined {
  if (node.opType === 'Cast') return attrInt(node, 'to');
  if (boolOps.has(node.opType)) return DataType.BOOL;
  if (int64Ops.has(node.opType)) return DataType.INT64;
  if (node.opType === 'Where') return typeOf(node.input[1]) ?? typeOf(node.input[2]);
  if (node.opType === 'Constant') return graph.constValue(node.output[0])?.dataType;
  if (node.opType === 'ConstantOfShape') return attr(node, 'value')?.t?.dataType ?? DataType.FLOAT;
  if (node.opType === 'CastLike') return typeOf(node.input[1]);
  return node.input[0] ? typeOf(node.input[0]) : undefined;
}
