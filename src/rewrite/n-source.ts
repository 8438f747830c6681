/**
 * Builds n, the number of keys each row attends to, once per distinct source for the whole graph. Sites whose
 * query length and key length have the same symbolic expression (all self-attention layers of a decoder, say)
 * share one computation; mask-based forms are shared by the sites that apply the same masks.
 *
 * Views of n: `scalar` [] (keys), `rows` [Tq,1] (causal), `batch-rows` [B|1, 1, R, 1] or [B·H|1, R, 1] (counted
 * from masks, in the view of the logits the masks are applied to).
 */
import { AttentionSite } from '../detect/find-attention';
import { countedMasks, describeUses, HIDDEN_GAP, MaskUse } from '../detect/mask-uses';
import { InputError, opt } from '../errors';
import { constantOf, show } from '../graph/poly';
import { Shapes } from '../graph/shapes';
import { DataType } from '../io/onnx';
import { countsMasks, NMode } from '../policy/n-mode';
import { windowHidden, WindowSpec } from '../policy/window';
import { Builder } from './builder';
import { memo } from '../memo';
import { extremeLastAxis, sumLastAxis } from './versioned';

export type NView = 'scalar' | 'rows' | 'batch-rows';

export interface NTensor {
  /** n as float32. */
  n: string;
  view: NView;
  /** For `batch-rows`: the rank of the masked logits n was counted in (3 for [B·H, Tq, Tk], 4 for [B, H, Tq, Tk]). */
  rank?: number;
  /** Key under which this n is shared; sites with the same key use the same tensors. */
  key: string;
  ln?: string;
}

/**
 * Where Tq and Tk are read: the query [.., Tq, D] and keyᵀ [.., D, Tk] of a plain MatMul (available before it, so
 * the factor can go on the query); otherwise (Einsum, FusedMatMul with transposes) the logits themselves.
 */
function shapeSources(site: AttentionSite): [string, string] {
  if (site.qkMatMul.opType === 'MatMul') return [site.qkMatMul.input[0], site.qkMatMul.input[1]];
  return [site.logits, site.logits];
}

/**
 * Relative positions for a positional prior: d = j − i over every (row, key) a run can see (i the row's absolute
 * position Tk − Tq + row), and the indices that lay a table over them out as [H, Tq, Tk] (prior.ts, layoutPrior).
 *
 * Row `row` of B is the contiguous stretch of the table that starts at Tq − 1 − row. B is cut into blocks of K
 * keys, K the largest of 64, 63, …, 8 that divides Tk and is at most Tq and 2·√Tk (the windows cost about
 * K·(Tq + Tk) gathers of H values, the blocks Tq·Tk / K block copies): `windows` gathers every K-wide stretch of
 * the table once ([S, K], S = Tq + Tk − K: small), `blocks` the stretch each (row, block) starts ([Tq, Tk / K]).
 * Gathering K values at a time is about four times faster in onnxruntime than one value per (i, j) plus a
 * Transpose. Without such a K (one-token decoding, a key count with no divisor there) K is 1, and `blocks` is then
 * the [Tq, Tk] index of d_ij in the table, which the per-(i, j) layout reads.
 */
export interface Positions {
  /** [1, Tq + Tk − 1] float: every d from 1 − Tk to Tq − 1, as a row. */
  d: string;
  /** bool scalar: K ≥ 8 (else K = 1). */
  blocked: string;
  /** [S, K] int32: windows[s, r] = s + r. */
  windows: string;
  /** [Tq, Tk / K] int32: block·K − row + Tq − 1, the window that starts (row, block). */
  blocks: string;
  /** [3] int64: −1, Tq, Tk (the Reshape of gathered blocks to [H, Tq, Tk]). */
  shape: string;
}

/** The sliding window's W and S as int64 scalar constants of the scope (what a user edits, what verify reads). */
export interface WindowTensors {
  size: string;
  sinks: string;
}

