/**
 * Adds nodes and constants to one scope under one name prefix, so every inserted name is unique, through the
 * scope's journalled editor, so every addition can be undone. Each default-domain node is written in the form of
 * the scope's opset (graph/ops.ts formAt): callers give int-list attributes such as axes as attributes.
 */
import { Graph } from '../graph/graph';
import { formAt } from '../graph/ops';
import { makeTensor } from '../graph/tensor';
import { AttributeProto, AttributeType, DataType, GraphProto, NodeProto, TensorProto } from '../io/onnx';
import { Editor, emptyEdits } from './journal';

/** Integers as numbers; a float attribute as `{ float: x }`; a graph (an If branch) as `{ graph: g }`. */
export type AttrValue = number | number[] | string | TensorProto | { float: number } | { graph: GraphProto };

export class Builder {
  /** The node added last (the apply Mul, for callers that name it in the record). */
  last?: NodeProto;

  /**
   * `opset`: the scope's default-domain opset when a node is added (a patch may raise it first, opset.ts).
   * `constantNodes`: constants become Constant nodes (function bodies have no initializers).
   */
  constructor(readonly editor: Editor, readonly prefix: string, private readonly irVersion: number,
    private readonly opset: () => number, private readonly constantNodes = false) {}

  get graph(): Graph {
    return this.editor.graph;
  }

  /** Adds one node and returns its (first) output name. */
  op(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {}, outName?: string): string {
    const output = this.graph.uniqueName(`${this.prefix}${outName ?? opType.toLowerCase()}`);
    this.node(opType, inputs, [output], attrs, '', outName ?? opType);
    return output;
  }

  /**
   * A builder for a new graph to put in a node's attribute (an If branch). Nothing it adds is journalled on its
   * own: the graph goes with the node that holds it. `output` names what the built graph returns; `elemType`, when
   * given, is declared on it (so the type pass knows the If's output).
   */
  branch(name: string, build: (b: Builder) => string, elemType?: number): GraphProto {
    const proto: GraphProto = { node: [], name: this.graph.uniqueName(`${this.prefix}${name}`), initializer: [], input: [], output: [], valueInfo: [] };
    const editor = new Editor(this.graph.child(proto), emptyEdits(proto.name, 'branch'));
    const output = build(new Builder(editor, this.prefix, Math.max(this.irVersion, 4), this.opset, this.constantNodes));
    editor.graph.addOutput(elemType ? { name: output, type: { tensorType: { elemType } } } : { name: output });
    return proto;
  }

  /** Adds a node named `<prefix><name>` that writes the given output names (a replaced node's); `domain` for contrib ops. */
  node(opType: string, inputs: string[], outputs: string[], attrs: Record<string, AttrValue> = {}, domain = '', name = opType): void {
    const form = domain === '' ? formAt(opType, this.opset(), inputs, attrs, (attr, values) => this.int64(attr, values)) : { inputs, attrs };
    this.insert({
      opType, domain, input: form.inputs, output: outputs, name: this.graph.uniqueNodeName(`${this.prefix}${name}`),
      attribute: Object.entries(form.attrs).map(([key, v]) => makeAttribute(key, v)),
    });
  }

  constant(name: string, dataType: number, dims: number[], values: number[]): string {
    return this.addInitializer(makeTensor(this.graph.uniqueName(`${this.prefix}${name}`), dataType, dims, values));
  }

  int64(name: string, values: number[], scalar = false): string {
    return this.constant(name, DataType.INT64, scalar ? [] : [values.length], values);
  }

  addInitializer(t: TensorProto): string {
    if (this.constantNodes) {
      this.insert({
        opType: 'Constant', domain: '', input: [], output: [t.name], name: this.graph.uniqueNodeName(`${t.name}/Constant`),
        attribute: [makeAttribute('value', { ...t, name: '' })],
      });
      return t.name;
    }
    this.editor.addInitializer(t);
    if (this.irVersion < 4) {
      // IR < 4 requires every initializer to be declared as a graph input as well.
      this.editor.addInput({ name: t.name, type: { tensorType: { elemType: t.dataType, shape: { dim: t.dims.map((d) => ({ dimValue: d })) } } } });
    }
    return t.name;
  }

  private insert(node: NodeProto): void {
    this.editor.insert(node);
    this.last = node;
  }
}

function makeAttribute(name: string, v: AttrValue): AttributeProto {
  const base = { name, floats: [], ints: [], strings: [], tensors: [], graphs: [] };
  if (typeof v === 'string') return { ...base, type: AttributeType.STRING, s: Buffer.from(v) };
  if (typeof v === 'object' && 'float' in v) return { ...base, type: AttributeType.FLOAT, f: v.float };
  if (typeof v === 'object' && 'graph' in v) return { ...base, type: AttributeType.GRAPH, g: v.graph };
  if (typeof v === 'object' && !Array.isArray(v)) return { ...base, type: AttributeType.TENSOR, t: v };
  if (Array.isArray(v)) return { ...base, type: AttributeType.INTS, ints: v };
  return { ...base, type: AttributeType.INT, i: v };
}
