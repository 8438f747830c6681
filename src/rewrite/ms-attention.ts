/**
 * com.microsoft Attention expanded, so each query row gets its own factor. The operator computes Q, K and V inside
 * from `weights` and `bias`, so a per-row factor cannot reach Q through its inputs. The node is replaced (through
 * the journal, so revert puts it back byte for byte) by its definition, with the same output names:
 *
 *   qkv = input·weights + bias, split at qkv_hidden_sizes (equal thirds without it)
 *   q'  = c ⊙ q, c_{b,i} = s·ln n_{b,i} per row (per head with per-head s)
 *   present = Concat(past, stack(k, v)) on the sequence axis  [2, B, N, P + S, H], as the operator writes it
 *             (a shared buffer: the new keys written at past_sequence_length, the rest of the buffer kept)
 *   output  = Softmax(scale · q'·Kᵀ + attention_bias + mask)·V: for several query rows (a prompt) on
 *             com.microsoft MultiHeadAttention with K and V taken out of present; for one row (decoding) in plain
 *             ops on present itself, where reading the half a product does not need costs less than copying K and V
 *             out (an If picks at run time)
 *
 * With `--cache-layout split` (asked for: it changes the model's interface) the stacked cache input and output become
 * key and value halves, and the site one MultiHeadAttention reading and writing them (splitCache).
 *
 * The mask the kernel would build (PrepareMask in onnxruntime's attention_helper.h) is built here as an additive
 * bias with the same values: mask_filter_value where mask_index hides a key, the type's lowest value where causal
 * masking does. n_{b,i} counts the keys left visible, from every mask_index format the operator accepts: key
 * lengths [B], end and start positions [2B], [3B + 2] (key lengths first), raw [B, T] (a [B, 1] dummy means no
 * mask), [B, S, T], and Megatron's [B, 1, M, M] (rows T − S … T − 1). The mask and n are built once per graph for
 * every layer that reads the same mask at the same lengths.
 */
import { FusedSite } from '../detect/fused';
import { inputList, inputOf, MS_ATTENTION, MULTI_HEAD_ATTENTION, NPlan, outputOf } from '../graph/attention-ops';
import { attrFloat, attrInts, Graph } from '../graph/graph';
import { constantOf, show } from '../graph/poly';
import { Shapes } from '../graph/shapes';
import { DataType, ValueInfoProto } from '../io/onnx';
import { LayerScale } from '../policy/scale';
import { AttrValue, Builder } from './builder';
import { factorBnsd, InsertedFused, INT64_MAX, RowFactor, Rows, scaleRows } from './fused';
import { PART } from '../identity';
import { memo } from '../memo';
import { fusedPrior, ThetaTensors } from './prior';
import { Preset } from '../policy/factor';
import { squeeze, sumLastAxis, unsqueeze } from './versioned';

type MaskIndexPlan = Extract<NPlan, { kind: 'mask-index' }>;
type Role = keyof typeof MS_ATTENTION.inputs;

/** The operator's input in a role ('' when absent). */
const at = (node: FusedSite['node'], role: Role): string => inputOf(MS_ATTENTION, node, role);

/** What the layers of one graph share: ln n per row and the additive mask, by source and lengths. */
export interface ExpansionShared {
  builder: Builder;
  shapes: Shapes;
  opset: number;
  cache: Map<string, MaskTensors>;
}

interface MaskTensors {
  /** max(n, 1) and its logarithm, float [B|1, S|1]. */
  rows: Rows;
  /** The lengths: S query rows after a past of P, T = P + S keys (int64 scalars). */
  lengths: { S: string; P: string; T: string };
  /** The additive mask [B|1, 1, S, T] in the attention's type, when the kernel masks anything. */
  bias?: string;
}

const LOWEST: Record<number, number> = { [DataType.FLOAT]: -3.4028234663852886e38, [DataType.FLOAT16]: -65504, [DataType.BFLOAT16]: -3.3895313892515355e38 };

