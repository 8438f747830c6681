/**
 * What the tool knows about a fused attention operator, as one spec object per operator (the files beside this
 * one): its inputs and outputs by role (the names its schema gives them) with their positions, how detection reads
 * a node of it (query layout, how n is computed, where SSMax on the query stops being exact), where its kernel
 * gives its probabilities, what input synthesis must respect, and when it is expanded. detect, rewrite and verify
 * read these specs; nothing else names an input of these operators by its position.
 *
 * A spec is data and small pure functions: it reads a node only through the NodeView detection gives it, so it
 * imports nothing.
 */
/** `axis`: the axis of the logits that indexes heads (1 for [B,H,Tq,Tk]; 0 for [B·H,Tq,Tk], merged with batch). */
export interface HeadInfo { heads?: number; axis?: number; reason: string }

export interface MaskVerdict { causal: boolean; reason: string }

/**
 * A dimension of an input.
 * @internal
 */
export interface AxisTerm<R extends string = string> { role: R; axis: number }

/**
 * One term of a sequence length: a dimension of an input, or the value of a scalar integer input.
 * @internal
 */
export type Term<R extends string = string> = AxisTerm<R> | { role: R; value: true };

/**
 * Where the query is and how its rows and heads are laid out.
 * @internal
 */
export type QueryPlan<R extends string = string> =
  /** [B, S, N·H]; `bias`: an input whose first N·H entries the kernel adds to the query. */
  | { layout: 'bsd'; input: R; bias?: R }
  /** [B, N, S, H] (ONNX Attention with 4-D inputs). */
  | { layout: 'bnsd'; input: R }
  /** MultiHeadAttention packed QKV [B, S, N, 3, H]: the query is index 0 of axis 3. */
  | { layout: 'bsn3h'; input: R }
  /** Packed QKV [B, S, W]: the query is the first qParts/parts of W (GQA: N of N + 2·Nkv; DMMHA: 1 of 3). */
  | { layout: 'packed'; input: R; qParts: number; parts: number; bias?: R }
  /**
   * com.microsoft Attention computes Q = input·W[:, :hidden] + bias[:hidden] inside: scaling the query columns of
   * `weights` (and `bias`) gives one factor per head, the same for every row (exact for n = Tk). Any other n takes
   * the node expanded (rewrite/ms-attention.ts), unless `expandable` is false (Q is rotated inside the kernel).
   */
  | { layout: 'weights'; weights: R; bias?: R; qWidth?: number; expandable: boolean };

/** @internal */
export type NPlan<R extends string = string> =
  /** n = Tk for every row. */
  | { kind: 'keys'; tk: Term<R>[] }
  /** n_i = Tk − S + i + 1 (bottom-right aligned causal mask, right for KV-cache decoding). */
  | { kind: 'causal'; tk: Term<R>[] }
  /** n_i = P + i + 1 with P the cached length (ONNX Attention's is_causal: row i sees keys ≤ i + P). */
  | { kind: 'causal-offset'; tk: Term<R>[]; offset: Term<R>[] }
  /**
   * Per-batch total lengths from an input (GQA: seqlens_k + 1; ONNX Attention: nonpad_kv_seqlen).
   * causal: n_{b,i} = past_b + i + 1 with past_b = T_b − S, or 0 while GQA processes the first prompt
   * (`promptTotal`, the input that tells it); window: at most `window` keys (GQA local_window_size). Otherwise
   * n_b = T_b. `keys`: the key buffer's length, the key axis of a prior when there is no `promptTotal`.
   */
  | { kind: 'lengths'; lengths: R; plusOne: boolean; causal: boolean; promptTotal?: R; window?: number; keys?: Term<R>[] }
  /**
   * com.microsoft Attention: n_{b,i} = the keys row i of item b may see under `mask` (mask_index, any format the
   * operator accepts) and, when `causal`, at or before its position P + i (`unidirectional`: the kernel itself
   * masks them). Counted outside the kernel, so the node is expanded. `tk`: the key count, for n = Tk instead.
   */
  | { kind: 'mask-index'; causal: boolean; unidirectional: boolean; mask?: R; maskRank?: number; tk: Term<R>[] };

/**
 * What a spec's matcher makes of a node: detection adds the node, the operator and the element type.
 * @internal
 */
export interface OpMatch<R extends string = string> {
  heads: HeadInfo;
  mask: MaskVerdict;
  query: QueryPlan<R>;
  n: NPlan<R>;
  /** The query length S. */
  queryLength: AxisTerm<R>;
  /** Why SSMax on the query is not exactly SSMax on the kernel's logits; such sites are refused unless forced. */
  deviation?: string;
  /**
   * Why the factor cannot go on the operator's inputs, so the node is expanded into its definition and the factor
   * put on the logits there.
   */
  expand?: string;
}

/**
 * What a matcher may ask about a node, answered by detection from the graph.
 * @internal
 */
export interface NodeView<I extends string, O extends string> {
  has(role: I): boolean;
  hasOutput(role: O): boolean;
  /** Rank of a given input (undefined when absent or unknown). */
  rank(role: I): number | undefined;
  /** A dimension of a given input's declared shape. */
  declaredDim(role: I, axis: number): number | undefined;
  int(attribute: string): number | undefined;
  float(attribute: string): number | undefined;
  ints(attribute: string): number[] | undefined;
  /** The masks among `roles` that the node is given, told causal or not; `no mask (why)` when none is. */
  masks(roles: I[], why: string): MaskVerdict;
}

/**
 * What an extra output of the kernel holds: the probabilities, the (masked) logits, or nothing usable and why.
 * @internal
 */
