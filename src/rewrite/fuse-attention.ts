/**
 * Plain-op attention written as com.microsoft MultiHeadAttention, so that a patched model runs fused where
 * onnxruntime fuses the original. onnxruntime's session-time AttentionFusion (core/optimizer/attention_fusion.cc,
 * attention_fusion_helper.h) turns a BERT or GPT-2 block of plain ops into com.microsoft Attention, which projects
 * Q inside; the factor's Mul on the query breaks the pattern it matches, and the patched block ran unfused (1.2–1.5×
 * slower on the corpus's BERT and GPT-2). MultiHeadAttention takes the query from outside, so the scaled query
 * goes in and the block runs on a fused kernel again:
 *
 *   MatMul(c ⊙ q, Kᵀ) → ·scale → + masks → Softmax → MatMul(·, V)     [B, N, S, H] tensors, as the model wrote them
 *   becomes
 *   MultiHeadAttention(query = c ⊙ q as [B, S, N·H], key = K and value = V as [B, N, T, H], attention_bias = masks)
 *
 * with the output written back in the [B, N, S, H] layout under the value MatMul's output name (onnxruntime cancels
 * the transposes against the model's own). Masks become one additive bias: an Add's operand as it is, a
 * Where(keep, logits, fill) as Where(keep, 0, fill), which is the same after Softmax when fill ≤ −10⁴ (both underflow
 * to 0). The edits are journalled under their own owner (`L<layer>/fused`), so revert removes them with the patch
 * and verification can take them out again to check the factor on the plain ops (unfuse in revert.ts).
 */
import { AttentionSite } from '../detect/find-attention';
import { inputList, MULTI_HEAD_ATTENTION } from '../graph/attention-ops';
import { attrInt, attrInts, Graph } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { DataType, NodeProto } from '../io/onnx';
import { Builder } from './builder';

/** The journal owner of a site's fusion edits, and of the domain import they need. */
export const fusedOwner = (layer: number): string => `L${layer}/fused`;
export const FUSED_DOMAIN_OWNER = 'fused';
/** The owner of a layer's split cache (`--cache-layout split`, ms-attention.ts): undone with the fused ones for verification's plain-op form. */
export const layoutOwner = (layer: number): string => `L${layer}/layout`;
export const isFusedOwner = (owner: string): boolean => owner === FUSED_DOMAIN_OWNER || owner.endsWith('/fused') || owner.endsWith('/layout');

/** What the report says of a fused site. */
export const FUSED_NOTE = 'written as com.microsoft MultiHeadAttention with the scaled query: a block of plain ops in the form onnxruntime '
  + 'fuses at session start, which the factor in plain ops would prevent (--fused-attention off keeps plain ops, for other runtimes)';

/** Below this opset onnxruntime's AttentionFusion finds its LayerNormalization anchor (the opset-1 form it registers). */
const FUSION_MAX_OPSET = 16;
const MIN_FILL = -1e4;

/** A term of the additive mask: an Add's operand, or a Where's fill where `keep` is false. */
type MaskTerm = { add: string } | { where: { keep: string; fill: number; logitsAt: 1 | 2 } };

/** The block as MultiHeadAttention would take it. */
export interface FusableBlock {
  heads: number;
  scale: number;
  masks: MaskTerm[];
  /** Every node of the block the fused operator replaces: QK MatMul, scalings, masks, Softmax, value MatMul. */
  nodes: NodeProto[];
  /** Shape nodes reading the logits: given the same shape from the query and keys. */
  shapeReaders: NodeProto[];
}

/**
 * The block of a plain-op site, if onnxruntime would fuse it and MultiHeadAttention can take it; else why not. Read on
 * the model as it was (before the factor goes in).
 */
