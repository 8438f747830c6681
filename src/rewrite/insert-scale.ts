/**
 * Inserts c = s·ln(n) at one attention site: Mul(logits, c), with n read from the logits' shape at run time.
 *
 *   keys:   n = Tk                      → c has shape []      (or [H,1,1] per head)
 *   causal: n_i = Tk − Tq + i + 1       → c has shape [Tq,1]  (or [H,Tq,1] per head)
 *
 * The factor goes on the content logits before any mask, so masked entries stay exactly as they were:
 * no 0·(−inf), and no finfo.min pushed to −inf. In [B·H,Tq,Tk] logits per-head s is tiled over the batch.
 */
import { InputError } from '../errors';
import { AttentionSite } from '../detect/find-attention';
import { DataType } from '../io/onnx';
import { NMode } from '../policy/n-mode';
import { LayerScale } from '../policy/scale';
import { Builder } from './builder';
import { applyFactor } from './dtype';

export interface InsertedScale {
  sName: string;
  factor: string;
  apply: string;
  factorType: number;
}

/** `sInput`: an existing tensor holding s (a function input inside a function body) instead of a new constant. */
export function insertScale(b: Builder, site: AttentionSite, s: LayerScale, mode: NMode, opset: number, sInput?: string): InsertedScale {
  const rank = site.logitsRank;
  const perHead = Array.isArray(s);
  if (perHead && rank !== 3 && rank !== 4) {
    throw new InputError(`layer ${site.layer}: per-head s needs logits of known rank 3 or 4`);
  }
  if (mode === 'causal' && opset < 11) throw new InputError(`layer ${site.layer}: causal n needs opset ≥ 11 (Range)`);
  if (rank === undefined && opset < 11) throw new InputError(`layer ${site.layer}: logits of unknown rank at opset < 11`);

  const sName = sInput ?? b.constant('s', DataType.FLOAT, perHead ? [s.length, 1, 1] : [], perHead ? s : [s]);
  const shape = b.op('Shape', [site.logits]);
  const axis = (k: number): number => (rank === undefined ? -k : rank - k);
  const tk = b.op('Gather', [shape, b.int64('last_axis', [axis(1)], true)], {}, 'tk');
  let lnN: string;
  if (mode === 'keys') {
    lnN = b.op('Log', [b.op('Cast', [tk], { to: DataType.FLOAT }, 'n')], {}, 'ln_n');
  } else {
    const tq = b.op('Gather', [shape, b.int64('row_axis', [axis(2)], true)], {}, 'tq');
    const one = b.int64('one', [1], true);
    const first = b.op('Add', [b.op('Sub', [tk, tq], {}, 'past'), one], {}, 'n_first');
    const rows = b.op('Range', [first, b.op('Add', [tk, one], {}, 'n_end'), one], {}, 'n_rows');
    const ln = b.op('Log', [b.op('Cast', [rows], { to: DataType.FLOAT }, 'n')], {}, 'ln_n_rows');
    lnN = b.op('Reshape', [ln, b.int64('column', [-1, 1])], {}, 'ln_n');
  }
  let sTensor = sName;
  if (perHead && rank === 3) {
    // [H,1,1] → [B·H,1,1]: logits row b·H + h belongs to head h.
    const bh = b.op('Gather', [shape, b.int64('batch_axis', [0], true)], {}, 'bh');
    const batch = b.op('Div', [bh, b.int64('heads', [s.length], true)], {}, 'batch');
    const reps = b.op('Concat', [b.op('Reshape', [batch, b.int64('one_dim', [1])]), b.int64('ones', [1, 1])], { axis: 0 }, 'reps');
    sTensor = b.op('Tile', [sName, reps], {}, 's_tiled');
  }
  const factor = b.op('Mul', [sTensor, lnN], {}, 'factor');
  const { output: scaled, apply, factorType } = applyFactor(b, site.logits, factor, site.logitsType, opset);
  site.consumer.node.input[site.consumer.index] = scaled;
  return { sName, factor, apply, factorType };
}

