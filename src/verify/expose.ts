/**
 * Brings a tensor of any graph of a model out as a float32 output of the main graph, in an in-memory copy:
 *   - main graph: a Cast and a graph output;
 *   - function body: a function output, and an output on every call of the function (one per call site, so each
 *     call's values come out separately), brought out of the scope holding the call;
 *   - If branch: an output of this branch and an empty one of the other, and an output of the If (the tensor
 *     is empty in runs that take the other branch);
 *   - Loop and Scan bodies: a scan output, which stacks the tensor of every iteration along a new first axis.
 * Other graph attributes (the decoders of GreedySearch or BeamSearch) have outputs the operator defines: a
 * tensor in them cannot be brought out, and the caller is told why.
 */
import { nodeLabel } from '../graph/graph';
import { calledFunction, modelScopes, Scope } from '../graph/scopes';
import { AttributeProto, DataType, GraphProto, isDefaultDomain, ModelProto, NodeProto } from '../io/onnx';
import { nodeKey } from '../rewrite/journal';
import { PATCH_OPSET } from '../rewrite/opset';
import { attribute, PREFIX } from './nodes';

/** Why a tensor could not be brought out. */
export class Unexposable {
  constructor(readonly reason: string) {}
}

export class Exposer {
  readonly scopes: Scope[];
  private readonly byPath: Map<string, Scope>;
  private readonly touched = new Set<Scope>();
  /** Function outputs already added: `<function path>|<tensor>` → output position. */
  private readonly fnOutputs = new Map<string, number>();
  /** Tensors already float32 outputs of their scope's graph, so they are not cast again. */
  private readonly floats = new Set<string>();

  constructor(private readonly model: ModelProto) {
    // The nodes added are of the default domain, which a model of contrib ops alone may not import (the patch adds
    // the same import, opset.ts).
    if (!model.opsetImport.some((o) => isDefaultDomain(o.domain))) model.opsetImport.push({ domain: '', version: PATCH_OPSET });
    this.scopes = modelScopes(model);
    this.byPath = new Map(this.scopes.map((s) => [s.path, s]));
  }

  scope(path: string): Scope | undefined {
    return this.byPath.get(path);
  }

  /** Adds a node to a scope through its Graph. */
  add(scope: Scope, node: NodeProto): void {
    scope.graph.insertNode(node);
    this.touched.add(scope);
  }

  /**
   * `tensor` of scope `path` as a float32 output of the main graph; for a function body, the value of one call
   * (`call`: the call node's key and the scope holding it). `name` is a base for the new names.
   */
  expose(path: string, tensor: string, name: string, call?: { scope: string; node: string }): string | Unexposable {
    const scope = this.byPath.get(path);
    if (!scope) return new Unexposable(`the graph ${path} is not in the model`);
    const value = this.asFloat(scope, tensor, name);
    if (scope.kind === 'main') return this.graphOutput(scope, value);
    if (scope.kind === 'function') return this.throughCall(scope, value, name, call);
    return this.throughOwner(scope, value, name, call);
  }

  /** Sorts every graph that got nodes and writes function bodies back. */
  finish(): void {
    for (const scope of this.touched) scope.commit();
  }

  private asFloat(scope: Scope, tensor: string, name: string): string {
    if (this.floats.has(tensor)) return tensor;
    const out = scope.graph.uniqueName(`${PREFIX}${name}`);
    this.add(scope, { opType: 'Cast', domain: '', input: [tensor], output: [out], name: scope.graph.uniqueNodeName(`${PREFIX}${name}`), attribute: [attribute('to', DataType.FLOAT)] });
    this.floats.add(out);
    return out;
  }

  private graphOutput(scope: Scope, tensor: string): string {
    if (!scope.graph.outputs.has(tensor)) scope.graph.addOutput({ name: tensor, type: { tensorType: { elemType: DataType.FLOAT } } });
    return tensor;
  }