/** What the expansion costs at run time, for the report. */
export const EXPANSION_COST = 'node expanded into its definition: QKV projection as MatMul + Add; several query rows (a prompt) on '
  + 'MultiHeadAttention with K and V copied out of the stacked cache; one row (decoding) in plain ops over the stacked cache, '
  + 'reading the half each product does not need once more instead of copying; expected cost (12L × 768 GPT-2, onnxruntime CPU): '
  + 'prompts 0.97–0.98× the original\'s time, decoding about 1.06× (its stacked cache allows no cheaper form; --cache-layout split, '
  + 'an interface change, runs it fused; docs/factor.md)';

/** What the split cache costs (`--cache-layout split`), for the report. */
export const SPLIT_COST = 'node written as com.microsoft MultiHeadAttention on the scaled query, its cache split into past/present key and '
  + 'value (--cache-layout split: the model\'s interface changed, docs/factor.md); no expansion cost: onnxruntime runs it fused';

/**
 * The factor and prior of one expanded site: the preset, s (as given and its tensor), θ when a prior is added;
 * `split`: the builder (journalled as the layout's owner) that rewrites the site's stacked cache as its halves.
 */
export interface ExpansionParams { preset: Preset; s?: LayerScale; sName?: string; theta?: ThetaTensors; split?: Builder }

/**
 * A stacked cache `--cache-layout split` replaced by its halves: the graph input `past` [2, B, N, P, H] by `pastKey`
 * and `pastValue` [B, N, P, H], the output `present` by `presentKey` and `presentValue` (the record's cacheLayout).
 */
export interface CacheSplit {
  /** The stacked cache input [2, B, N, P, H] the patch removed, and the halves [B, N, P, H] that replace it. */
  past: string;
  pastKey: string;
  pastValue: string;
  /** The stacked cache output [2, B, N, P + S, H] the patch removed, and the halves [B, N, P + S, H] that replace it. */
  present: string;
  presentKey: string;
  presentValue: string;
}

export function expandMsAttention(b: Builder, shared: ExpansionShared, site: FusedSite, p: ExpansionParams,
  plan: MaskIndexPlan): InsertedFused & { split?: CacheSplit } {
  const node = site.node;
  const input = (role: Role): string | undefined => inputOf(MS_ATTENTION, node, role) || undefined;
  const dtype = site.queryType ?? DataType.FLOAT;
  const heads = site.heads.heads!;
  const opset = shared.opset;
  const masks = maskTensors(shared, site, plan, dtype);
  b.editor.remove(node);
  const [q, k, v] = projection(b, at(node, 'input'), at(node, 'weights'), input('bias'), attrInts(node, 'qkv_hidden_sizes'));
  const f: RowFactor | undefined = p.sName ? { preset: p.preset, s: p.sName, perHead: Array.isArray(p.s), rows: masks.rows } : undefined;
  const applied = f ? scaleRows(b, q, f, heads, dtype, opset) : undefined;
  const userBias = input('attention_bias');
  let bias = userBias && masks.bias ? b.op('Add', [userBias, masks.bias], {}, 'attention_bias') : userBias ?? masks.bias;
  if (p.theta) {
    const prior = fusedPrior(b, p.theta, { ...masks.lengths, past: masks.lengths.P }, f && factorBnsd(b, f), dtype);
    bias = bias ? b.op('Add', [bias, prior], {}, PART.attentionBiasPrior) : prior;
  }
  const first = { nodes: b.editor.edits.nodes.length, initializers: b.editor.edits.initializers.length };
  const kv = cache(b, node, k, v, heads);
  const S = shared.shapes.dim(at(node, 'input'), 1);
  const form = { rows: S && constantOf(S), dtype };
  const scale = attentionScale(shared, site, dtype);
  const query = applied?.output ?? q;
  attend(b, query, kv, bias, heads, scale, outputOf(MS_ATTENTION, node, 'output'), form);
  // The split form replaces the cache and attention just written: undoing it (verification's plain-op form) gives them back.
  const written = { nodes: b.editor.edits.nodes.slice(first.nodes), initializers: b.editor.edits.initializers.slice(first.initializers) };
  const split = p.split && splitCache(p.split, node, { query, k, v, bias, heads, scale }, written);
  return { factor: applied?.output ?? '', apply: applied?.apply ?? '', factorType: applied?.factorType ?? DataType.FLOAT, rows: masks.rows, ...(split ? { split } : {}) };
}

