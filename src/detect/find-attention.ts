/**
 * Finds the attention in a model and says for every other Softmax why it was skipped.
 *
 * - A Softmax site: a Softmax over the key axis whose logits come from a product of two activations
 *   (query · keyᵀ: MatMul, FusedMatMul or Einsum) and whose probabilities reach a product with values.
 * - A fused site: an attention operator whose Softmax is inside the kernel (see fused.ts).
 * - A call site: a call of a model-local function whose body holds attention; each call is its own layer.
 *
 * Every graph is searched: the main graph, If/Loop/Scan bodies and other graph attributes at any depth, and
 * function bodies. Layers are numbered in graph order within each graph.
 */
import { attrInt, Graph, nodeLabel } from '../graph/graph';
import { calledFunction, defaultOpsetOf, modelScopes, Scope } from '../graph/scopes';
import { topoOrder } from '../graph/toposort';
import { FunctionProto, ModelProto, NodeProto } from '../io/onnx';
import { FusedSite, isFusedCandidate, matchFused } from './fused';
import { HeadInfo, inferHeads } from './heads';
import { classifyMasks, maskOperands, MaskVerdict } from './mask';
import { einsumQueryOperand, einsumTerms, findLogitsMatMul, findValueMatMul, isShapeOrConstant, Step } from './trace';

export type { FusedSite } from './fused';

export interface AttentionSite {
  /** 0-based, in graph order within its scope. */
  layer: number;
  /** The graph the site is in (`main`, a subgraph path, or a function). */
  scope: string;
  softmax: NodeProto;
  qkMatMul: NodeProto;
  valueMatMul: NodeProto;
  /** The content logits the factor multiplies: after any 1/√d scaling and Cast, before any mask. */
  logits: string;
  /** The node on the path that reads `logits`, and at which input. */
  consumer: Step;
  /** The steps from `consumer` up to and including the Softmax: where masks and biases are applied. */
  afterLogits: Step[];
  logitsRank?: number;
  /** ONNX element type of the logits, when known. */
  logitsType?: number;
  heads: HeadInfo;
  mask: MaskVerdict;
  /** Set when the site already carries an SSMax factor from an earlier run. */
  patchedBy?: NodeProto;
  /** Why the site was refused before --force-site accepted it. */
  forced?: string;
}

/** A call of a model-local function whose body holds attention: the factor's s comes in through a new input. */
export interface CallSite {
  layer: number;
  scope: string;
  call: NodeProto;
  fn: FunctionProto;
  /** The attention inside the function body. */
  inner: AttentionSite | FusedSite;
}

export interface SkippedSoftmax {
  node: string;
  reason: string;
  /** The graph it is in, when not the main graph. */
  scope?: string;
  /** True when --force-site NAME would patch it anyway. */
  forcible?: boolean;
  /** True when the node is attention that was refused (not a Softmax that is something else). */
  attention?: boolean;
  /** Refused attention keeps its layer number, so patched layers are numbered the same with or without it. */
  layer?: number;
}

export interface Detection {
  sites: AttentionSite[];
  fused: FusedSite[];
  calls: CallSite[];
  skipped: SkippedSoftmax[];
}

export interface DetectOptions {
  /** Node names whose refusal (a deviation from exact SSMax, an unprovable Softmax axis) the user accepts. */
  force?: string[];
}

export const PATCH_PREFIX = 'ssmax/';

export function defaultOpset(model: ModelProto): number {
  return defaultOpsetOf(model.opsetImport);
}

/** Detection over the whole model (the `graph` argument is accepted for compatibility and not needed). */
export function findAttentionSoftmax(model: ModelProto, _graph?: Graph, options: DetectOptions = {}): Detection {
  return detectAttention(model, modelScopes(model), options);
}

type Entry =
  | { kind: 'refused'; skip: SkippedSoftmax }
  | { kind: 'softmax'; site: Omit<AttentionSite, 'layer' | 'scope'> }
  | { kind: 'fused'; site: Omit<FusedSite, 'layer' | 'scope'> }
  | { kind: 'call'; node: NodeProto; fn: FunctionProto };