  private throughCall(fnScope: Scope, tensor: string, name: string, call?: { scope: string; node: string }): string | Unexposable {
    if (!call) return new Unexposable(`${fnScope.path}: a function body is seen only through a call`);
    const fn = fnScope.fn!;
    const key = `${fnScope.path}|${tensor}`;
    let position = this.fnOutputs.get(key);
    if (position === undefined) {
      // The function's own output list follows when the scope is committed (finish).
      fnScope.graph.addOutput({ name: tensor });
      position = fnScope.graph.proto.output.length - 1;
      this.fnOutputs.set(key, position);
      this.touched.add(fnScope);
      for (const s of this.scopes) for (const n of s.graph.nodes) if (calledFunction(this.model, n) === fn) this.callOutput(s, n, position, name);
    }
    const caller = this.byPath.get(call.scope);
    const node = caller?.graph.nodes.find((n) => nodeKey(n) === call.node);
    if (!caller || !node) return new Unexposable(`the call producing '${call.node}' is not in ${call.scope}`);
    const out = node.output[position];
    this.floats.add(out);
    return this.expose(caller.path, out, name);
  }

  /** Every call of a function gets an output at `position` (function outputs are positional). */
  private callOutput(scope: Scope, node: NodeProto, position: number, name: string): void {
    scope.graph.setOutput(node, position, scope.graph.uniqueName(`${PREFIX}${name}/${nodeLabel(node)}`));
    this.touched.add(scope);
  }

  private throughOwner(scope: Scope, tensor: string, name: string, call?: { scope: string; node: string }): string | Unexposable {
    const owner = scope.owner!;
    const op = owner.node.opType;
    const attr = owner.node.attribute.find((a) => a.g === scope.graph.proto || (a.graphs ?? []).includes(scope.graph.proto));
    const domain = isDefaultDomain(owner.node.domain);
    if (!domain || !attr || !['If', 'Loop', 'Scan'].includes(op)) {
      return new Unexposable(`it is in the ${attr?.name ?? 'graph'} attribute of ${op} '${nodeLabel(owner.node)}', whose outputs the operator defines`);
    }
    this.graphOutput(scope, tensor);
    this.touched.add(scope);
    if (op === 'If') this.otherBranch(owner.node, attr, name);
    if (op === 'Scan') extendScanAttributes(owner.node);
    const out = owner.scope.graph.uniqueName(`${PREFIX}${name}/${nodeLabel(owner.node)}`);
    owner.scope.graph.setOutput(owner.node, owner.node.output.length, out);
    this.touched.add(owner.scope);
    this.floats.add(out);
    return this.expose(owner.scope.path, out, name, call);
  }

  /** The If branch not holding the tensor gets an empty float32 output in the same position. */
  private otherBranch(node: NodeProto, attr: AttributeProto, name: string): void {
    const other = node.attribute.find((a) => a !== attr && a.g && (a.name === 'then_branch' || a.name === 'else_branch'));
    const g = other?.g as GraphProto;
    const scope = this.scopes.find((s) => s.graph.proto === g)!;
    const out = scope.graph.uniqueName(`${PREFIX}${name}/not_taken`);
    const empty = { name: '', dataType: DataType.FLOAT, dims: [0], rawData: new Uint8Array(0), floatData: [], int32Data: [], int64Data: [],
      doubleData: [], uint64Data: [], stringData: [], externalData: [], dataLocation: 0 };
    this.add(scope, { opType: 'Constant', domain: '', input: [], output: [out], name: scope.graph.uniqueNodeName(out), attribute: [attribute('value', empty)] });
    this.graphOutput(scope, out);
  }
}

/** A Scan with explicit output axes or directions needs one more entry for the new scan output. */
function extendScanAttributes(node: NodeProto): void {
  for (const a of node.attribute) if (a.name === 'scan_output_axes' || a.name === 'scan_output_directions') a.ints = [...a.ints, 0];
}