/**
 * Why a site's stacked cache cannot be split ('' when it can): its past must be a graph input and its present a
 * graph output of the main graph, nothing else may read them but Shape nodes (of the past; rewritten to the same
 * shape from its halves), and the cache must not be a shared buffer (past_sequence_length).
 */
export function unsplittable(graph: Graph, node: FusedSite['node'], main: boolean): string {
  const past = at(node, 'past'), present = outputOf(MS_ATTENTION, node, 'present');
  if (!past || !present) return 'it has no cache (past and present)';
  if (!main) return 'it is inside a subgraph, whose interface its caller fixes';
  if (at(node, 'past_sequence_length')) return 'its cache is a shared buffer (past_sequence_length)';
  if (!graph.inputs.has(past) || !graph.outputs.has(present)) return `its cache is not the model's own input and output ('${past}', '${present}')`;
  const other = graph.consumersOf(past).find((n) => n !== node && (n.opType !== 'Shape' || n.attribute.length > 0));
  if (other) return `'${past}' is read by ${other.opType} '${other.name}' too`;
  if (graph.consumersOf(present).length) return `'${present}' is read inside the graph`;
  return '';
}

interface SplitParts { query: string; k: string; v: string; bias?: string; heads: number; scale: Scale }

/**
 * The site's cache split (the header's stacked cache given up for the interface MultiHeadAttention takes): the
 * nodes and constants `inserted` for the stacked cache and its attention come out, the graph input and output of
 * the stacked cache are replaced by their halves in the same places, one MultiHeadAttention reads the halves and
 * writes the new ones, and a Shape of the stacked past still read (the mask's lengths, or the model's own) becomes
 * the same shape from the key half.
 */
function splitCache(lb: Builder, node: FusedSite['node'], parts: SplitParts, inserted: { nodes: string[]; initializers: string[] }): CacheSplit {
  const g = lb.graph;
  const names = new Set(inserted.nodes);
  for (const n of g.nodes.filter((x) => names.has(x.name))) lb.editor.remove(n);
  // Their constants go too (onnxruntime would warn of each initializer nothing reads).
  for (const t of inserted.initializers) if (!g.consumersOf(t).length) lb.editor.removeInitializer(t);
  const [pastKey, pastValue] = splitDeclaration(lb, at(node, 'past'), 'input');
  const [presentKey, presentValue] = splitDeclaration(lb, outputOf(MS_ATTENTION, node, 'present'), 'output');
  for (const reader of g.consumersOf(at(node, 'past'))) {
    lb.editor.remove(reader);
    lb.node('Concat', [lb.int64('stacked_dim', [2]), lb.op('Shape', [pastKey], {}, 'past_key_shape')], [reader.output[0]], { axis: 0 }, '', 'past_shape');
  }
  const caches = { past_key: pastKey, past_value: pastValue };
  const inputs = inputList(MULTI_HEAD_ATTENTION, { query: parts.query, key: parts.k, value: parts.v, attention_bias: parts.bias, ...caches });
  lb.node(MULTI_HEAD_ATTENTION.opType, inputs, [outputOf(MS_ATTENTION, node, 'output'), presentKey, presentValue], attentionAttrs(parts.heads, parts.scale),
    MULTI_HEAD_ATTENTION.domain);
  return { past: at(node, 'past'), pastKey, pastValue, present: outputOf(MS_ATTENTION, node, 'present'), presentKey, presentValue };
}