export function fusableBlock(scope: Scope, site: AttentionSite): FusableBlock | string {
  const g = scope.graph;
  const shapes = scope.shapes;
  if (scope.opset > FUSION_MAX_OPSET) return `opset ${scope.opset}: onnxruntime fuses plain-op attention only below opset 17`;
  if (scope.opset < 9) return `opset ${scope.opset}: the bias needs Expand and Where (opset 9)`;
  if (site.qkMatMul.opType !== 'MatMul' || site.valueMatMul.opType !== 'MatMul') return 'not MatMul products';
  const heads = site.heads.heads;
  if (!heads || site.heads.axis !== 1) return 'heads not known on axis 1';
  const [q, kT] = site.qkMatMul.input;
  const [probs, v] = site.valueMatMul.input;
  if ([q, kT, v].some((t) => shapes.rank(t) !== 4)) return 'query, keys or values not of rank 4';
  if ([q, kT, v].some((t) => shapes.type(t) !== DataType.FLOAT) || site.logitsType !== DataType.FLOAT) return 'not float32';
  if (probs !== site.softmax.output[0] || !single(g, probs)) return 'the probabilities are read elsewhere';
  if (!headsFromReshape(g, q, heads)) return 'the query is not a [B, S, N·H] projection split into heads';
  const softmaxAxis = attrInt(site.softmax, 'axis') ?? (scope.opset >= 13 ? -1 : 1);
  if (softmaxAxis !== -1 && softmaxAxis !== 3) return 'Softmax not over the last axis';
  const chain = logitsChain(g, site);
  if (typeof chain === 'string') return chain;
  return { ...chain, heads, nodes: [site.qkMatMul, ...chain.nodes, site.softmax, site.valueMatMul] };
}

/** q = Transpose(Reshape(x [B, S, N·H] → [B, S, N, H]), perm 0,2,1,3): the form onnxruntime's fusion starts from. */
function headsFromReshape(g: Graph, q: string, heads: number): boolean {
  const t = g.producer.get(q);
  if (!t || t.opType !== 'Transpose' || String(attrInts(t, 'perm')) !== '0,2,1,3') return false;
  const r = g.producer.get(t.input[0]);
  if (!r || r.opType !== 'Reshape') return false;
  const shape = g.constValue(r.input[1])?.values;
  return Boolean(shape && shape.length === 4 && shape[2] === heads);
}

const single = (g: Graph, t: string): boolean => g.consumersOf(t).length === 1 && !g.outputs.has(t);

/**
 * From the Softmax's input up to the QK product: scalar scalings first, then additive masks. Besides the next node
 * of the chain, a tensor may be read by Shape nodes alone (GPT-2 slices its causal mask to the logits' shape).
 */
function logitsChain(g: Graph, site: AttentionSite): Omit<FusableBlock, 'heads' | 'nodes'> & { nodes: NodeProto[] } | string {
  const qk = site.qkMatMul.output[0];
  let scale = 1;
  let scaled = false;
  const masks: MaskTerm[] = [];
  const nodes: NodeProto[] = [];
  const shapeReaders: NodeProto[] = [];
  const readers = (t: string, next: NodeProto): string | undefined => {
    if (g.outputs.has(t)) return `'${t}' is a graph output`;
    const others = g.consumersOf(t).filter((c) => c !== next);
    if (others.some((c) => c.opType !== 'Shape' || c.attribute.length)) return `'${t}' is read elsewhere`;
    shapeReaders.push(...others);
    return undefined;
  };
  let next = site.softmax;
  for (let t = site.softmax.input[0]; ; ) {
    const why = readers(t, next);
    if (why) return why;
    if (t === qk) break;
    const n = g.producer.get(t);
    if (!n) return `'${t}' has no producer`;
    const reads = (i: string): boolean => i === qk || g.query.dependsOn(i, qk);
    const at = n.input.findIndex(reads);
    if (at < 0 || n.input.filter(reads).length !== 1) return `${n.opType} '${n.name}' mixes the logits`;
    const other = n.input.filter((_, i) => i !== at);
    const c = other.length === 1 ? scalar(g, other[0]) : undefined;
    if ((n.opType === 'Div' && at === 0) || n.opType === 'Mul') {
      if (c === undefined) return `${n.opType} '${n.name}' by a tensor, not a constant`;
      scale *= n.opType === 'Div' ? 1 / c : c;
      scaled = true;
    } else if (n.opType === 'Add' || n.opType === 'Where') {
      // Walking up from the Softmax: a mask met after a scaling was added before it.
      if (scaled) return `a mask ('${n.name}') before a scaling`;
      const term = maskTerm(g, n, at, other);
      if (typeof term === 'string') return term;
      masks.push(term);
    } else if (n.opType !== 'Identity') return `${n.opType} '${n.name}' between the logits and the Softmax`;
    nodes.unshift(n);
    next = n;
    t = n.input[at];
  }
  return { scale, masks, nodes, shapeReaders };
}

function maskTerm(g: Graph, n: NodeProto, at: number, other: string[]): MaskTerm | string {
  if (n.opType === 'Add') return { add: other[0] };
  if (at === 0) return `Where '${n.name}' takes the logits as its condition`;
  const fill = scalar(g, n.input[at === 1 ? 2 : 1]);
  if (fill === undefined || fill > MIN_FILL) return `Where '${n.name}' fills with ${fill ?? 'a tensor'}, not a value ≤ ${MIN_FILL}`;
  return { where: { keep: n.input[0], fill, logitsAt: at as 1 | 2 } };
}

