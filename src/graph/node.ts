/**
 * Reading one node: its attributes and the graphs it holds. Nothing here needs a Graph, so the modules graph.ts
 * itself loads (ops.ts, shape-rules.ts, toposort.ts) read nodes from here without importing graph.ts back.
 */
import { AttributeProto, AttributeType, GraphProto, NodeProto, toNumber } from '../io/onnx';

export function attr(node: NodeProto, name: string): AttributeProto | undefined {
  return node.attribute.find((a) => a.name === name);
}

/**
 * The attribute's value when it has the type asked for, else undefined. The type decides: a decoded attribute has
 * every value field (an unset one reads as its default, i = 0), so a FLOAT attribute would read as the INT 0.
 */
function typed(node: NodeProto, name: string, type: number): AttributeProto | undefined {
  const a = attr(node, name);
  return a?.type === type ? a : undefined;
}

export function attrInt(node: NodeProto, name: string): number | undefined {
  const a = typed(node, name, AttributeType.INT);
  return a ? toNumber(a.i ?? 0) : undefined;
}

export function attrInts(node: NodeProto, name: string): number[] | undefined {
  return typed(node, name, AttributeType.INTS)?.ints.map(toNumber);
}

export function attrString(node: NodeProto, name: string): string | undefined {
  const a = typed(node, name, AttributeType.STRING);
  return a ? Buffer.from(a.s ?? new Uint8Array()).toString('utf8') : undefined;
}

export function attrFloat(node: NodeProto, name: string): number | undefined {
  const a = typed(node, name, AttributeType.FLOAT);
  return a ? a.f ?? 0 : undefined;
}

/** Every graph held in a node's attributes (If branches, Loop/Scan bodies, contrib-op subgraphs). */
export function subgraphsOf(node: NodeProto): GraphProto[] {
  return node.attribute.flatMap((a) => [...(a.g ? [a.g] : []), ...(a.graphs ?? [])]);
}