/**
 * A stacked cache's graph input or output [2, …] replaced, in its place, by its key and value halves `<name>.key`,
 * `<name>.value` [ …] (the same declaration without the leading 2). Returns their names.
 */
function splitDeclaration(lb: Builder, name: string, kind: 'input' | 'output'): [string, string] {
  const list = kind === 'input' ? lb.graph.proto.input : lb.graph.proto.output;
  const stacked = list.find((v) => v.name === name)!;
  const index = list.indexOf(stacked);
  const t = stacked.type?.tensorType;
  const dims = t?.shape?.dim.slice(1);
  const halves = (['key', 'value'] as const).map((part): ValueInfoProto => ({
    name: lb.graph.uniqueName(`${name}.${part}`), type: { tensorType: { elemType: t?.elemType ?? DataType.FLOAT, ...(dims ? { shape: { dim: dims } } : {}) } },
  }));
  if (kind === 'input') {
    lb.editor.removeInput(name);
    halves.forEach((v, i) => lb.editor.addInput(v, index + i));
  } else {
    lb.editor.removeOutput(name);
    halves.forEach((v, i) => lb.editor.addOutput(v, index + i));
  }
  return [halves[0].name, halves[1].name];
}

/** MultiHeadAttention's attributes: the head count, and the operator's scale where it gave one (else 1/√H, the default of both). */
function attentionAttrs(heads: number, scale: Scale): Record<string, AttrValue> {
  return { num_heads: heads, ...(scale.given !== undefined ? { scale: { float: scale.given } } : {}) };
}

/** The operator's `scale`, else 1/√H with H the query's head size (from qkv_hidden_sizes or the weights' width). */
function attentionScale(shared: ExpansionShared, site: FusedSite, dtype: number): Scale {
  const node = site.node;
  const given = attrFloat(node, 'scale');
  if (given) return { given, value: given, dtype };
  const weights = shared.shapes.dim(at(node, 'weights'), 1);
  const width = attrInts(node, 'qkv_hidden_sizes')?.[0] ?? (weights ? constantOf(weights) : undefined);
  const qWidth = attrInts(node, 'qkv_hidden_sizes') ? width : width !== undefined ? width / 3 : undefined;
  return { value: qWidth !== undefined ? 1 / Math.sqrt(qWidth / site.heads.heads!) : undefined, dtype };
}

/**
 * Softmax(scale · q·Kᵀ + bias)·V into `output` [B, S, N·H_v]. On a stacked cache, one row (singleRow) or a prompt (K
 * and V taken out, a copy small against the products), as the header says: chosen here when the query length is
 * fixed (`form.rows`; a branch for the other length would not even pass shape inference), else by an If at run time
 * whose branches declare their output's type (`form.dtype`).
 */
function attend(b: Builder, q: string, kv: Cache, bias: string | undefined, heads: number, scale: Scale, output: string,
  form: { rows?: number; dtype: number }): void {
  if (!('stacked' in kv)) {
    rows(b, q, kv.k, kv.v, bias, heads, scale, output);
    return;
  }
  const stacked = kv.stacked;
  const prompt = (sb: Builder, out?: string): string => {
    const half = (i: number): string => sb.op('Gather', [stacked, sb.int64(`index${i}`, [i], true)], { axis: 0 }, i ? 'value_all' : 'key_all');
    return rows(sb, q, half(0), half(1), bias, heads, scale, out);
  };
  if (form.rows !== undefined) {
    if (form.rows !== 1) prompt(b, output);
    else b.node('Identity', [singleRow(b, q, stacked, bias, heads, scale)], [output]);
    return;
  }
  const seq = b.op('Gather', [b.op('Shape', [q], {}, 'q_shape'), b.int64('axis1', [1], true)], {}, 'q_rows');
  const oneRow = b.op('Equal', [seq, b.int64('one', [1], true)], {}, 'one_row');
  const decode = b.branch('one_row', (sb) => singleRow(sb, q, stacked, bias, heads, scale), form.dtype);
  const many = b.branch('rows', (sb) => prompt(sb), form.dtype);
  b.node('If', [oneRow], [output], { then_branch: { graph: decode }, else_branch: { graph: many } });
}