export function detectAttention(model: ModelProto, scopes: Scope[], options: DetectOptions = {}): Detection {
  const force = new Set(options.force ?? []);
  const out: Detection = { sites: [], fused: [], calls: [], skipped: [] };
  const bodies = new Map<FunctionProto, (AttentionSite | FusedSite)[]>();
  for (const scope of scopes.filter((s) => s.kind === 'function')) {
    const entries = scanScope(model, scope, force, out.skipped);
    const inner = numbered(entries, scope, out.skipped);
    bodies.set(scope.fn!, inner);
  }
  const called = new Set<FunctionProto>();
  for (const scope of scopes.filter((s) => s.kind !== 'function')) {
    let layer = 0;
    for (const entry of scanScope(model, scope, force, out.skipped)) {
      if (entry.kind === 'refused') out.skipped.push({ ...entry.skip, layer: layer++ });
      else if (entry.kind === 'softmax') out.sites.push({ ...entry.site, layer: layer++, scope: scope.path });
      else if (entry.kind === 'fused') out.fused.push({ ...entry.site, layer: layer++, scope: scope.path });
      else {
        called.add(entry.fn);
        for (const inner of bodies.get(entry.fn) ?? []) {
          out.calls.push({ layer: layer++, scope: scope.path, call: entry.node, fn: entry.fn, inner });
        }
      }
    }
  }
  for (const [fn, inner] of bodies) {
    if (called.has(fn)) continue;
    for (const s of inner) {
      const node = 'softmax' in s ? s.softmax : s.node;
      out.skipped.push({ node: nodeLabel(node), scope: s.scope, attention: true, reason: `inside function '${fn.name}', which no graph calls` });
    }
  }
  return out;
}

/** Sites of a function body, numbered in body order; nested function calls there are reported and skipped. */
function numbered(entries: Entry[], scope: Scope, skipped: SkippedSoftmax[]): (AttentionSite | FusedSite)[] {
  const inner: (AttentionSite | FusedSite)[] = [];
  const path = scope.path;
  for (const e of entries) {
    if (e.kind === 'refused') skipped.push(e.skip);
    else if (e.kind === 'softmax') inner.push({ ...e.site, layer: inner.length, scope: path });
    else if (e.kind === 'fused') inner.push({ ...e.site, layer: inner.length, scope: path });
    else {
      skipped.push({ node: nodeLabel(e.node), scope: scope.path, attention: true,
        reason: `call of function '${e.fn.name}' (which holds attention) from inside another function: nested calls are not patched` });
    }
  }
  return inner;
}

function scanScope(model: ModelProto, scope: Scope, force: Set<string>, skipped: SkippedSoftmax[]): Entry[] {
  const entries: Entry[] = [];
  const skip = (node: NodeProto, reason: string, forcible = false, attention = forcible): void => {
    const entry = { node: nodeLabel(node), reason, ...(scope.kind === 'main' ? {} : { scope: scope.path }),
      ...(forcible ? { forcible } : {}), ...(attention ? { attention } : {}) };
    if (attention) entries.push({ kind: 'refused', skip: entry });
    else skipped.push(entry);
  };
  // Graph order is topological order: a few files in the wild store their nodes out of order.
  for (const node of topoOrder(scope.graph.proto)) {
    if (node.opType === 'Softmax' && (node.domain === '' || node.domain === 'ai.onnx')) {
      const result = matchSite(scope, node, force.has(nodeLabel(node)));
      if ('reason' in result) skip(node, result.reason, result.forcible);
      else entries.push({ kind: 'softmax', site: result });
    } else if (isFusedCandidate(node, scope.opset)) {
      const result = matchFused(scope, node);
      if ('reason' in result) skip(node, result.reason, false, true);
      else if (result.deviation && !force.has(nodeLabel(node))) skip(node, `${shortOp(result.op)}: ${result.deviation}`, true);
      else entries.push({ kind: 'fused', site: { ...result, forced: Boolean(result.deviation), patchedBy: fusedPatchedBy(scope.graph, node, result.query) } });
    } else if (node.opType === 'BiasSoftmax' && node.domain === 'com.microsoft') {
      skip(node, 'fused BiasSoftmax (onnxruntime-optimised Add + Softmax): not patched; patch the model before optimisation', false, true);
    } else {
      const fn = calledFunction(model, node);
      if (fn && fnHasAttention(fn)) entries.push({ kind: 'call', node, fn });
    }
  }
  return entries;
}

function shortOp(op: string): string {
  return op.replace('com.microsoft.', '');
}

/** Cheap pre-check; the body itself is analysed as its own scope. */
function fnHasAttention(fn: FunctionProto): boolean {
  return fn.node.some((n) => n.opType === 'Softmax' || n.opType === 'Attention' || /Attention$/.test(n.opType));
}

type Match = Omit<AttentionSite, 'layer' | 'scope'> | { reason: string; forcible?: boolean };

