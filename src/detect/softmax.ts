/**
 * Plain-op attention: a Softmax over the key axis alone whose logits come from a product of two activations
 * (query · keyᵀ) and whose probabilities reach a product with values. The rules share the walks of trace.ts and
 * differ in the product they accept and the Softmax form they apply to. Their checks, in order: the key axis (when
 * the rest matches, a failure there is a refusal --force-site accepts), the logits, the values.
 */
import { attrInt, attrInts, Graph, nodeLabel } from '../graph/graph';
import { opInfo, sameDim } from '../graph/ops';
import { show } from '../graph/poly';
import type { Shapes } from '../graph/shapes';
import { isDefaultDomain, NodeProto } from '../io/onnx';
import { isApplyNode, isPatchNode } from '../identity';
import { HeadInfo, inferHeads } from './heads';
import { classifyMasks, maskOperands } from './mask';
import type { Found, Rule, RuleContext, Stop } from './site';
import { einsumQueryOperand, einsumTerms, findLogitsMatMul, findValueMatMul, Step } from './trace';

/** `products`: the product ops the rule accepts (any when absent); `flat`: the opset < 13 form, whose axis ≠ −1. */
const softmaxRule = (name: string, flat: boolean, products?: string[]): Rule => ({
  name, match: (ctx, node) => matchSite(ctx, node, products),
  applies: (node, { scope }) => node.opType === 'Softmax' && isDefaultDomain(node.domain)
    && (scope.opset < 13 && (attrInt(node, 'axis') ?? 1) !== -1) === flat,
});

/** MatMul(q, kᵀ) or com.microsoft FusedMatMul → masks, biases, casts → Softmax → MatMul(v). */
export const matmulQk = softmaxRule('softmax/matmul-qk', false, ['MatMul', 'FusedMatMul']);
/** An Einsum whose rows come from one operand and keys from the other (either order) → Softmax → Einsum(v). */
export const einsumQk = softmaxRule('softmax/einsum-qk', false, ['Einsum']);
/** Opset < 13 Softmax(axis=k) flattens to 2-D around k: per row only when k = rank − 1 (a Reshape to [B·N·S, T]). */
export const opset11Reshape = softmaxRule('softmax/opset11-reshape', true);

/** Softmax written out over the last axis: Exp(x) / ReduceSum(Exp(x)), x optionally z − ReduceMax(z) (exporters, hand-written attention). */
/** A Div of an Exp by a ReduceSum: the candidate of a written-out Softmax (`producer`: what makes a tensor, in its graph). */
export function divOfExpSum(node: NodeProto, producer: (tensor: string) => NodeProto | undefined): boolean {
  return node.opType === 'Div' && isDefaultDomain(node.domain) && producer(node.input[0])?.opType === 'Exp' && producer(node.input[1])?.opType === 'ReduceSum';
}

export const decomposedSoftmax: Rule = {
  name: 'softmax/decomposed',
  applies: (node, { scope }) => divOfExpSum(node, (t) => scope.graph.producer.get(t)),
  match: (ctx, div) => {
    const d = writtenOutSoftmax(ctx.scope.graph, ctx.scope.shapes, div);
    if (!d) return { at: div, steps: 0, reason: 'Exp / ReduceSum is not a Softmax over the last axis (sum of the same Exp over the last axis, dims kept)' };
    // The Div stands for the whole form as the site's Softmax: its input has the logits' shape, its output is the probabilities.
    return matchSite(ctx, div, undefined, { start: d.shift ?? d.exp, logits: d.logits });
  },
};

/** The parts of a written-out Softmax ending in `div`; `logits` is what it normalises (before any max shift). */
interface WrittenOut { exp: NodeProto; shift?: NodeProto; logits: string }

function writtenOutSoftmax(graph: Graph, shapes: Shapes, div: NodeProto): WrittenOut | null {
  const exp = graph.producer.get(div.input[0]);
  const sum = graph.producer.get(div.input[1]);
  if (exp?.opType !== 'Exp' || sum?.opType !== 'ReduceSum' || sum.input[0] !== exp.output[0]) return null;
  if (!overLastAxis(graph, shapes, sum, exp.output[0])) return null;
  const shift = graph.producer.get(exp.input[0]);
  const max = shift?.opType === 'Sub' ? graph.producer.get(shift.input[1]) : undefined;
  if (shift && max?.opType === 'ReduceMax' && max.input[0] === shift.input[0] && overLastAxis(graph, shapes, max, shift.input[0])) {
    return { exp, shift, logits: shift.input[0] };
  }
  return { exp, logits: exp.input[0] };
}

/** A reduction over the last axis alone with dims kept (axes as an attribute or, from opset 13 / 18, a constant input). */
function overLastAxis(graph: Graph, shapes: Shapes, reduce: NodeProto, input: string): boolean {
  if ((attrInt(reduce, 'keepdims') ?? 1) !== 1) return false;
  const axes = reduce.input[1] ? graph.constValue(reduce.input[1])?.values : attrInts(reduce, 'axes');
  if (axes?.length !== 1) return false;
  return axes[0] === -1 || axes[0] === (shapes.rank(input) ?? 0) - 1;
}