/**
 * MultiHeadAttention of q [B, S, N·H] over K, V ([B, N, T, H] from a cache, or [B, T, N·H] new ones); the mask
 * and any attention_bias as its attention_bias. Returns its output ([B, S, N·H_v]), written to `output` if given.
 */
function rows(b: Builder, q: string, K: string, V: string, bias: string | undefined, heads: number, scale: Scale, output?: string): string {
  const inputs = inputList(MULTI_HEAD_ATTENTION, { query: q, key: K, value: V, attention_bias: bias });
  const out = output ?? b.graph.uniqueName(`${b.prefix}attention`);
  b.node(MULTI_HEAD_ATTENTION.opType, inputs, [out], attentionAttrs(heads, scale), MULTI_HEAD_ATTENTION.domain);
  return out;
}

/**
 * One query row over the stacked cache [2, B, N, T, H] without copying it: present·qᵀ gives k·q and v·q for every
 * cached position ([2, B, N, T, 1], the first kept), probabilities·present gives p·K and p·V (the second kept).
 */
function singleRow(b: Builder, q: string, stacked: string, bias: string | undefined, heads: number, scale: Scale): string {
  // Scaled before the reshapes: a scalar Mul right before the MatMul would be fused into a slower FusedMatMul.
  const scaled = scale.value !== undefined ? b.op('Mul', [q, b.constant('scale', scale.dtype, [], [scale.value])], {}, 'q_scaled')
    : b.op('Div', [q, sqrtHeadSize(b, b.op('Reshape', [q, b.int64('q_heads_view', [0, 0, heads, -1])], {}, 'q_heads_4d'), scale.dtype)], {}, 'q_scaled');
  const qT = unsqueeze(b, b.op('Reshape', [scaled, b.int64('q_column', [0, heads, -1, 1])], {}, 'q_col'), [0], 'q_col_5d');
  const both = b.op('MatMul', [stacked, qT], {}, 'kq_both');
  let logits = b.op('Reshape', [b.op('Gather', [both, b.int64('index0', [0], true)], { axis: 0 }, 'kq'), b.int64('row_view', [0, 0, 1, -1])], {}, 'qk');
  if (bias) logits = b.op('Add', [logits, bias], {}, 'qk_masked');
  const probs = unsqueeze(b, b.op('Softmax', [logits], { axis: 3 }, PART.probs), [0], 'probs_5d');
  const context = b.op('Gather', [b.op('MatMul', [probs, stacked], {}, 'pv_both'), b.int64('index1', [1], true)], { axis: 0 }, 'pv');
  return b.op('Reshape', [context, b.int64('merge_row', [0, 1, -1])], {}, 'attention');
}

/** √H in the attention's type, H the last axis of `qh`: the default scale when the head size is only known at run time. */
function sqrtHeadSize(b: Builder, qh: string, dtype: number): string {
  const size = b.op('Cast', [b.op('Gather', [b.op('Shape', [qh]), b.int64('axis_last', [-1], true)], {}, 'head_size')], { to: DataType.FLOAT }, 'head_size_f');
  return b.op('Cast', [b.op('Sqrt', [size], {}, 'sqrt_head_size')], { to: dtype }, 'sqrt_head_size_t');
}

/**
 * The logits' scale: `given` by the operator, `value` when known at all (else 1/√H at run time); `dtype`: the
 * attention's type.
 */
interface Scale { given?: number; value?: number; dtype: number }

