/**
 * Reading one node: its attributes and the graphs it holds. Nothing here needs a Graph, so the modules graph.ts
 * itself loads (ops.ts, shape-rules.ts, toposort.ts) read nodes from here without importing graph.ts back.
 */
import { AttributeProto, AttributeType, GraphProto, NodeProto, toNumber } from '../io/onnx';

export function attr(node: NodeProto, name: string): AttributeProto | undefined {
  return node.attribute.find((a) => a.name === name);
}

export function attrInt(node: NodeProto, name: string): number | undefined {
  const a = attr(node, name);
  return a && (a.type === AttributeType.INT || a.i !== undefined) ? toNumber(a.i) : undefined;
}

export function attrInts(node: NodeProto, name: string): number[] | undefined {
  const a = attr(node, name);
  return a ? a.ints.map(toNumber) : undefined;
}

export function attrFloat(node: NodeProto, name: string): number | undefined {
  return attr(node, name)?.f;
}

/** Every graph held in a node's attributes (If branches, Loop/Scan bodies, contrib-op subgraphs). */
export function subgraphsOf(node: NodeProto): GraphProto[] {
  return node.attribute.flatMap((a) => [...(a.g ? [a.g] : []), ...(a.graphs ?? [])]);
}
