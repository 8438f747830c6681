/**
 * Questions about where a tensor's value comes from, each answered by one walk up the graph that remembers every
 * tensor it passed: asking again, or about a tensor the walk already passed, costs nothing. The answers stay valid
 * until the graph is edited (Graph.reindex and the edit methods forget them).
 *
 * Walks are iterative (no depth limit, no node budget: the graph's own size bounds them) and, for questions about
 * values, never pass from a shape-only op (Shape, Size) to its input: a shape tells sizes, not values. Where a new
 * node may go (readsFrom) is a question about every edge, shapes included: a node that reads Shape(x) runs after x.
 * A node with subgraphs (If, Loop, Scan) is computed from its inputs and from the names its subgraphs capture from
 * this graph (readsOf).
 */
import { NodeProto } from '../io/onnx';
import { memo } from '../memo';
import type { AncestryReader } from './view';
import { opInfo } from './ops';
import { readsOf } from './toposort';

/**
 * What a walk sees at one tensor and its producer: an answer (found), `null` (nothing here or behind it: stop),
 * or `undefined` (nothing here: look at the producer's inputs).
 * @internal
 */
export type Visit<T> = (tensor: string, producer: NodeProto | undefined) => T | null | undefined;

/** @internal */
export class Query {
  private readonly tables = new Map<string, Map<string, unknown>>();
  /** What each node reads (readsOf), once: a node holding a subgraph would otherwise be scanned at every visit. */
  private readonly reads = new Map<NodeProto, string[]>();
  private readonly callReads = new Map<string, string[]>();

  constructor(private readonly graph: AncestryReader) {}

  forget(): void {
    this.tables.clear();
    this.reads.clear();
    this.callReads.clear();
  }

  private readsOf(node: NodeProto): string[] {
    return memo(this.reads, node, () => readsOf(node));
  }

  /**
   * What `tensor` is computed from at its producer: for a call of a model-local function, the arguments its body
   * computes that output's values from (a T5 position bias shared out of a wrapped block does not depend on the
   * block's hidden states); every input otherwise, and always when the question is what runs before.
   */
  private readsFor(node: NodeProto, tensor: string, throughShapes: boolean): string[] {
    if (throughShapes || !this.graph.valueReads) return this.readsOf(node);
    return memo(this.callReads, tensor, () => this.graph.valueReads!(node, tensor) ?? this.readsOf(node));
  }

  /**
   * The first answer `visit` gives on `name` or its ancestors (inputs in order, depth first); `key` names the
   * question, so that every call with the same key shares what earlier walks found. `throughShapes`: walk on from
   * a shape-only op to its input (what runs before, not what the values come from).
   */
  first<T>(key: string, name: string, visit: Visit<T>, throughShapes = false): T | undefined {
    if (!name) return undefined;
    const answers = memo(this.tables, key, () => new Map()) as Map<string, T | null>;
    const stack = [name];
    const open = new Set<string>();
    while (stack.length) {
      const t = stack[stack.length - 1];
      if (answers.has(t)) { stack.pop(); continue; }
      const p = this.graph.producer.get(t);
      if (!open.has(t)) {
        const v = visit(t, p);
        if (v !== undefined || !p || (opInfo(p).shapeOnly && !throughShapes)) { answers.set(t, v ?? null); stack.pop(); continue; }
        open.add(t);
        // A name on the current path again would be a cycle: it adds nothing.
        const pending = this.readsFor(p, t, throughShapes).filter((i) => !answers.has(i) && !open.has(i));
        if (pending.length) { stack.push(...pending.reverse()); continue; }
      }
      const found = this.readsFor(p!, t, throughShapes).map((i) => answers.get(i)).find((r) => r !== undefined && r !== null);
      answers.set(t, found ?? null);
      open.delete(t);
      stack.pop();
    }
    return answers.get(name) ?? undefined;
  }

  /** True when the tensor depends only on constants and tensor shapes, never on an input's or activation's values. */
  isStatic(name: string): boolean {
    if (!name) return true;
    const g = this.graph;
    return !this.first('dynamic', name, (t, p) => (g.isConstant(t) ? null : g.inputs.has(t) || !p ? true : undefined));
  }

  /** True when `ancestor` is `name` or one of the tensors it is computed from. */
  dependsOn(name: string, ancestor: string): boolean {
    return this.first(`tensor:${ancestor}`, name, (t) => (t === ancestor ? true : undefined)) ?? false;
  }

  /**
   * True when computing `name` needs `ancestor` first, through its values or only its shape: a node that reads
   * `name` cannot feed `ancestor` without a cycle.
   */
  readsFrom(name: string, ancestor: string): boolean {
    return this.first(`after:${ancestor}`, name, (t) => (t === ancestor ? true : undefined), true) ?? false;
  }

  /** True when the tensor's values come from a graph input (not from shapes and constants alone). */
  dependsOnInput(name: string): boolean {
    const g = this.graph;
    return this.first('input', name, (t) => (g.inputs.has(t) && !g.initializers.has(t) ? true : undefined)) ?? false;
  }

  /** True when some op of this type is among the nodes the tensor is computed from. */
  reachesOp(name: string, opType: string): boolean {
    return this.first(`op:${opType}`, name, (_t, p) => (p?.opType === opType ? true : undefined)) ?? false;
  }
}