/**
 * The Softmax of a site by its label, as verification finds it in a graph: a Softmax node, or the Div that ends a
 * written-out one. `input`: what it normalises; `output`: the probabilities.
 */
export function softmaxNamed(graph: Graph, shapes: Shapes, label: string): { input: string; output: string } | undefined {
  const node = graph.nodes.find((n) => (n.opType === 'Softmax' || n.opType === 'Div') && nodeLabel(n) === label);
  if (node?.opType === 'Softmax') return { input: node.input[0], output: node.output[0] };
  const written = node && writtenOutSoftmax(graph, shapes, node);
  return written ? { input: written.logits, output: node.output[0] } : undefined;
}

/** Where a site's logits walk starts when its Softmax is written out: the first node reading the logits, and them. */
interface WalkStart { start: NodeProto; logits: string }

function matchSite(ctx: RuleContext, softmax: NodeProto, products: string[] | undefined, written?: WalkStart): Found | Stop {
  const { graph, shapes, opset } = ctx.scope;
  const rank = shapes.rank(softmax.input[0]);
  // Opset < 13 normalises the flattened axes from `axis` on; with the rank unknown, n is that group's size at run time.
  const groupAxis = !written && rank === undefined && opset < 13 && attrInt(softmax, 'axis') !== -1 ? attrInt(softmax, 'axis') ?? 1 : undefined;
  const axisProblem = groupAxis === undefined && !written ? checkAxis(softmax, opset, rank) : null;
  const passed = axisProblem ? 0 : 1;
  // An axis problem is the first failed check, whatever the later ones say.
  const stop = (at: NodeProto, reason: string, steps: number): Stop => (axisProblem ? { at: softmax, reason: axisProblem, steps } : { at, reason, steps });
  const source = findLogitsMatMul(graph, shapes, written?.logits ?? softmax.input[0], written?.start ?? softmax);
  if ('reason' in source) {
    const kept = source.at.opType === 'TopK' && !axisProblem ? topKScores(graph, shapes, source.at, softmax) : null;
    return kept ?? stop(source.at, source.reason, passed);
  }
  const product = source.matmul;
  if (products && !products.includes(product.opType)) return stop(product, `logits come from ${product.opType}, not ${products.join(' or ')}`, passed);
  const ends: NodeProto[] = [];
  const valueMatMul = findValueMatMul(graph, softmax.output[0], ends);
  const topKEnd = ends.find((n) => n.opType === 'TopK');
  if (!valueMatMul && topKEnd && !axisProblem) return topK(topKEnd, passed + 1);
  if (!valueMatMul) return stop(ends[0] ?? softmax, 'probabilities do not reach a MatMul with values', passed + 1);
  if (axisProblem && !ctx.forced) return { at: softmax, reason: axisProblem, steps: 2, attention: true, forcible: true };
  const point = insertionPoint(graph, shapes, product, source.path);
  if (typeof point === 'string') return { at: product, reason: point, steps: passed + 2, attention: true };
  const logitsRank = shapes.rank(point.logits) ?? rank;
  // An earlier patch multiplied either the query (the MatMul's left input) or the logits on the path.
  const patched = [graph.producer.get(product.input[0]), ...source.path.map((s) => s.node)]
    .filter((n): n is NodeProto => Boolean(n && isPatchNode(n)));
  // A written-out Softmax's own nodes (its max shift) are not masks: the path's last step is the site's Softmax.
  const after = [...source.path.slice(point.offset, -1), { node: softmax, index: 0 }];
  return { kind: 'softmax', site: {
    softmax, qkMatMul: product, valueMatMul, logits: point.logits, consumer: point.consumer, afterLogits: after, logitsRank,
    logitsType: shapes.type(point.logits), heads: headsOf(ctx, product, logitsRank, point.logits),
    mask: classifyMasks(graph, maskOperands(after)), patchedBy: patched.find(isApplyNode) ?? patched[0],
    ...(axisProblem ? { forced: axisProblem } : {}), ...(groupAxis !== undefined ? { groupAxis } : {}),
  } };
}

/** Heads traced from the query operand (for an Einsum: the operand and axis the logits' head axis comes from). */
function headsOf({ scope }: RuleContext, product: NodeProto, logitsRank: number | undefined, logits: string): HeadInfo {
  if (product.opType !== 'Einsum') return inferHeads(scope.graph, product.input[0], logitsRank, scope.shapes, { logits });
  const q = einsumQueryOperand(product);
  const t = einsumTerms(product)!;
  const axis = logitsRank !== undefined && logitsRank >= 4 ? (q === 0 ? t.a : t.b).indexOf(t.out[logitsRank - 3]) : -1;
  return inferHeads(scope.graph, product.input[q], logitsRank, scope.shapes, { logits, ...(axis >= 0 ? { queryAxis: axis } : {}) });
}

/**
 * Softmax must normalise over the key axis alone. At opset < 13 it flattens the input to 2-D around `axis`
 * (default 1), which equals a last-axis Softmax only when axis = rank − 1 (e.g. a rank-2 view made by a Reshape).
 */
