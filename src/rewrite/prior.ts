/**
 * A positional prior at one Softmax site (see policy/prior.ts): c_i·B_ij is added to the logits right after the
 * factor and before every mask, so the Softmax sees c·(z + B) + masks and masked entries stay masked.
 *
 * B depends on (head, j − i) only: it is built per layer as a small table over the Tq + Tk − 1 relative positions
 * a run can see, from θ initializers at run time (so θ can be fine-tuned), then laid out as [H, Tq, Tk] by two
 * Gathers of blocks through indices shared by every layer with the same Tq and Tk (n-source.ts, Positions). Per
 * layer that is one pass over an attention-sized tensor to build B, one Mul by a per-row factor and one Add.
 */
import { AttentionSite } from '../detect/find-attention';
import { InputError } from '../errors';
import { DataType } from '../io/onnx';
import { LayerTheta, THETAS, ThetaName } from '../policy/prior';
import { Builder } from './builder';
import { PART } from '../identity';
import { ScaleContext, tileOverBatch } from './insert-scale';
import { Positions } from './n-source';

/** The θ initializers (or, in a function body, the inputs θ comes in through) of one site. */
export type ThetaTensors = Record<ThetaName, string>;

export function thetaConstants(b: Builder, theta: LayerTheta): ThetaTensors {
  return Object.fromEntries(THETAS.map((t) => [t, b.constant(`theta_${t}`, DataType.FLOAT, [theta[t].length], theta[t])])) as ThetaTensors;
}

/**
 * B over relative positions: −exp(θα)·(|d − μ| + 1e-5)^θβ for a row of positions d [1, M], as [H, M] (one row
 * per head), times `headScale` [H] when given (a factor that is one value per head). Every broadcast of a head's θ
 * runs along a contiguous row: onnxruntime's elementwise kernels take an [M, H] layout with a [1, H] row at a few
 * ns per value, which decoding with a long cache pays in every layer. The power is exp(θβ·ln x) (x > 0 always),
 * cheaper than Pow; θβ = 0 still gives exactly 1.
 */
function priorTable(b: Builder, theta: ThetaTensors, d: string, headScale?: string): string {
  const column = (x: string, name: string): string => b.op('Reshape', [x, b.int64('head_column', [-1, 1])], {}, name);
  const mu = b.op('Sub', [b.op('Exp', [theta.mu], {}, 'exp_mu'), b.op('Exp', [b.op('Neg', [theta.mu], {}, 'neg_mu')], {}, 'exp_neg_mu')], {}, 'mu');
  const distance = b.op('Abs', [b.op('Sub', [d, column(mu, 'mu_column')], {}, 'd_minus_mu')], {}, 'distance');
  const logDistance = b.op('Log', [b.op('Add', [distance, b.constant('eps', DataType.FLOAT, [], [1e-5])], {}, 'distance_eps')], {}, 'log_distance');
  const powered = b.op('Exp', [b.op('Mul', [logDistance, column(theta.beta, 'beta_column')], {}, 'beta_log_distance')], {}, 'distance_pow');
  let scale = b.op('Neg', [b.op('Exp', [theta.alpha], {}, 'exp_alpha')], {}, 'prior_scale');
  if (headScale) scale = b.op('Mul', [scale, headScale], {}, 'prior_scale_scaled');
  return b.op('Mul', [column(scale, 'scale_column'), powered], {}, 'prior_table');
}

/** Where a fused operator's bias [B|1, H, S, T] sits: S rows, T keys, each item's first row at absolute position `past`. */
export interface BiasPositions {
  S: string;
  T: string;
  /** Scalar, or one per batch item [B]; int64. */
  past: string;
}

/**
 * c·B as an additive bias [B|1, H, S, T] for a fused operator (its attention_bias, attn_mask), in `dtype`: `factor`
 * is c laid out [Bn, H|1, Sn, 1] (absent for the none preset).
 */
