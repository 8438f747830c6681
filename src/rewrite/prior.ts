/**
 * A positional prior at one Softmax site (see policy/prior.ts): c_i·B_ij is added to the logits right after the
 * factor and before every mask, so the Softmax sees c·(z + B) + masks and masked entries stay masked.
 *
 * B depends on (head, j − i) only: it is built per layer as a small table over the Tq + Tk − 1 relative positions
 * a run can see, from θ initializers at run time (so θ can be fine-tuned), then gathered into [Tq, Tk, H] through
 * an index matrix shared by every layer with the same Tq and Tk. Per layer that is one Gather, one Transpose to
 * [H, Tq, Tk], one Mul by the factor and one Add over the logits.
 */
import { AttentionSite } from '../detect/find-attention';
import { InputError } from '../errors';
import { DataType } from '../io/onnx';
import { LayerTheta, THETAS, ThetaName } from '../policy/prior';
import { Builder } from './builder';
import { ScaleContext, tileOverBatch } from './insert-scale';

/** The θ initializers (or, in a function body, the inputs θ comes in through) of one site. */
export type ThetaTensors = Record<ThetaName, string>;

export function thetaConstants(b: Builder, theta: LayerTheta): ThetaTensors {
  const out = {} as ThetaTensors;
  for (const t of THETAS) out[t] = b.constant(`theta_${t}`, DataType.FLOAT, [theta[t].length], theta[t]);
  return out;
}

/**
 * Adds c·B at the site; `factor` is c (absent for the none preset, c = 1). A factor that is one value per head for
 * every row scales the small table instead of the gathered [H, Tq, Tk] prior. Returns the Add node's output.
 */
export function insertPrior(ctx: ScaleContext, b: Builder, site: AttentionSite, theta: ThetaTensors,
  factor: { tensor: string; perHead: boolean } | undefined): string {
  const heads = site.heads.heads;
  if (!heads) throw new InputError(`layer ${site.layer}: a positional prior needs the head count (${site.heads.reason})`);
  if (site.logitsRank !== 3 && site.logitsRank !== 4) throw new InputError(`layer ${site.layer}: a positional prior needs logits of known rank 3 or 4`);
  const pos = ctx.sources.positions(site);
  const row = (x: string, name: string): string => b.op('Reshape', [x, b.int64('head_row', [1, -1])], {}, name);
  const muTheta = theta.mu;
  const mu = b.op('Sub', [b.op('Exp', [muTheta], {}, 'exp_mu'), b.op('Exp', [b.op('Neg', [muTheta], {}, 'neg_mu')], {}, 'exp_neg_mu')], {}, 'mu');
  const distance = b.op('Abs', [b.op('Sub', [pos.d, row(mu, 'mu_row')], {}, 'd_minus_mu')], {}, 'distance');
  const powered = b.op('Pow', [b.op('Add', [distance, b.constant('eps', DataType.FLOAT, [], [1e-5])], {}, 'distance_eps'),
    row(theta.beta, 'beta_row')], {}, 'distance_pow');
  const scale = b.op('Neg', [b.op('Exp', [row(theta.alpha, 'alpha_row')], {}, 'exp_alpha')], {}, 'prior_scale');
  // The table is [positions, heads] so that Gather copies one row of H values per (i, j): several times faster in
  // onnxruntime than gathering single values from a [heads, positions] table.
  let table = b.op('Mul', [scale, powered], {}, 'prior_table');
  if (factor?.perHead) table = b.op('Mul', [table, row(factor.tensor, 'factor_row')], {}, 'prior_table_scaled');
  let bias = b.op('Transpose', [b.op('Gather', [table, pos.index], { axis: 0 }, 'prior_ijh')], { perm: [2, 0, 1] }, 'prior');
  const consumer = site.consumer;
  const current = consumer.node.input[consumer.index];
  if (site.logitsRank === 3) bias = tileOverBatch(b, bias, current, heads);
  if (factor && !factor.perHead) bias = b.op('Mul', [bias, factor.tensor], {}, 'prior_scaled');
  if (site.logitsType !== undefined && site.logitsType !== DataType.FLOAT) bias = b.op('Cast', [bias], { to: site.logitsType }, 'prior_cast');
  else if (site.logitsType === undefined && ctx.opset >= 15) bias = b.op('CastLike', [bias, current], {}, 'prior_cast');
  const added = b.op('Add', [current, bias], {}, 'prior_add');
  b.rewire(consumer.node, consumer.index, added);
  return added;
}
