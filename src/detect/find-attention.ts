/**
 * Finds the Softmax nodes that belong to attention, and says for every other Softmax why it was skipped.
 * A site is a Softmax over the key axis whose logits come from a MatMul of two activations (query · keyᵀ)
 * and whose probabilities reach a MatMul with values.
 */
import { attrInt, Graph, subgraphsOf } from '../graph/graph';
import { inferRanks } from '../graph/ranks';
import { inferElemTypes } from '../graph/types';
import { GraphProto, ModelProto, NodeProto } from '../io/onnx';
import { HeadInfo, inferHeads } from './heads';
import { classifyMasks, maskOperands, MaskVerdict } from './mask';
import { findLogitsMatMul, findValueMatMul, isShapeOrConstant, Step } from './trace';

export interface AttentionSite {
  /** 0-based, in graph order. */
  layer: number;
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
}

export interface SkippedSoftmax {
  node: string;
  reason: string;
}

export interface Detection {
  sites: AttentionSite[];
  skipped: SkippedSoftmax[];
}

export const PATCH_PREFIX = 'ssmax/';

export function defaultOpset(model: ModelProto): number {
  const entry = model.opsetImport.find((o) => o.domain === '' || o.domain === 'ai.onnx');
  return entry ? Number(entry.version) : 1;
}

export function findAttentionSoftmax(model: ModelProto, graph: Graph): Detection {
  const opset = defaultOpset(model);
  const ranks = inferRanks(graph);
  const types = inferElemTypes(graph);
  const sites: AttentionSite[] = [];
  const skipped: SkippedSoftmax[] = [];
  for (const node of graph.nodes) {
    if (node.opType === 'Softmax' && (node.domain === '' || node.domain === 'ai.onnx')) {
      const result = matchSite(graph, node, opset, ranks, types);
      if ('reason' in result) skipped.push({ node: label(node), reason: result.reason });
      else sites.push({ ...result, layer: sites.length });
    }
    for (const g of subgraphsOf(node)) skipped.push(...softmaxIn(g, `subgraph of '${label(node)}'`));
  }
  for (const fn of model.functions) {
    skipped.push(...softmaxIn({ node: fn.node } as GraphProto, `function '${fn.domain}:${fn.name}'`));
  }
  return { sites, skipped };
}

/** Softmax nodes in nested graphs are reported, never silently passed over. */
function softmaxIn(g: GraphProto, where: string): SkippedSoftmax[] {
  const out: SkippedSoftmax[] = [];
  for (const n of g.node) {
    if (n.opType === 'Softmax') out.push({ node: label(n), reason: `inside ${where}: not patched by this version` });
    for (const sub of subgraphsOf(n)) out.push(...softmaxIn(sub, `subgraph of '${label(n)}'`));
  }
  return out;
}

export function label(node: NodeProto): string {
  return node.name || `${node.opType}(${node.output[0]})`;
}

type Match = Omit<AttentionSite, 'layer'> | { reason: string };

function matchSite(
  graph: Graph, softmax: NodeProto, opset: number, ranks: Map<string, number>, types: Map<string, number>,
): Match {
  const input = softmax.input[0];
  const rank = ranks.get(input);
  const axisProblem = checkAxis(softmax, opset, rank);
  if (axisProblem) return { reason: axisProblem };
  const source = findLogitsMatMul(graph, input, softmax);
  if ('why' in source) return { reason: source.why };
  const valueMatMul = findValueMatMul(graph, softmax.output[0]);
  if (!valueMatMul) return { reason: 'probabilities do not reach a MatMul with values' };
  const point = insertionPoint(graph, source.matmul, source.path);
  const logitsRank = ranks.get(point.logits) ?? rank;
  // An earlier patch multiplied either the query (the MatMul's left input) or the logits on the path.
  const queryProducer = graph.producer.get(source.matmul.input[0]);
  const patchedBy = queryProducer?.name.startsWith(PATCH_PREFIX) ? queryProducer
    : source.path.find((s) => s.node.name.startsWith(PATCH_PREFIX))?.node;
  return {
    softmax,
    qkMatMul: source.matmul,
    valueMatMul,
    logits: point.logits,
    consumer: point.consumer,
    afterLogits: source.path.slice(point.offset),
    logitsRank,
    logitsType: types.get(point.logits),
    heads: inferHeads(graph, source.matmul.input[0], logitsRank, ranks),
    mask: classifyMasks(graph, maskOperands(source.path.slice(point.offset))),
    patchedBy,
  };
}

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
 * content logits in the Softmax's precision, but stops before any mask or reshape.
 */
function insertionPoint(graph: Graph, matmul: NodeProto, path: Step[]): { logits: string; consumer: Step; offset: number } {
  let logits = matmul.output[0];
  let offset = 0;
  while (offset < path.length - 1) {
    const { node, index } = path[offset];
    const linear = (node.opType === 'Div' && index === 0) || node.opType === 'Mul';
    const other = node.input[1 - index];
    const scaling = linear && isShapeOrConstant(graph, other);
    if (!(scaling || node.opType === 'Cast' || node.opType === 'Identity')) break;
    if (node.name.startsWith(PATCH_PREFIX)) break;
    logits = node.output[0];
    offset++;
  }
  return { logits, consumer: path[offset], offset };
}