export function fusedPrior(b: Builder, theta: ThetaTensors, at: BiasPositions, factor: string | undefined, dtype: number): string {
  const one = b.int64('one', [1], true);
  const last = b.op('Sub', [at.T, one], {}, 'last_key');
  const range = (from: string, to: string, name: string): string => b.op('Range', [from, to, one], {}, name);
  const d = b.op('Reshape', [b.op('Cast', [range(b.op('Neg', [last], {}, 'first_d'), at.T, 'd_range')], { to: DataType.FLOAT }, 'd'),
    b.int64('row_shape', [1, -1])], {}, 'd_row');
  const zero = b.int64('zero', [0], true);
  const keys = b.op('Reshape', [range(zero, at.T, 'keys'), b.int64('keys_shape', [1, 1, -1])], {}, 'key_pos');
  const rows = b.op('Reshape', [range(zero, at.S, 'rows'), b.int64('rows_shape', [1, -1, 1])], {}, 'row_pos');
  const past = b.op('Reshape', [at.past, b.int64('items_shape', [-1, 1, 1])], {}, 'first_row_pos');
  // Index of d = j − (past_b + i) in d_range, which starts at −(T − 1).
  const index = b.op('Add', [b.op('Sub', [b.op('Sub', [keys, rows], {}, 'j_minus_i'), past], {}, 'd_bij'), last], {}, 'd_index');
  // [positions, heads], so that Gather copies one row of H values per (item, i, j) here, where each item's rows
  // start at its own position.
  const table = b.op('Transpose', [priorTable(b, theta, d)], { perm: [1, 0] }, 'prior_table_mh');
  const gathered = b.op('Gather', [table, b.op('Cast', [index], { to: DataType.INT32 }, 'd_index_i32')], { axis: 0 }, 'prior_bsth');
  let bias = b.op('Transpose', [gathered], { perm: [0, 3, 1, 2] }, PART.prior);
  if (factor) bias = b.op('Mul', [bias, factor], {}, PART.priorScaled);
  return dtype === DataType.FLOAT ? bias : b.op('Cast', [bias], { to: dtype }, PART.priorCast);
}

/**
 * The table [H, Tq + Tk − 1] laid out as B [H, Tq, Tk] (see Positions): by a Gather of every K-wide window
 * (H values per index, from the table transposed; then transposed to [H, windows, K]) and a Gather of blocks of
 * K ≥ 8 keys ([H, Tq, Tk / K, K]), or else by a Gather of H values per (i, j) and a Transpose. Each
 * branch ends in the op that writes its result (onnxruntime copies a branch's output that a Reshape made), and one
 * Reshape after the If, which onnxruntime does without a copy, makes both [H, Tq, Tk].
 */
function layoutPrior(b: Builder, table: string, pos: Positions): string {
  // [positions, H]: each index below copies a head's row of H values, not one value.
  const byPosition = b.op('Transpose', [table], { perm: [1, 0] }, 'prior_table_mh');
  const blocks = b.branch('prior_blocks', (sb) => {
    const windows = sb.op('Transpose', [sb.op('Gather', [byPosition, pos.windows], { axis: 0 }, 'prior_windows_skh')], { perm: [2, 0, 1] }, 'prior_windows');
    return sb.op('Gather', [windows, pos.blocks], { axis: 1 }, 'prior_gathered');
  }, DataType.FLOAT);
  const pairs = b.branch('prior_pairs', (sb) =>
    sb.op('Transpose', [sb.op('Gather', [byPosition, pos.blocks], { axis: 0 }, 'prior_ijh')], { perm: [2, 0, 1] }, 'prior_laid'), DataType.FLOAT);
  const laid = b.op('If', [pos.blocked], { then_branch: { graph: blocks }, else_branch: { graph: pairs } }, 'prior_layout');
  return b.op('Reshape', [laid, pos.shape], {}, PART.prior);
}

/**
 * Adds c·B at the site; `factor` is c (absent for the none preset, c = 1). A factor that is one value per head for
 * every row scales the small table instead of the gathered [H, Tq, Tk] prior.
 */
export function insertPrior(ctx: ScaleContext, b: Builder, site: AttentionSite, theta: ThetaTensors,
  factor: { tensor: string; perHead: boolean } | undefined): void {
  const heads = site.heads.heads;
  if (!heads) throw new InputError(`layer ${site.layer}: a positional prior needs the head count (${site.heads.reason})`, 'cannot-patch');
  if (site.logitsRank !== 3 && site.logitsRank !== 4) throw new InputError(`layer ${site.layer}: a positional prior needs logits of known rank 3 or 4`, 'cannot-patch');
  const pos = ctx.sources.positions(site);
  const headScale = factor?.perHead ? b.op('Reshape', [factor.tensor, b.int64('head_vector', [-1])], {}, 'factor_heads') : undefined;
  let bias = layoutPrior(b, priorTable(b, theta, pos.d, headScale), pos);
  const consumer = site.consumer;
  const current = consumer.node.input[consumer.index];
  if (site.logitsRank === 3) bias = tileOverBatch(b, bias, current, heads);
  if (factor && !factor.perHead) bias = b.op('Mul', [bias, factor.tensor], {}, PART.priorScaled);
  if (site.logitsType !== undefined && site.logitsType !== DataType.FLOAT) bias = b.op('Cast', [bias], { to: site.logitsType }, PART.priorCast);
  else if (site.logitsType === undefined && ctx.opset >= 15) bias = b.op('CastLike', [bias, current], {}, PART.priorCast);
  b.editor.setInput(consumer.node, consumer.index, b.op('Add', [current, bias], {}, 'prior_add'));
}
