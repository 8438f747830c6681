/**
 * Structural checks of a graph before anything walks it: every name a node reads defined somewhere, no cycles,
 * graph outputs produced, no name produced by two computing nodes. Each problem is one InputError naming the node
 * and tensor involved. What onnxruntime itself accepts is accepted here too and returned as findings, so the
 * caller can say what it did about them: nodes out of topological order (onnxruntime sorts them), and a name
 * defined by several initializers or Constant nodes (onnxruntime keeps one definition, see constantDefinition).
 */
import { InputError } from '../errors';
import { GraphProto, NodeProto } from '../io/onnx';
import { chosenDefinition, ConstantDef, repeatedConstants } from './duplicates';
import { nodeLabel, subgraphsOf } from './graph';
import { CycleError, readsOf, topoSort } from './toposort';

/** @internal */
export interface GraphFindings {
  /** Per graph out of topological order: where, and the first read before its producer. */
  unsorted: string[];
  /** Names with more than one constant definition, and which one onnxruntime uses. */
  duplicates: string[];
}

/** @internal */
export function validateGraph(graph: GraphProto): GraphFindings {
  const findings: GraphFindings = { unsorted: [], duplicates: [] };
  check(graph, new Set(), 'the graph', findings);
  return findings;
}

function check(g: GraphProto, outer: Set<string>, where: string, findings: GraphFindings): void {
  const producer = definitions(g, where, findings);
  const available = new Set<string>([...outer, ...g.input.map((v) => v.name), ...g.initializer.map((t) => t.name)]);
  const visible = new Set<string>([...available, ...producer.keys()]);
  let unsorted: string | null = null;
  g.node.forEach((node, i) => {
    if (!node.opType) throw new InputError(`${where}: node #${i} ('${nodeLabel(node)}') has no op_type`, 'bad-model');
    for (const name of readsOf(node)) {
      if (available.has(name)) continue;
      const p = producer.get(name);
      if (!p) throw new InputError(`${where}: node '${nodeLabel(node)}' reads '${name}', which no node, initializer or input defines`, 'bad-model');
      unsorted ??= `node '${nodeLabel(node)}' reads '${name}' before node '${nodeLabel(p)}' produces it`;
    }
    for (const o of node.output) if (o) available.add(o);
    for (const sub of subgraphsOf(node)) check(sub, visible, `subgraph of '${nodeLabel(node)}'`, findings);
  });
  for (const v of g.output) {
    if (!available.has(v.name)) throw new InputError(`${where}: output '${v.name}' is not produced by any node, initializer or input`, 'bad-model');
  }
  if (unsorted) {
    try {
      topoSort({ ...g, node: [...g.node] }); // a cycle is an error, not a finding
    } catch (e) {
      throw e instanceof CycleError ? new InputError(`${where}: ${e.message}`, 'bad-model') : e;
    }
    findings.unsorted.push(`${where}: ${unsorted}`);
  }
}

/**
 * The node producing each tensor. A name defined by several initializers or Constant nodes is accepted as
 * onnxruntime accepts it, with the definition it uses (duplicates.ts); two computing nodes producing one name, or
 * a node producing a graph input, are not.
 */
function definitions(g: GraphProto, where: string, findings: GraphFindings): Map<string, NodeProto> {
  const inputs = new Set<string>();
  for (const v of g.input) {
    if (inputs.has(v.name)) throw new InputError(`${where}: input '${v.name}' is declared twice`, 'bad-model');
    inputs.add(v.name);
  }
  const initializers = new Set(g.initializer.map((t) => t.name));
  const producer = new Map<string, NodeProto>();
  for (const node of g.node) {
    for (const o of node.output) {
      if (!o) continue;
      const other = producer.get(o);
      const constant = node.opType === 'Constant' && (!other || other.opType === 'Constant');
      if (other && !constant) throw new InputError(`${where}: tensor '${o}' is produced twice (by '${nodeLabel(other)}' and '${nodeLabel(node)}')`, 'bad-model');
      if (inputs.has(o)) throw new InputError(`${where}: node '${nodeLabel(node)}' produces '${o}', which is already a graph input`, 'bad-model');
      if (initializers.has(o) && !constant) throw new InputError(`${where}: node '${nodeLabel(node)}' produces '${o}', which is already an initializer`, 'bad-model');
      producer.set(o, node);
    }
  }
  for (const [name, defs] of repeatedConstants(g)) findings.duplicates.push(`${where}: ${describeRepeated(name, defs)}`);
  return producer;
}

function describeRepeated(name: string, defs: ConstantDef[]): string {
  const kinds = defs.map((d) => ('tensor' in d ? 'initializer' : `Constant node '${nodeLabel(d.node)}'`));
  const chosen = chosenDefinition(defs);
  if (chosen === null) {
    throw new InputError(`'${name}' is defined ${defs.length} times with different values (${kinds.join(', ')}), some under and some over `
      + "onnxruntime's 128-byte threshold, so which one it uses is not defined: keep one definition", 'bad-model');
  }
  return `'${name}' is defined ${defs.length} times (${kinds.join(', ')}); every reader sees the ${ordinal(chosen, defs.length)} one (the ${kinds[chosen]}), as onnxruntime reads it, and the output keeps them all`;
}

const ordinal = (i: number, n: number): string => (i === n - 1 ? 'last' : i === 0 ? 'first' : `#${i + 1}`);
