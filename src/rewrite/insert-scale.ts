/**
 * Inserts the factor c at one attention site. c multiplies the logits row-wise, so it can multiply the query
 * rows instead: (c_i·q_i)·K = c_i·(q_i·K). Scaling the query [.., Tq, D] costs far less than a Mul over the
 * logits [.., Tq, Tk] and leaves onnxruntime's MatMul + scale fusion (FusedMatMul) intact. The logits are used
 * instead when the query is in a lower precision than the logits the Softmax sees (fp16 query, fp32 logits: no
 * extra rounding), or when the masks n is counted from are computed after the logits (from their values, or only from
 * their shape, as DistilBERT's Expand(mask, Shape(logits)) and T5's position bias are): on the query, the factor
 * would then feed its own input.
 *
 * Either way the factor lands before every mask: masked entries stay exactly as they were, no 0·(−inf), no
 * finfo.min pushed to −inf.
 */
import { AttentionSite } from '../detect/find-attention';
import { countedMasks, MaskUse } from '../detect/mask-uses';
import { Step } from '../detect/trace';
import { InputError } from '../errors';
import { Graph } from '../graph/graph';
import { opInfo } from '../graph/ops';
import { Shapes } from '../graph/shapes';
import { DataType } from '../io/onnx';
import { Preset } from '../policy/factor';
import { NChoice } from '../policy/n-mode';
import { LayerScale } from '../policy/scale';
import { Builder } from './builder';
import { applyFactor } from './dtype';
import { isPatchNode } from '../identity';
import { presetFactor } from './factor';
import { NSources } from './n-source';

export interface ScaleContext {
  graph: Graph;
  sources: NSources;
  preset: Preset;
  opset: number;
  shapes: Shapes;
}

export type Target = 'query' | 'logits';

export interface InsertedScale {
  factor: string;
  apply: string;
  factorType: number;
  target: Target;
  nKey: string;
  /** True when the factor is one value per head for every row (n = Tk): it can scale a per-head table. */
  perHead: boolean;
}

interface TargetTensor {
  where: Target;
  tensor: string;
  consumer: Step;
  rank?: number;
  type?: number;
}

/** `sName`: the tensor holding s (its initializer, or inside a function body the input it comes in through). */
export function insertScale(ctx: ScaleContext, b: Builder, site: AttentionSite, s: LayerScale, n: NChoice, uses: MaskUse[], sName: string): InsertedScale {
  const target = chooseTarget(ctx, site, countedMasks(n.mode, uses));
  const perHead = Array.isArray(s);
  // Per-head s [H, 1, 1] meets the heads at axis rank − 3 ([B, H, Tq, ·], MaxViT's [B, G, H, P, ·]), or is tiled on [B·H, Tq, ·].
  if (perHead && (target.rank === undefined || target.rank < 3)) {
    throw new InputError(`layer ${site.layer}: per-head s needs a query or logits of known rank 3 or more`, 'cannot-patch');
  }
  const source = ctx.sources.get(site, n.mode, uses);
  const heads = perHead ? s.length : site.heads.heads;
  const counted4d = source.view === 'batch-rows' && source.rank === 4;
  if (source.view === 'batch-rows' && source.rank === 3 && target.rank !== 3) {
    throw new InputError(`layer ${site.layer}: n was counted on 3-D masked logits but the factor goes on a rank-${target.rank} tensor`, 'cannot-patch');
  }
  // Per-head s on [B·H, ·, ·] tensors is tiled over the batch, unless n is counted in the 4-D view (merged below).
  const sTensor = perHead && target.rank === 3 && !counted4d ? tileOverBatch(b, sName, target.tensor, s.length) : sName;
  let factor = presetFactor(b, ctx.preset, sTensor, source.n, ctx.sources.ln(source));
  if (counted4d && target.rank === 3) factor = mergeHeads(b, site, factor, target.tensor, heads);
  const { output: scaled, apply, factorType } = applyFactor(b, target.tensor, factor, target.type, ctx.opset);
  b.editor.setInput(target.consumer.node, target.consumer.index, scaled);
  if (target.where === 'logits') for (const r of normalisers(ctx, site, target, factor)) b.editor.setInput(r.node, r.index, scaled);
  return { factor, apply, factorType, target: target.where, nKey: source.key, perHead: source.view === 'scalar' && !(perHead && target.rank === 3) };
}

/**
 * An opset < 13 Softmax on logits of unknown rank normalises the axes from `groupAxis` on as one group: one factor
 * s·ln(group size) for the whole tensor, multiplied into the logits where the factor would go (before any mask).
 */