function checkAxis(softmax: NodeProto, opset: number, rank: number | undefined): string | null {
  const axis = attrInt(softmax, 'axis') ?? (opset >= 13 ? -1 : 1);
  if (axis === -1) return opset >= 13 || rank === undefined || rank >= 2 ? null : 'Softmax over a 1-D tensor';
  if (rank === undefined) return `Softmax axis ${axis} with logits of unknown rank: cannot tell it is the key axis`;
  return axis === rank - 1 ? null : `Softmax over axis ${axis} of a rank-${rank} tensor, not over the last (key) axis`;
}

/**
 * Moves the insertion point past the exporter's own scaling and Casts, so the factor multiplies the final content
 * logits in the Softmax's precision, but stops before any mask or reshape other than views that come back to the
 * logits' shape. A softcap (Div → Tanh → Mul, Gemma 2) is passed too: the capped logits are what the
 * Softmax normalises, so the factor after the cap is exactly SSMax. A softcap behind views of the logits (a Reshape
 * round trip, an Unsqueeze/Squeeze pair) is passed with them, where the capped tensor keeps the product's rows and
 * keys: a factor before a Tanh would not be SSMax. Where it does not keep them, the reason the site is refused is
 * returned instead of a point before the cap.
 */
function insertionPoint(graph: Graph, shapes: Shapes, matmul: NodeProto, path: Step[]): Point | string {
  const passes = (node: NodeProto, index: number): boolean => {
    const scaling = ((node.opType === 'Div' && index === 0) || node.opType === 'Mul') && graph.query.isStatic(node.input[1 - index]);
    // Past an Expand too (one that keeps rows and keys: the walk checked): a mask may be built from its output's shape.
    return (scaling || ['Cast', 'Identity', 'Tanh', 'Expand'].includes(node.opType)) && !isPatchNode(node);
  };
  const from = (start: number): number => {
    let offset = start;
    while (offset < path.length - 1 && passes(path[offset].node, path[offset].index)) offset++;
    return offset;
  };
  const point = (offset: number): Point => ({ logits: offset ? path[offset - 1].node.output[0] : matmul.output[0], consumer: path[offset], offset });
  const first = from(0);
  // Beyond `first`: views of the logits (their input 0) mixed with what `passes`, up to the first other node.
  const beyond: number[] = [];
  for (let i = first; i < path.length - 1 && (isView(path[i]) || passes(path[i].node, path[i].index)); i++) beyond.push(i);
  const cap = beyond.filter((i) => path[i].node.opType === 'Tanh').pop();
  if (cap === undefined) {
    // Views that come back to the logits' shape change nothing; a mask may be built from the shape of what they
    // give (a cycle otherwise), so the factor goes past the last of them.
    const shape = shapes.shape(point(first).logits)?.map(show).join();
    const trip = shape === undefined ? undefined : beyond.filter((i) => shapes.shape(path[i].node.output[0])?.map(show).join() === shape).pop();
    return point(trip === undefined ? first : from(trip + 1));
  }
  const past = point(from(cap + 1));
  const same = [-1, -2].every((axis) => sameDim(shapes.dim(past.logits, axis), shapes.dim(matmul.output[0], axis)));
  return same ? past : `a softcap (Tanh '${nodeLabel(path[cap].node)}') on a view of the logits that does not keep their rows and keys: the factor cannot go after the cap; not patched`;
}

interface Point { logits: string; consumer: Step; offset: number }

/** A view of the logits (the op table's: Reshape, Squeeze, Unsqueeze, Flatten, …) applied to them, not to its shape input. */
const isView = ({ node, index }: Step): boolean => index === 0 && opInfo(node).view === true;

/**
 * Top-k attention (q·kᵀ → Softmax → TopK → Gather/MatMul of the kept values): which keys the value product sees is
 * chosen at run time by value, and no rule here proves the n it sees; refused as attention, naming the TopK,
 * rather than skipped as "no attention". (TopK before the Softmax: topKScores.)
 */
function topK(node: NodeProto, steps: number): Stop {
  return { at: node, steps, attention: true,
    reason: `top-k attention: the probabilities go through TopK '${nodeLabel(node)}' before the values, which keys they weight is chosen at run time; not patched` };
}

/**
 * Top-k attention the other way round (q·kᵀ → TopK → Softmax over the kept scores → MatMul with the gathered
 * values): the Softmax sees k keys TopK chose by value, and the key count this tool reads is every key's; refused as
 * attention, naming the TopK, rather than skipped as "logits not produced by MatMul". (A MoE router's TopK over a
 * projection with a constant weight is no attention: its walk stops at the weight.)
 */
function topKScores(graph: Graph, shapes: Shapes, node: NodeProto, softmax: NodeProto): Stop | null {
  const scores = findLogitsMatMul(graph, shapes, node.input[0], node);
  if ('reason' in scores || !findValueMatMul(graph, softmax.output[0], [])) return null;
  return { at: node, steps: 1, attention: true,
    reason: `top-k attention: the Softmax normalises the scores TopK '${nodeLabel(node)}' kept of q·kᵀ, keys chosen at run time by value; not patched` };
}