/** q, k, v of the operator's projection: input·weights (+ bias), split at qkv_hidden_sizes or in thirds. */
function projection(b: Builder, x: string, weights: string, bias: string | undefined, sizes: number[] | undefined): string[] {
  let qkv = b.op('MatMul', [x, weights], {}, 'qkv');
  if (bias) qkv = b.op('Add', [qkv, bias], {}, 'qkv_biased');
  const axis = b.int64('axis2', [2]);
  let bounds: string[];
  if (sizes?.length === 3) bounds = [0, sizes[0], sizes[0] + sizes[1], INT64_MAX].map((x) => b.int64('bound', [x]));
  else {
    const width = b.op('Slice', [b.op('Shape', [weights]), b.int64('last', [-1]), b.int64('end', [INT64_MAX])], {}, 'width');
    const third = b.op('Div', [width, b.int64('three', [3])], {}, 'third');
    bounds = [b.int64('zero1', [0]), third, b.op('Add', [third, third], {}, 'two_thirds'), b.int64('end', [INT64_MAX])];
  }
  return ['q', 'k', 'v'].map((name, i) => b.op('Slice', [qkv, bounds[i], bounds[i + 1], axis], {}, name));
}

/** Keys and values: the stacked cache [2, B, N, T, H], or without a cache the new ones [B, S, N·H]. */
type Cache = { stacked: string } | { k: string; v: string };

/**
 * The operator's `present` output (same name and layout), which is also what attention reads: past followed by
 * the new keys and values. Without past and present, the new k and v alone.
 */
function cache(b: Builder, node: FusedSite['node'], k: string, v: string, heads: number): Cache {
  const past = at(node, 'past');
  const present = outputOf(MS_ATTENTION, node, 'present');
  if (!past && !present) return { k, v };
  const kv5 = b.op('Reshape', [b.op('Concat', [k, v], { axis: 2 }, 'kv'), b.int64('kv_shape', [0, 0, 2, heads, -1])], {}, 'kv5');
  const presentName = present || b.graph.uniqueName(`${b.prefix}present`);
  if (!past) {
    b.node('Transpose', [kv5], [presentName], { perm: [2, 0, 3, 1, 4] });
    return { stacked: presentName };
  }
  const stacked = b.op('Transpose', [kv5], { perm: [2, 0, 3, 1, 4] }, 'kv_new');
  if (!at(node, 'past_sequence_length')) {
    b.node('Concat', [past, stacked], [presentName], { axis: 3 });
    return { stacked: presentName };
  }
  // Shared buffer: the new keys go to positions P … P + S − 1 of the max-length buffer, the rest stays.
  const P = b.op('Reshape', [b.op('Cast', [at(node, 'past_sequence_length')], { to: DataType.INT64 }), b.int64('one_dim', [1])], {}, 'past_len');
  const end = b.op('Add', [P, b.op('Slice', [b.op('Shape', [k]), b.int64('one1', [1]), b.int64('two1', [2])], {}, 'seq')], {}, 'valid_end');
  const axis3 = b.int64('axis3', [3]);
  const zero = b.int64('zero1', [0]);
  const head = b.op('Slice', [past, zero, P, axis3], {}, 'past_valid');
  const tail = b.op('Slice', [past, end, b.int64('end', [INT64_MAX]), axis3], {}, 'past_rest');
  b.node('Concat', [head, stacked, tail], [presentName], { axis: 3 });
  return { stacked: b.op('Slice', [presentName, zero, end, axis3], {}, 'present_valid') };
}

// ---- the mask and n, once per graph ---------------------------------------------------------------------

function maskTensors(shared: ExpansionShared, site: FusedSite, plan: MaskIndexPlan, dtype: number): MaskTensors {
  const node = site.node;
  const { shapes } = shared;
  const [past, pastLength] = [at(node, 'past'), at(node, 'past_sequence_length')];
  const S = shapes.dim(at(node, 'input'), 1);
  const P = pastLength ? undefined : past ? shapes.dim(past, 3) : undefined;
  const lengths = S && (P || !past) ? `${show(S)}|${P ? show(P) : '0'}|${pastLength}` : `site:${outputOf(MS_ATTENTION, node, 'output')}`;
  const filter = attrFloat(node, 'mask_filter_value') ?? -10000;
  const key = [plan.mask !== undefined ? inputOf<string>(MS_ATTENTION, node, plan.mask) : '-', lengths, plan.causal, plan.unidirectional, filter, dtype].join('|');
  return memo(shared.cache, key, () => buildMask(shared, site, plan, dtype, filter));
}