export function insertGroupScale(ctx: ScaleContext, b: Builder, site: AttentionSite, s: LayerScale, sName: string): InsertedScale {
  if (Array.isArray(s)) throw new InputError(`layer ${site.layer}: per-head s needs the head count, and these logits have no known rank; give one s for the layer`, 'cannot-patch');
  const shape = b.op('Shape', [site.logits], {}, 'logits_shape');
  const rows = b.op('ReduceProd', [b.op('Slice', [shape, b.int64('zero1', [0]), b.int64('group_axis', [site.groupAxis!])], {}, 'row_dims')], { keepdims: 0 }, 'rows');
  const n = b.op('Div', [b.op('Size', [site.logits], {}, 'size'), rows], {}, 'n_group');
  const nf = b.op('Max', [b.op('Cast', [n], { to: DataType.FLOAT }, 'n_group_f'), b.constant('one_f', DataType.FLOAT, [], [1])], {}, 'n_at_least_1');
  const factor = presetFactor(b, ctx.preset, sName, nf, b.op('Log', [nf], {}, 'ln_n'));
  const { output, apply, factorType } = applyFactor(b, site.logits, factor, site.logitsType, ctx.opset);
  b.editor.setInput(site.consumer.node, site.consumer.index, output);
  // One value for the whole tensor: a prior's bias is multiplied by it where it is added (not folded into a table).
  return { factor, apply, factorType, target: 'logits', nKey: `site:${site.softmax.output[0]}`, perHead: false };
}

/** `counted`: the masks the site's n is counted from. */
function chooseTarget(ctx: ScaleContext, site: AttentionSite, counted: MaskUse[]): TargetTensor {
  const query = site.qkMatMul.input[0];
  const queryType = ctx.shapes.type(query);
  const samePrecision = queryType === site.logitsType;
  const rank = ctx.shapes.rank(query);
  const qk = site.qkMatMul.output[0];
  const reads = (t: string | undefined): boolean => t !== undefined && ctx.graph.query.readsFrom(t, qk);
  const masksFromLogits = counted.some((u) => reads(u.tensor) || reads(u.viewShape));
  const plainMatMul = site.qkMatMul.opType === 'MatMul' && linearFromMatMul(ctx.graph, site);
  if (plainMatMul && samePrecision && (rank === 3 || rank === 4) && !masksFromLogits) {
    return { where: 'query', tensor: query, consumer: { node: site.qkMatMul, index: 0 }, rank, type: queryType };
  }
  return { where: 'logits', tensor: site.logits, consumer: site.consumer, rank: site.logitsRank, type: site.logitsType };
}

/**
 * Other readers of the logits the factor multiplies whose values reach the Softmax (wav2vec2's row max, read beside
 * the Sub it is subtracted in): they read the scaled logits too, so the model's normalisation is taken of what the
 * Softmax sees. Shape reads, and readers the factor is computed from, keep their input.
 */
function normalisers(ctx: ScaleContext, site: AttentionSite, target: TargetTensor, factor: string): Step[] {
  const q = ctx.graph.query;
  return ctx.graph.consumersOf(target.tensor).flatMap((node) => {
    if (node === target.consumer.node || isPatchNode(node) || opInfo(node).shapeOnly || !node.output[0]) return [];
    if (!q.dependsOn(site.softmax.input[0], node.output[0]) || q.readsFrom(factor, node.output[0])) return [];
    return node.input.flatMap((name, index) => (name === target.tensor ? [{ node, index }] : []));
  });
}

/** Per-head s [H,1,1] → [B·H,1,1] for [B·H, Tq, ·] tensors: row b·H + h belongs to head h. */
export function tileOverBatch(b: Builder, s: string, target: string, heads: number): string {
  const reps = b.op('Concat', [batchOf(b, target, heads), b.int64('ones', [1, 1])], { axis: 0 }, 'reps');
  return b.op('Tile', [s, reps], {}, 's_tiled');
}

/** B as a [1] tensor, from the first axis B·H of `target`. */
function batchOf(b: Builder, target: string, heads: number): string {
  const bh = b.op('Gather', [b.op('Shape', [target], {}, 'target_shape'), b.int64('batch_axis', [0], true)], {}, 'bh');
  return b.op('Reshape', [b.op('Div', [bh, b.int64('heads', [heads], true)], {}, 'batch'), b.int64('one_dim', [1])], {}, 'batch_1');
}

/** A factor counted in the 4-D mask view [B|1, H|1, R, 1] → [B·H, R, 1] for a 3-D target. */
function mergeHeads(b: Builder, site: AttentionSite, factor: string, target: string, heads: number | undefined): string {
  if (!heads) throw new InputError(`layer ${site.layer}: counting n from masks for [B·H, Tq, Tk] logits needs the head count, not found in the graph`, 'cannot-patch');
  const batch = batchOf(b, target, heads);
  const full = b.op('Expand', [factor, b.op('Concat', [batch, b.int64('heads_1_1', [heads, 1, 1])], { axis: 0 }, 'bh11')], {}, 'factor_bh');
  const rows = b.op('Slice', [b.op('Shape', [full], {}, 'factor_shape'), b.int64('from2', [2]), b.int64('to4', [4])], {}, 'rows_1');
  return b.op('Reshape', [full, b.op('Concat', [b.int64('minus_one', [-1]), rows], { axis: 0 }, 'merged_shape')], {}, 'factor_merged');
}

/** Scaling the query equals scaling the logits only if nothing but scalings and Casts lie between them (no softcap). */
function linearFromMatMul(graph: Graph, site: AttentionSite): boolean {
  const qk = site.qkMatMul.output[0];
  for (let name = site.logits; name !== qk;) {
    const node = graph.producer.get(name);
    if (!node || !['Div', 'Mul', 'Cast', 'Identity'].includes(node.opType)) return false;
    const next = node.opType === 'Mul' ? node.input.find((i) => graph.query.dependsOn(i, qk)) : node.input[0];
    if (!next) return false;
    name = next;
  }
  return true;
}