export class NSources {
  private readonly cache = new Map<string, NTensor>();
  private readonly positionCache = new Map<string, Positions>();
  private readonly siteKeys = new Map<AttentionSite, string>();
  private readonly windowCache = new Map<string, string>();
  private windowConstants?: WindowTensors;

  /** `window`: every n counts only the keys this sliding window leaves (policy/window.ts). */
  constructor(private readonly b: Builder, private readonly sym: Shapes, private readonly opset: number, private readonly window?: WindowSpec) {}

  /** W and S, one pair for the scope. */
  windowTensors(): WindowTensors {
    const w = this.window!;
    this.windowConstants ??= { size: this.b.int64('window_size', [w.size], true), sinks: this.b.int64('window_sinks', [w.sinks], true) };
    return this.windowConstants;
  }

  /**
   * The window's bias [Tq, Tk] in the logits' type: 0 where it keeps key j for the row at absolute position
   * p = Tk − Tq + i (p − j < W, or j < S), far below any logit elsewhere. Shared by sites of the same Tq, Tk and type.
   */
  windowBias(site: AttentionSite, type: number | undefined, like: string): string {
    return memo(this.windowCache, `bias|${this.dimsKey(site)}|${type ?? like}`, () => {
      const b = this.b;
      const bias = b.op('Where', [this.windowKeep(site, false), b.constant('window_kept', DataType.FLOAT, [], [0]),
        b.constant('window_hidden', DataType.FLOAT, [], [windowHidden(type)])], {}, 'window_bias_f');
      if (type === DataType.FLOAT) return bias;
      if (type !== undefined) return b.op('Cast', [bias], { to: type }, 'window_bias');
      if (this.opset < 15) throw new InputError(`layer ${site.layer}: ${opt('window')} needs the logits' type, not known here (or opset ≥ 15 for CastLike)`, 'cannot-patch');
      return b.op('CastLike', [bias, like], {}, 'window_bias');
    });
  }

  /** bool [Tq, Tk]: what the window keeps; `causal` also hides the keys after each row's position. */
  private windowKeep(site: AttentionSite, causal: boolean): string {
    return memo(this.windowCache, `keep|${causal}|${this.dimsKey(site)}`, () => {
      const b = this.b;
      const w = this.windowTensors();
      const [q, k] = shapeSources(site);
      const tk = b.op('Gather', [b.op('Shape', [k], {}, 'k_shape'), b.int64('last', [-1], true)], {}, 'tk');
      const tq = b.op('Gather', [b.op('Shape', [q], {}, 'q_shape'), b.int64('row', [-2], true)], {}, 'tq');
      const one = b.int64('one', [1], true);
      const p = b.op('Reshape', [b.op('Range', [b.op('Sub', [tk, tq], {}, 'past'), tk, one], {}, 'row_pos'), b.int64('column', [-1, 1])], {}, 'row_pos_column');
      const j = b.op('Reshape', [b.op('Range', [b.int64('zero', [0], true), tk, one], {}, 'key_pos'), b.int64('row_shape', [1, -1])], {}, 'key_pos_row');
      const age = b.op('Sub', [p, j], {}, 'key_age');
      const kept = b.op('Or', [b.op('Less', [age, w.size], {}, 'in_window'), b.op('Less', [j, w.sinks], {}, 'is_sink')], {}, 'window_keep');
      if (!causal) return kept;
      return b.op('And', [kept, b.op('Not', [b.op('Less', [age, b.int64('zero', [0], true)], {}, 'key_ahead')], {}, 'key_not_ahead')], {}, 'window_keep_causal');
    });
  }

  /** n for a site in the given mode; `uses` are the masks on its logits (for mask-based modes). */
  get(site: AttentionSite, mode: NMode, uses: MaskUse[]): NTensor {
    const key = this.keyOf(site, mode, uses);
    return memo(this.cache, key, () => ({ ...this.build(site, mode, uses), key }));
  }

