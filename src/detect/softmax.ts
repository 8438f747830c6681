/**
 * Plain-op attention rules: a Softmax over the key axis alone whose logits come from a product of two
 * activations (query · keyᵀ) and whose probabilities reach a product with values. The rules share the walks of
 * trace.ts and differ in the product they accept and in the Softmax form they apply to. Checks, in order: the
 * key axis (a failure there is a refusal --force-site can accept when the rest matches), the logits, the values.
 */
import { attrInt, Graph } from '../graph/graph';
import { NodeProto } from '../io/onnx';
import { HeadInfo, inferHeads } from './heads';
import { classifyMasks, maskOperands } from './mask';
import type { Found, Rule, RuleContext, Stop } from './rules';
import { einsumQueryOperand, einsumTerms, findLogitsMatMul, findValueMatMul, PATCH_PREFIX, Step } from './trace';

/** At opset < 13 a Softmax with an axis other than −1 flattens its input to 2-D around that axis. */
const coerced = (node: NodeProto, opset: number): boolean => opset < 13 && (attrInt(node, 'axis') ?? 1) !== -1;

/** `products`: the product ops the rule accepts (any when absent); `flattening`: the opset < 13 2-D form. */
function softmaxRule(name: string, flattening: boolean, products?: string[]): Rule {
  return {
    name,
    applies: (node, ctx) => node.opType === 'Softmax' && (node.domain === '' || node.domain === 'ai.onnx')
      && coerced(node, ctx.scope.opset) === flattening,
    match: (ctx, node) => matchSite(ctx, node, products),
  };
}

/** MatMul(q, kᵀ) or com.microsoft FusedMatMul → masks, biases, casts → Softmax(axis=-1) → MatMul(v). */
export const matmulQk = softmaxRule('softmax/matmul-qk', false, ['MatMul', 'FusedMatMul']);
/** Einsum whose rows come from one operand and keys from the other (either operand order) → Softmax → Einsum(v). */
export const einsumQk = softmaxRule('softmax/einsum-qk', false, ['Einsum']);
/** Opset < 13 Softmax(axis=k) over a 2-D view (e.g. a Reshape to [B·N·S, T]): per row only when k = rank − 1. */
export const opset11Reshape = softmaxRule('softmax/opset11-reshape', true);

function matchSite(ctx: RuleContext, softmax: NodeProto, products: string[] | undefined): Found | Stop {
  const { graph, shapes, opset } = ctx.scope;
  const rank = shapes.rank(softmax.input[0]);
  const axisProblem = checkAxis(softmax, opset, rank);
  const passed = axisProblem ? 0 : 1;
  // An axis problem is the first failed check, whatever the later ones say.
  const stop = (at: NodeProto, reason: string, steps: number): Stop => (axisProblem ? { at: softmax, reason: axisProblem, steps } : { at, reason, steps });
  const source = findLogitsMatMul(graph, softmax.input[0], softmax);
  if ('reason' in source) return stop(source.at, source.reason, passed);
  const product = source.matmul;
  if (products && !products.includes(product.opType)) return stop(product, `logits come from ${product.opType}, not ${products.join(' or ')}`, passed);
  const ends: NodeProto[] = [];
  const valueMatMul = findValueMatMul(graph, softmax.output[0], ends);
  if (!valueMatMul) return stop(ends[0] ?? softmax, 'probabilities do not reach a MatMul with values', passed + 1);
  if (axisProblem && !ctx.forced) return { at: softmax, reason: axisProblem, steps: 2, attention: true, forcible: true };
  const point = insertionPoint(graph, product, source.path);
  const logitsRank = shapes.rank(point.logits) ?? rank;
  // An earlier patch multiplied either the query (the MatMul's left input) or the logits on the path.
  const patched = [graph.producer.get(product.input[0]), ...source.path.map((s) => s.node)]
    .filter((n): n is NodeProto => Boolean(n?.name.startsWith(PATCH_PREFIX)));
  const after = source.path.slice(point.offset);
  return { kind: 'softmax', site: {
    softmax, qkMatMul: product, valueMatMul, logits: point.logits, consumer: point.consumer, afterLogits: after, logitsRank,
    logitsType: shapes.type(point.logits), heads: headsOf(ctx, product, logitsRank, point.logits),
    mask: classifyMasks(graph, maskOperands(after)), patchedBy: patched.find((n) => /\/apply(_\d+)?$/.test(n.name)) ?? patched[0],
    ...(axisProblem ? { forced: axisProblem } : {}),
  } };
}

/** Heads traced from the query operand (for an Einsum: the operand and axis the logits' head axis comes from). */
function headsOf({ scope }: RuleContext, product: NodeProto, logitsRank: number | undefined, logits: string): HeadInfo {
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
    const scaling = linear && graph.query.isStatic(node.input[1 - index]);
    if (!(scaling || node.opType === 'Cast' || node.opType === 'Identity' || node.opType === 'Tanh')) break;
    if (node.name.startsWith(PATCH_PREFIX)) break;
    logits = node.output[0];
    offset++;
  }
  return { logits, consumer: path[offset], offset };
}
