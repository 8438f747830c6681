/**
 * The longest context a model can run, when its graph says so: a learned position table (a Gather from a
 * constant [P, d] table whose indices are positions, not token ids) has P rows, and so has a table of positions
 * inside an operator (a position embedding, a rotary cache). Relative-position bucket
 * tables (indices clamped with Min/Log/Where) are not limits and are left alone.
 */
import { ropeTableNames } from '../detect/rope';
import { Graph } from '../graph/graph';
import { opInfo, positionTableOf } from '../graph/ops';
import { NodeProto, toNumber } from '../io/onnx';
import { InputSpec } from './signature';

export interface LengthLimit {
  length: number;
  reason: string;
  /** What lifts the cap, where something does (RoPE's caches: --rope recomputes them); absent, nothing does. */
  lift?: string;
}

export function positionLimit(graph: Graph, specs: readonly InputSpec[]): LengthLimit | null {
  const roles = new Map(specs.map((s) => [s.name, s.role]));
  let tables: ReadonlySet<string> | undefined;
  // Which tables are RoPE's (fitted, detect/rope.ts), asked only of a table that caps the length.
  const rope = (): ReadonlySet<string> => (tables ??= ropeTableNames(graph));
  let best: LengthLimit | null = null;
  for (const node of graph.nodes) {
    const inOp = operatorTable(graph, node, roles);
    if (inOp && (!best || inOp.length < best.length)) best = inOp;
    if (node.opType !== 'Gather') continue;
    const dims = constantDims(graph, node.input[0]);
    if (!dims || dims.length !== 2 || graph.inputs.has(node.input[0])) continue;
    const rows = dims[0];
    if (rows < 2 || !isPositionIndex(graph, node.input[1], roles)) continue;
    if (!best || rows < best.length) {
      best = rope().has(node.input[0]) ? { length: rows, reason: `RoPE's table '${node.input[0]}' (cos or sin by position) has ${rows} rows`, lift: ROPE_LIFT }
        : { length: rows, reason: `position table '${node.input[0]}' has ${rows} rows` };
    }
  }
  return best;
}

const ROPE_LIFT = '--rope pi|ntk|yarn recomputes the rotary caches with room for the context it rescales for';

/** The dims of an initializer or a Constant node's value (read without decoding the values). */
function constantDims(graph: Graph, name: string): number[] | undefined {
  const init = graph.initializers.get(name);
  if (init) return init.dims.map(toNumber);
  const c = graph.producer.get(name);
  const t = c?.opType === 'Constant' ? c.attribute.find((a) => a.name === 'value')?.t : undefined;
  return t?.dims?.map(toNumber);
}

/**
 * A table of positions inside an operator (ops.ts's positionTable: EmbedLayerNormalization's position embedding,
 * a rotary cos cache): the op reads row p for position p, so the model runs no length beyond its rows (onnxruntime
 * fails such a run: "input index out of range"). Only a constant table counts: one fed at run time has no fixed size.
 * Position ids given to the op cap the length only when they are positions (ids fed from tokens cap nothing).
 */
function operatorTable(graph: Graph, node: NodeProto, roles: Map<string, string>): LengthLimit | null {
  const t = positionTableOf(node);
  if (!t) return null;
  const ids = t.positionIds === undefined ? '' : node.input[t.positionIds] ?? '';
  if (ids && !isPositionIndex(graph, ids, roles)) return null;
  const name = node.input[t.input];
  const table = name ? graph.initializers.get(name) : undefined;
  if (!table || table.dims.length < 2 || graph.inputs.has(name)) return null;
  const rows = toNumber(table.dims[0]);
  if (rows < 2) return null;
  const lift = t.sin !== undefined ? { lift: ROPE_LIFT } : {};
  return { length: rows, reason: `${node.opType} '${node.name || node.output[0]}': its ${t.what} '${name}' has ${rows} rows`, ...lift };
}

/**
 * True when `name` is computed from positions only (a positions input, a cumulative sum of the mask, or a
 * Range or Slice sized by the run-time sequence length) and never from token ids or through a clamp.
 */
function isPositionIndex(graph: Graph, name: string, roles: Map<string, string>): boolean {
  const seen = new Set<string>();
  const stack = [name];
  let lengthDependent = false;
  while (stack.length) {
    const t = stack.pop()!;
    if (seen.has(t)) continue;
    seen.add(t);
    const role = roles.get(t);
    if (role === 'positions' || role === 'mask') { lengthDependent = true; continue; }
    if (role !== undefined) return false;
    if (graph.initializers.has(t)) continue;
    const node = graph.producer.get(t);
    if (!node) continue;
    if (!opInfo(node).position) return false;
    if (opInfo(node).shapeOnly) { lengthDependent = true; continue; } // a shape tells sizes, not values
    stack.push(...node.input.filter(Boolean));
  }
  return lengthDependent;
}