  /** ln(max(n, 1)): a row that sees no key at all gets factor 0, not −inf. */
  ln(entry: NTensor): string {
    entry.ln ??= this.b.op('Log', [this.b.op('Max', [entry.n, this.b.constant('one_f', DataType.FLOAT, [], [1])], {}, 'n_at_least_1')], {}, 'ln_n');
    return entry.ln;
  }

  get size(): number {
    return this.cache.size;
  }

  /** The relative positions of a site, shared by every site whose Tq and Tk have the same symbolic size. */
  positions(site: AttentionSite): Positions {
    return memo(this.positionCache, this.dimsKey(site), () => this.buildPositions(site));
  }

  private buildPositions(site: AttentionSite): Positions {
    if (this.opset < 11) throw new InputError(`layer ${site.layer}: a positional prior needs opset ≥ 11 (Range)`, 'cannot-patch');
    const b = this.b;
    const [q, k] = shapeSources(site);
    const tk = b.op('Gather', [b.op('Shape', [k], {}, 'k_shape'), b.int64('last', [-1], true)], {}, 'tk');
    const tq = b.op('Gather', [b.op('Shape', [q], {}, 'q_shape'), b.int64('row', [-2], true)], {}, 'tq');
    const zero = b.int64('zero', [0], true), one = b.int64('one', [1], true);
    const column = (x: string, name: string): string => b.op('Reshape', [x, b.int64('column', [-1, 1])], {}, name);
    const row = (x: string, name: string): string => b.op('Reshape', [x, b.int64('row_shape', [1, -1])], {}, name);
    const vector = (x: string, name: string): string => b.op('Reshape', [x, b.int64('one_dim', [1])], {}, name);
    const d = b.op('Range', [b.op('Sub', [one, tk], {}, 'd_first'), tq, one], {}, 'd_range');
    const block = this.blockSize(tq, tk);
    const count = b.op('Sub', [b.op('Add', [tq, tk], {}, 'tq_plus_tk'), block], {}, 'window_count');
    const windows = b.op('Add', [column(b.op('Range', [zero, count, one], {}, 'window_starts'), 'window_column'),
      row(b.op('Range', [zero, block, one], {}, 'window_offsets'), 'window_row')], {}, 'windows');
    const starts = row(b.op('Range', [zero, tk, block], {}, 'block_starts'), 'block_row');
    const rows = column(b.op('Range', [zero, tq, one], {}, 'rows'), 'row_column');
    const blocks = b.op('Add', [b.op('Sub', [starts, rows], {}, 'block_minus_row'), b.op('Sub', [tq, one], {}, 'tq_minus_1')], {}, 'blocks');
    return {
      d: row(b.op('Cast', [d], { to: DataType.FLOAT }, 'd'), 'd_row'),
      blocked: b.op('Less', [one, block], {}, 'blocked'),
      windows: b.op('Cast', [windows], { to: DataType.INT32 }, 'windows_i32'),
      blocks: b.op('Cast', [blocks], { to: DataType.INT32 }, 'blocks_i32'),
      shape: b.op('Concat', [b.int64('minus_one', [-1]), vector(tq, 'tq_1d'), vector(tk, 'tk_1d')], { axis: 0 }, 'prior_shape'),
    };
  }

  /** K: the largest of 64, 63, …, 8 that divides Tk, is at most Tq and at most 2·√Tk; else 1 (int64 scalar). */
  private blockSize(tq: string, tk: string): string {
    const b = this.b;
    const sizes = b.int64('block_sizes', Array.from({ length: 57 }, (_, i) => 64 - i));
    const divides = b.op('Equal', [b.op('Mod', [tk, sizes], {}, 'tk_mod_size'), b.int64('zero', [0], true)], {}, 'size_divides');
    const one = b.int64('one', [1], true);
    const fits = b.op('Less', [sizes, b.op('Add', [tq, one], {}, 'tq_plus_1')], {}, 'size_fits');
    // K near 2·√Tk balances the two costs (see Positions): at 512 keys, K = 32 lays B out about 15 % faster than 16.
    const balanced = b.op('Less', [b.op('Mul', [sizes, sizes], {}, 'size_squared'),
      b.op('Add', [b.op('Mul', [tk, b.int64('four', [4], true)], {}, 'tk_times_4'), one], {}, 'size_bound')], {}, 'size_balanced');
    const ok = b.op('And', [b.op('And', [divides, fits], {}, 'size_fits_tq'), balanced], {}, 'size_usable');
    const usable = b.op('Where', [ok, sizes, one], {}, 'usable_sizes');
    return b.op('ReduceMax', [usable], { keepdims: 0 }, 'block');
  }