function scalar(g: Graph, name: string): number | undefined {
  const v = g.constValue(name);
  return v && v.values.length === 1 ? v.values[0] : undefined;
}

/** Nothing outside the block reads what its nodes compute (but its output): the factor's n may read a mask's logits. */
export function onlyInside(g: Graph, block: FusableBlock): boolean {
  const inside = new Set([...block.nodes, ...block.shapeReaders]);
  const last = block.nodes[block.nodes.length - 1];
  return block.nodes.every((n) => n === last || n.output.every((o) => !g.outputs.has(o) && g.consumersOf(o).every((c) => inside.has(c))));
}

/**
 * Replaces the block by MultiHeadAttention on the site's current query input (the scaled query, once the factor is
 * in). `b` journals under fusedOwner(layer).
 */
export function fuseBlock(b: Builder, site: AttentionSite, block: FusableBlock): void {
  const [q, kT] = site.qkMatMul.input;
  const v = site.valueMatMul.input[1];
  const output = site.valueMatMul.output[0];
  for (const n of [...block.nodes, ...block.shapeReaders]) b.editor.remove(n);
  if (block.shapeReaders.length) logitsShape(b, q, kT, block.shapeReaders.map((n) => n.output[0]));
  const query = b.op('Reshape', [b.op('Transpose', [q], { perm: [0, 2, 1, 3] }, 'query_bsnh'), b.int64('bsd', [0, 0, -1])], {}, 'query_bsd');
  const key = b.op('Transpose', [kT], { perm: [0, 1, 3, 2] }, 'key_bnth');
  const bias = block.masks.length ? attentionBias(b, block.masks, q, kT) : undefined;
  const attention = b.graph.uniqueName(`${b.prefix}multihead`);
  b.node(MULTI_HEAD_ATTENTION.opType, inputList(MULTI_HEAD_ATTENTION, { query, key, value: v, attention_bias: bias }), [attention],
    { num_heads: block.heads, scale: { float: block.scale } }, MULTI_HEAD_ATTENTION.domain, 'MultiHeadAttention');
  const heads = b.op('Reshape', [attention, b.int64('bsnh', [0, 0, block.heads, -1])], {}, 'context_bsnh');
  b.node('Transpose', [heads], [output], { perm: [0, 2, 1, 3] }, '', 'context');
}

/** [B, N, S, T] from the query [B, N, S, H] and the keys [B, N, H, T], under the names the Shape readers wrote. */
function logitsShape(b: Builder, q: string, kT: string, names: string[]): void {
  // Gather, not Slice: Slice takes its bounds as inputs only from opset 10.
  const head = b.op('Gather', [b.op('Shape', [q], {}, 'query_shape'), b.int64('axes012', [0, 1, 2])], {}, 'bns');
  const keys = b.op('Gather', [b.op('Shape', [kT], {}, 'keys_shape'), b.int64('axis3', [3])], {}, 'keys_t');
  const shape = b.op('Concat', [head, keys], { axis: 0 }, 'logits_shape');
  for (const name of names) b.node('Identity', [shape], [name], {}, '', 'logits_shape');
}

/** The masks as one additive bias [B|1, N|1, S, T] in float, as MultiHeadAttention's attention_bias needs it. */
function attentionBias(b: Builder, masks: MaskTerm[], q: string, kT: string): string {
  const dim = (t: string, axis: number, name: string): string => b.op('Gather', [b.op('Shape', [t], {}, `${name}_shape`), b.int64(`${name}_axis`, [axis])], {}, name);
  const rows = b.op('Concat', [b.int64('ones', [1, 1]), dim(q, 2, 'rows'), dim(kT, 3, 'keys')], { axis: 0 }, 'bias_shape');
  const zero = b.constant('zero', DataType.FLOAT, [], [0]);
  const terms = masks.map((m) => {
    if ('add' in m) return m.add;
    const fill = b.constant('fill', DataType.FLOAT, [], [m.where.fill]);
    const [x, y] = m.where.logitsAt === 1 ? [zero, fill] : [fill, zero];
    return b.op('Where', [m.where.keep, x, y], {}, 'mask_bias');
  });
  const sum = terms.slice(1).reduce((acc, t) => b.op('Add', [acc, t], {}, 'masks'), terms[0]);
  return b.op('Expand', [sum, rows], {}, 'attention_bias');
}