function matchSite(scope: Scope, softmax: NodeProto, forced: boolean): Match {
  const { graph, shapes, opset } = scope;
  const input = softmax.input[0];
  const rank = shapes.rank(input);
  const axisProblem = checkAxis(softmax, opset, rank);
  const source = findLogitsMatMul(graph, input, softmax);
  if ('why' in source) return { reason: axisProblem ?? source.why };
  const valueMatMul = findValueMatMul(graph, softmax.output[0]);
  if (!valueMatMul) return { reason: axisProblem ?? 'probabilities do not reach a MatMul with values' };
  if (axisProblem && !forced) return { reason: axisProblem, forcible: true };
  const point = insertionPoint(graph, source.matmul, source.path);
  const logitsRank = shapes.rank(point.logits) ?? rank;
  // An earlier patch multiplied either the query (the MatMul's left input) or the logits on the path.
  const queryProducer = graph.producer.get(source.matmul.input[0]);
  const patched = [queryProducer, ...source.path.map((s) => s.node)]
    .filter((n): n is NodeProto => Boolean(n?.name.startsWith(PATCH_PREFIX)));
  return {
    softmax,
    qkMatMul: source.matmul,
    valueMatMul,
    logits: point.logits,
    consumer: point.consumer,
    afterLogits: source.path.slice(point.offset),
    logitsRank,
    logitsType: shapes.type(point.logits),
    heads: headsOf(scope, source.matmul, logitsRank, point.logits),
    mask: classifyMasks(graph, maskOperands(source.path.slice(point.offset))),
    patchedBy: patched.find((n) => /\/apply(_\d+)?$/.test(n.name)) ?? patched[0],
    ...(axisProblem ? { forced: axisProblem } : {}),
  };
}

/** Heads traced from the query operand (for an Einsum: the operand and axis the logits' head axis comes from). */
function headsOf(scope: Scope, product: NodeProto, logitsRank: number | undefined, logits: string): HeadInfo {
  if (product.opType !== 'Einsum') return inferHeads(scope.graph, product.input[0], logitsRank, scope.shapes, { logits });
  const q = einsumQueryOperand(product);
  const t = einsumTerms(product)!;
  const letters = q === 0 ? t.a : t.b;
  const axis = logitsRank === 4 ? letters.indexOf(t.out[1]) : -1;
  return inferHeads(scope.graph, product.input[q], logitsRank, scope.shapes, { logits, ...(axis >= 0 ? { queryAxis: axis } : {}) });
}

/**
 * Softmax must normalise over the key axis alone. At opset < 13 Softmax flattens the input to 2-D around
 * `axis` (default 1), which equals a last-axis Softmax only when axis = rank − 1, e.g. a rank-2 view made by
 * a Reshape right before it.
 */
function checkAxis(softmax: NodeProto, opset: number, rank: number | undefined): string | null {
  const axis = attrInt(softmax, 'axis') ?? (opset >= 13 ? -1 : 1);
  if (axis === -1) {
    return opset >= 13 || rank === undefined || rank >= 2 ? null : 'Softmax over a 1-D tensor';
  }
  if (rank === undefined) return `Softmax axis ${axis} with logits of unknown rank: cannot tell it is the key axis`;
  if (axis !== rank - 1) return `Softmax over axis ${axis} of a rank-${rank} tensor, not over the last (key) axis`;
  return null;
}

/**
 * Moves the insertion point past the exporter's own scaling and Casts, so the factor multiplies the final
 * content logits in the Softmax's precision, but stops before any mask or reshape. A softcap
 * (Div → Tanh → Mul, Gemma 2) is passed too: the capped logits are what the Softmax normalises, so the
 * factor after the cap is exactly SSMax.
 */
function insertionPoint(graph: Graph, matmul: NodeProto, path: Step[]): { logits: string; consumer: Step; offset: number } {
  let logits = matmul.output[0];
  let offset = 0;
  while (offset < path.length - 1) {
    const { node, index } = path[offset];
    const linear = (node.opType === 'Div' && index === 0) || node.opType === 'Mul';
    const other = node.input[1 - index];
    const scaling = linear && isShapeOrConstant(graph, other);
    if (!(scaling || node.opType === 'Cast' || node.opType === 'Identity' || node.opType === 'Tanh')) break;
    if (node.name.startsWith(PATCH_PREFIX)) break;
    logits = node.output[0];
    offset++;
  }
  return { logits, consumer: path[offset], offset };
}

/** The inserted node that applies an earlier run's factor to a fused op's query (or weights), if any. */
function fusedPatchedBy(graph: Graph, node: NodeProto, query: FusedSite['query']): NodeProto | undefined {
  const start = node.input[query.layout === 'weights' ? query.weights : query.input];
  const seen = new Set<string>();
  const queue = [start];
  while (queue.length) {
    const name = queue.shift()!;
    if (seen.has(name)) continue;
    seen.add(name);
    const p = graph.producer.get(name);
    if (!p || !p.name.startsWith(PATCH_PREFIX)) continue;
    if (/\/apply(_\d+)?$/.test(p.name)) return p;
    queue.push(...p.input.filter(Boolean));
  }
  return undefined;
}