  /**
   * Remembered per site from its first use (n, before the factor rewires the query): the symbolic pass does not know
   * the tensors the patch inserts, so asking again for the prior's positions would not share them across layers.
   */
  private dimsKey(site: AttentionSite): string {
    return memo(this.siteKeys, site, () => {
      const [q, k] = shapeSources(site);
      const tq = this.sym.dim(q, -2), tk = this.sym.dim(k, -1);
      return tq && tk ? `${show(tq)}|${show(tk)}` : `site:${site.qkMatMul.output[0]}`;
    });
  }

  private keyOf(site: AttentionSite, mode: NMode, uses: MaskUse[]): string {
    const dims = `${this.dimsKey(site)}${this.window ? '|window' : ''}`;
    if (mode === 'keys' || mode === 'causal') return `${mode}|${dims}`;
    return `${mode}|${dims}|${countedMasks(mode, uses).map((u) => `${u.tensor}:${u.rule}`).sort().join(',')}`;
  }

  private build(site: AttentionSite, mode: NMode, uses: MaskUse[]): Omit<NTensor, 'key'> {
    const counted = countedMasks(mode, uses);
    if (countsMasks(mode) && counted.length === 0) {
      const others = describeUses([], uses);
      throw new InputError(`layer ${site.layer}: ${opt('n', mode)} needs a mask on the logits${others ? ` (${others})` : ''}`, 'usage');
    }
    // Causal with key padding, counted cumulatively: the window's causal verdict counts with the padding instead.
    if (this.window && mode === 'causal-padding' && this.keyOnly(counted)) return this.countVisible(site, counted.filter((u) => u.role === 'padding'), this.windowKeep(site, true));
    if (mode === 'mask' || mode === 'padding' || (mode === 'causal-padding' && !this.keyOnly(counted))) return this.countVisible(site, counted, this.window && this.windowKeep(site, false));
    const b = this.b;
    const [q, k] = shapeSources(site);
    const tk = b.op('Gather', [b.op('Shape', [k], {}, 'k_shape'), b.int64('last', [-1], true)], {}, 'tk');
    if (mode === 'keys') return { n: b.op('Cast', [tk], { to: DataType.FLOAT }, 'n_keys'), view: 'scalar' };
    const tq = b.op('Gather', [b.op('Shape', [q], {}, 'q_shape'), b.int64('row', [-2], true)], {}, 'tq');
    if (mode === 'causal-padding') return this.causalPadding(counted, tq, tk);
    const one = b.int64('one', [1], true);
    const first = b.op('Add', [b.op('Sub', [tk, tq], {}, 'past'), one], {}, 'n_first');
    const rows = b.op('Range', [first, b.op('Add', [tk, one], {}, 'n_end'), one], {}, 'n_rows');
    const n = b.op('Reshape', [b.op('Cast', [rows], { to: DataType.FLOAT }, 'n_rows_f'), b.int64('column', [-1, 1])], {}, 'n_causal');
    return { n: this.window ? this.windowed(n) : n, view: 'rows' };
  }