export type QkReading = 'probs' | 'logits' | { reason: string };

/**
 * An output through which the kernel gives its attention (probabilities or logits).
 * @internal
 */
export interface QkOutput<O extends string> {
  output: O;
  /** The attribute that says what the output holds, and the value that makes it hold the most usable thing. */
  mode?: { attribute: string; enable: number };
  /** What the output holds under the attribute's value (0 when unset; 0 too without an attribute). */
  holds(mode: number): QkReading;
}

/**
 * What synthesised lengths an input holds: the run's total (past + sequence), that minus one, the past alone, or
 * the key count of the input in `keysOf` (axis 1 of [B, Tk, ·], axis 2 of [B, N, Tk, H]; past + sequence without it).
 * @internal
 */
export type LengthFill<I extends string> = 'total' | 'total-1' | 'past' | { keysOf: I };

/**
 * What input synthesis must respect. `lengths`, `keyEnds` and `minPast` are what verification uses today; the rest
 * is recorded from the operator's documentation for the synthesis to come.
 * @internal
 */
export interface Contracts<I extends string> {
  /** Lengths inputs verification synthesises, with their values (other lengths inputs are refused, never guessed). */
  lengths?: Partial<Record<I, LengthFill<I>>>;
  /** A 1-D mask in this input holds each item's key end, then (2B, 3B + 2 entries) more positions. */
  keyEnds?: I;
  /** Every run needs at least this many cached tokens, and why (`given`: only when that input is given). */
  minPast?: { tokens: number; why: string; given?: I };
  /**
   * Beam search's cache indirection [B, beams, max length] (it holds beam indices) and the width input it must match
   * on axis 1, where the operator has one.
   */
  beams?: { width?: I; indirection: I };
  /** The query rows the kernel takes, when it takes only so many (`given`: only when that input is given). */
  queryRows?: { rows: number; given?: I };
  /** Sizes that must divide exactly, as the documentation states them. */
  divisible?: { size: string; by: string }[];
  /**
   * A past/present pair that may be one max-length buffer (when `attribute` = 1, or when the input `given` is
   * given), its length on `axis` of the caches; `length` then holds the past's length.
   */
  sharedBuffer?: { attribute: string; given?: I; caches: I[]; axis: number; length?: I };
  /** Token-packed (padding-free) layout: every item's rows in one axis, placed by `offsets` and `cumulative`. */
  packedTokens?: { offsets: I; cumulative: I };
  /** Other requirements of the documentation, in its words. */
  notes?: string[];
}

/** @internal */
export interface OpBase<Id extends string, I extends string, O extends string> {
  /** How reports name the operator: `com.microsoft.MultiHeadAttention`; `Attention` for ONNX's own. */
  id: Id;
  /** `com.microsoft`, or '' for the default domain (also written `ai.onnx`). */
  domain: string;
  opType: string;
  /** The first opset of the default domain that has the operator. */
  sinceOpset?: number;
  /** Input positions by role (the schema's input names). */
  inputs: Readonly<Record<I, number>>;
  outputs: Readonly<Record<O, number>>;
  /**
   * Inputs of the operator's element type T, always given or the first given: any of them tells T when another
   * comes from an op of unknown output type.
   */
  elementType: readonly I[];
  contracts: Contracts<I>;
}

/**
 * An operator the tool patches.
 * @internal
 */
export interface PatchedOp<Id extends string = string, I extends string = string, O extends string = string> extends OpBase<Id, I, O> {
  /** The detection rule's name (rules.ts, the rule table of docs/layout.md). */
  rule: string;
  /** The additive bias the kernel adds to its scaled logits, where a positional prior goes; `bool`: it may be a bool mask (true = attend). */
  prior: { input: I; bool?: boolean };
  /** Where the kernel's attention can be read (absent: it gives none). */
  probabilities?: QkOutput<O>;
  /** When the node is replaced by its definition to place the factor. */
  expansion?: string;
  /** The site's query layout, n and deviations from a node, or why the node cannot be patched. */
  match(v: NodeView<I, O>): OpMatch<I> | { reason: string };
}

/**
 * An operator the tool recognises and refuses, with what to do instead.
 * @internal
 */
export interface RefusedOp<Id extends string = string, I extends string = string, O extends string = string> extends OpBase<Id, I, O> {
  refused: string;
}

/** @internal */
export type AttentionOp = PatchedOp | RefusedOp;

/**
 * A patched operator's spec, its roles typed from `inputs` and `outputs` alone: a role anywhere else that is not
 * one of them does not compile.
 */
export function patchedOp<const Id extends string, I extends string, O extends string>(
  spec: PatchedOp<Id, NoInfer<I>, NoInfer<O>> & { inputs: Record<I, number>; outputs: Record<O, number> }): PatchedOp<Id, I, O> {
  return spec;
}

export function refusedOp<const Id extends string, I extends string, O extends string>(
  spec: RefusedOp<Id, NoInfer<I>, NoInfer<O>> & { inputs: Record<I, number>; outputs: Record<O, number> }): RefusedOp<Id, I, O> {
  return spec;
}

/** The input of a query plan the factor goes on (the weights of com.microsoft Attention). */
export function queryInput<R extends string>(q: QueryPlan<R>): R {
  return q.layout === 'weights' ? q.weights : q.input;
}

/** `num_heads` (or another head-count attribute), or why the heads are not known. */
export function headsFromAttr(v: { int(attribute: string): number | undefined }, name: string): HeadInfo {
  const h = v.int(name);
  return h && h > 0 ? { heads: h, axis: 1, reason: `${name}=${h} attribute` } : { axis: 1, reason: `no ${name} attribute` };
}