/** Lengths as int64 scalars: S, the past P, T = P + S. */
function lengthsOf(b: Builder, node: FusedSite['node']): { S: string; P: string; T: string } {
  const dim = (name: string, axis: number): string => b.op('Gather', [b.op('Shape', [name]), b.int64(`axis${axis}`, [axis], true)], {}, 'len');
  const [past, pastLength] = [at(node, 'past'), at(node, 'past_sequence_length')];
  const S = dim(at(node, 'input'), 1);
  const P = pastLength ? b.op('Reshape', [b.op('Cast', [pastLength], { to: DataType.INT64 }), b.int64('scalar', [])], {}, 'past_len')
    : past ? dim(past, 3) : b.int64('zero', [0], true);
  return { S, P, T: b.op('Add', [P, S], {}, 'total_len') };
}

function buildMask(shared: ExpansionShared, site: FusedSite, plan: MaskIndexPlan, dtype: number, filter: number): MaskTensors {
  const b = shared.builder;
  const node = site.node;
  const { S, P, T } = lengthsOf(b, node);
  const zero = b.int64('zero', [0], true);
  const one = b.int64('one', [1], true);
  const keys = b.op('Range', [zero, T, one], {}, 'key_pos');
  const rowEnd = unsqueeze(b, b.op('Add', [b.op('Range', [zero, S, one], {}, 'row'), P], {}, 'row_pos'), [1], 'row_pos_col');
  const future = unsqueeze(b, b.op('Greater', [keys, rowEnd], {}, 'future_2d'), [0], 'future'); // [1, S, T]
  const keep = plan.mask === undefined ? undefined : maskKeep(b, node, plan.maskRank!, inputOf<string>(MS_ATTENTION, node, plan.mask), S, T, keys);
  const rows = countVisible(b, keep, plan.causal ? future : undefined, P, S);
  const constant = (name: string, x: number): string => b.constant(name, dtype, [], [x]);
  let bias: string | undefined;
  const padding = keep ? b.op('Where', [keep, constant('zero_t', 0), constant('mask_filter', filter)], {}, 'padding_bias') : undefined;
  if (plan.unidirectional) bias = b.op('Where', [future, constant('lowest', LOWEST[dtype] ?? LOWEST[DataType.FLOAT]), padding ?? constant('zero_t', 0)], {}, 'mask_bias');
  else if (padding) {
    const rows = b.op('Concat', [b.int64('one1', [1]), unsqueeze(b, S, [0], 'seq_1'), unsqueeze(b, T, [0], 'total_1')], { axis: 0 }, 'bias_shape');
    bias = b.op('Expand', [padding, rows], {}, 'mask_bias');
  }
  return { rows, lengths: { S, P, T }, bias: bias ? unsqueeze(b, bias, [1], 'mask_bias_4d') : undefined };
}

/**
 * Which keys mask_index leaves visible, as bool [B|1, S|1, T], for each format the operator accepts (the format
 * of a 1-D index is told at run time from its length; a [B|1, 1] raw mask when T ≠ 1 is the no-mask dummy).
 */