  /** p + 1 keys up to each row → the keys the window leaves of them: min(p + 1, W) + min(S, max(0, p + 1 − W)). */
  private windowed(seen: string): string {
    const b = this.b;
    const w = this.windowTensors();
    const size = b.op('Cast', [w.size], { to: DataType.FLOAT }, 'window_size_f');
    const older = b.op('Max', [b.op('Sub', [seen, size], {}, 'beyond_window'), b.constant('zero_f', DataType.FLOAT, [], [0])], {}, 'beyond_window_0');
    const sinks = b.op('Min', [b.op('Cast', [w.sinks], { to: DataType.FLOAT }, 'window_sinks_f'), older], {}, 'sinks_seen');
    return b.op('Add', [b.op('Min', [seen, size], {}, 'window_seen'), sinks], {}, 'n_windowed');
  }

  /** Visible keys per row: AND of every mask's verdict (and `kept`, [Tq, Tk], when given), summed over the key axis. */
  private countVisible(site: AttentionSite, uses: MaskUse[], kept?: string): Omit<NTensor, 'key'> {
    const b = this.b;
    const other = uses.find((u) => u.viewRank !== 3 && u.viewRank !== 4);
    if (other && kept) throw new InputError(`layer ${site.layer}: ${opt('window')} with masks applied to another view of the logits (${other.tensor}) cannot be counted`, 'cannot-patch');
    if (other) return this.countInView(site, uses, other);
    // Masks of both ranks are counted in the 4-D view: a 3-D one goes there through its [B·H] axis.
    const rank = uses.every((u) => u.viewRank === 3) ? 3 : 4;
    const visibles = uses.map((u) => (u.viewRank === 3 && rank === 4 ? this.headsView(site, this.visible(u)) : this.visible(u)));
    const visible = [...visibles, ...(kept ? [kept] : [])].reduce((acc, v) => b.op('And', [acc, v], {}, 'visible_all'));
    const n = sumLastAxis(b, b.op('Cast', [visible], { to: DataType.FLOAT }, 'visible_f'), true, 'n_mask');
    return { n, view: 'batch-rows', rank };
  }

  /**
   * Masks applied in another view of the logits, made by a Reshape (Swin adds its shift mask in a 5-D
   * [B, windows, H, N, N] view of the [B·windows, H, N, N] logits): n counted there, per window and row, then
   * broadcast to that view and laid out as the query's rows (the same rows in the same order: a Reshape keeps it).
   */
  private countInView(site: AttentionSite, uses: MaskUse[], first: MaskUse): Omit<NTensor, 'key'> {
    const shape = first.viewShape;
    if (!shape || uses.some((u) => u.viewShape !== shape)) {
      throw new InputError(`layer ${site.layer}: counting n from masks needs every mask applied to a 3-D [B·H, Tq, Tk] or 4-D [B, H, Tq, Tk] view of the logits, or all to one view made by a Reshape of known dims`, 'cannot-patch');
    }
    const b = this.b;
    const visible = uses.map((u) => this.visible(u)).reduce((acc, v) => b.op('And', [acc, v], {}, 'visible_all'));
    const counted = sumLastAxis(b, b.op('Cast', [visible], { to: DataType.FLOAT }, 'visible_f'), true, 'n_view');
    const rows = b.op('Concat', [b.op('Slice', [shape, b.int64('zero1', [0]), b.int64('minus_one1', [-1])], {}, 'view_rows'), b.int64('one_dim', [1])], { axis: 0 }, 'view_rows_1');
    const q = shapeSources(site)[0];
    const target = b.op('Concat', [b.op('Slice', [b.op('Shape', [q], {}, 'q_shape'), b.int64('zero1', [0]), b.int64('minus_one1', [-1])], {}, 'q_rows'), b.int64('one_dim', [1])], { axis: 0 }, 'q_rows_1');
    const n = b.op('Reshape', [b.op('Expand', [counted, rows], {}, 'n_view_rows'), target], {}, 'n_mask');
    return { n, view: 'batch-rows', rank: this.sym.rank(q) };
  }

  /**
   * A 3-D [B·H|1, R, Tk] mask verdict as [B, H, R, Tk]: broadcast over B·H first (the first axis of the query, which
   * exists before the product, so the factor can still go on the query), then split.
   */
  private headsView(site: AttentionSite, v: string): string {
    const heads = site.heads.heads;
    if (!heads) throw new InputError(`layer ${site.layer}: counting masks of 3-D and 4-D views together needs the head count, not found in the graph (${site.heads.reason})`, 'cannot-patch');
    const b = this.b;
    const bh = b.op('Slice', [b.op('Shape', [shapeSources(site)[0]], {}, 'q_shape'), b.int64('zero1', [0]), b.int64('one1', [1])], {}, 'bh');
    const full = b.op('Expand', [v, b.op('Concat', [bh, b.int64('ones2', [1, 1])], { axis: 0 }, 'bh11')], {}, 'visible_bh');
    const rest = b.op('Slice', [b.op('Shape', [full], {}, 'visible_shape'), b.int64('one1', [1]), b.int64('three1', [3])], {}, 'rows_keys');
    return b.op('Reshape', [full, b.op('Concat', [b.int64('heads_split', [-1, heads]), rest], { axis: 0 }, 'heads_shape')], {}, 'visible_4d');
  }

  /** Padding masks over keys only ([.., 1, Tk] in a 4-D view): a cumulative count then gives each row's n. */
  private keyOnly(uses: MaskUse[]): boolean {
    return uses.filter((u) => u.role === 'padding')
      .every((u) => u.viewRank === 4 && constantOf(this.sym.dim(u.tensor, -2) ?? new Map([['?', 1]])) === 1);
  }

  /** Causal plus key padding: the unpadded keys up to each row's position, a cumulative count over keys. */
  private causalPadding(uses: MaskUse[], tq: string, tk: string): Omit<NTensor, 'key'> {
    const padding = uses.filter((u) => u.role === 'padding');
    const b = this.b;
    const visible = padding.map((u) => this.visible(u)).reduce((acc, v) => b.op('And', [acc, v], {}, 'visible_all'));
    const counts = b.op('CumSum', [b.op('Cast', [visible], { to: DataType.FLOAT }, 'visible_f'), b.int64('key_axis', [-1], true)], {}, 'visible_cumsum');
    const from = b.op('Reshape', [b.op('Sub', [tk, tq], {}, 'past'), b.int64('one_dim', [1])], {}, 'row_start');
    const to = b.op('Reshape', [tk, b.int64('one_dim', [1])], {}, 'row_end');
    const rows = b.op('Slice', [counts, from, to, b.int64('key_axis_1', [-1])], {}, 'n_rows_keys');
    return { n: b.op('Transpose', [rows], { perm: [0, 1, 3, 2] }, 'n_causal_padding'), view: 'batch-rows', rank: 4 };
  }

  /** Keys a mask leaves visible: by its condition, or by effect (entries at least HIDDEN_GAP from their row's extreme hide). */
  private visible(u: MaskUse): string {
    const b = this.b;
    if (u.rule === 'keep-where') return b.op('Cast', [u.tensor], { to: DataType.BOOL }, 'keep');
    if (u.rule === 'drop-where') return b.op('Not', [b.op('Cast', [u.tensor], { to: DataType.BOOL }, 'drop')], {}, 'keep');
    const m = b.op('Cast', [u.tensor], { to: DataType.FLOAT }, 'mask_f');
    const additive = u.rule === 'additive';
    const extreme = extremeLastAxis(b, m, additive ? 'ReduceMax' : 'ReduceMin', additive ? 'mask_row_max' : 'mask_row_min');
    const gap = b.constant('hidden_gap', DataType.FLOAT, [], [HIDDEN_GAP]);
    return additive
      ? b.op('Greater', [m, b.op('Sub', [extreme, gap], {}, 'hidden_below')], {}, 'keep')
      : b.op('Less', [m, b.op('Add', [extreme, gap], {}, 'hidden_above')], {}, 'keep');
  }
}