function maskKeep(b: Builder, node: FusedSite['node'], rank: number, mask: string, S: string, T: string, keys: string): string {
  const positive = (x: string): string => b.op('Greater', [x, b.constant('zero_i32', DataType.INT32, [], [0])], {}, 'mask_keep');
  const m = b.op('Cast', [mask], { to: DataType.INT32 }, 'mask_i32');
  if (rank === 3) return positive(m);
  if (rank === 4) {
    const from = unsqueeze(b, b.op('Sub', [T, S], {}, 'first_row'), [0], 'first_row_1');
    const rows = b.op('Slice', [m, b.op('Concat', [from, b.int64('zero1', [0])], { axis: 0 }, 'mask_start'),
      b.op('Concat', [unsqueeze(b, T, [0], 'total_1'), unsqueeze(b, T, [0], 'total_1')], { axis: 0 }, 'mask_end'), b.int64('axes23', [2, 3])], {}, 'mask_rows');
    return positive(squeeze(b, rows, [1], 'mask_3d'));
  }
  if (rank === 2) {
    const width = b.op('Gather', [b.op('Shape', [m]), b.int64('axis1', [1], true)], {}, 'mask_width');
    const dummy = b.op('Not', [b.op('Equal', [width, T], {}, 'mask_full')], {}, 'mask_dummy');
    return unsqueeze(b, b.op('Or', [positive(m), dummy], {}, 'mask_keep_2d'), [1], 'mask_keep_3d');
  }
  // 1-D: key lengths [B]; end positions then start positions [2B]; [3B + 2] begins with the key lengths.
  const batch = b.op('Gather', [b.op('Shape', [at(node, 'input')]), b.int64('axis0', [0], true)], {}, 'batch');
  const batch1 = unsqueeze(b, batch, [0], 'batch_1');
  const ends = b.op('Slice', [m, b.int64('zero1', [0]), batch1], {}, 'key_end');
  const padded = b.op('Concat', [m, b.op('Expand', [b.constant('zero_i32_1', DataType.INT32, [1], [0]), batch1], {}, 'zeros_b')], { axis: 0 }, 'mask_padded');
  const twoB = b.op('Add', [batch1, batch1], {}, 'batch_2');
  const startsRaw = b.op('Slice', [padded, batch1, twoB], {}, 'key_start_raw');
  const isEndStart = b.op('Equal', [b.op('Shape', [m]), twoB], {}, 'end_start_format');
  const starts = b.op('Where', [isEndStart, startsRaw, b.constant('zero_i32', DataType.INT32, [], [0])], {}, 'key_start');
  const pos = b.op('Cast', [keys], { to: DataType.INT32 }, 'key_pos_i32');
  const beforeEnd = b.op('Less', [pos, unsqueeze(b, ends, [1], 'key_end_col')], {}, 'before_end');
  const beforeStart = b.op('Less', [pos, unsqueeze(b, starts, [1], 'key_start_col')], {}, 'before_start');
  const keep = b.op('And', [beforeEnd, b.op('Not', [beforeStart], {}, 'after_start')], {}, 'mask_keep_2d');
  return unsqueeze(b, keep, [1], 'mask_keep_3d');
}

/** max(n, 1) and its logarithm as [B|1, S|1]: the visible keys counted, or n_i = P + i + 1 from shapes when only causal. */
function countVisible(b: Builder, keep: string | undefined, future: string | undefined, P: string, S: string): Rows {
  let n: string;
  if (!keep && future) {
    const one = b.int64('one', [1], true);
    const first = b.op('Add', [P, one], {}, 'n_first');
    const rows = b.op('Range', [first, b.op('Add', [first, S], {}, 'n_end'), one], {}, 'n_rows');
    n = unsqueeze(b, b.op('Cast', [rows], { to: DataType.FLOAT }, 'n'), [0], 'n_rows_2d');
  } else if (keep) {
    const visible = future ? b.op('And', [keep, b.op('Not', [future], {}, 'not_future')], {}, 'visible') : keep;
    n = sumLastAxis(b, b.op('Cast', [visible], { to: DataType.FLOAT }, 'visible_f'), false, 'n_visible');
  } else {
    n = unsqueeze(b, b.op('Cast', [b.op('Add', [P, S], {}, 'n_keys')], { to: DataType.FLOAT }, 'n'), [0, 1], 'n_2d');
  }
  const clamped = b.op('Max', [n, b.constant('one_f', DataType.FLOAT, [], [1])], {}, 'n_at_least_1');
  return { n: clamped, ln: b.op('Log', [clamped], {}, 'ln_n') };
}

