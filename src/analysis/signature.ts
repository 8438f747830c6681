/**
 * What each graph input of a model holds (token ids, mask, positions, past key/values, ...), read from its
 * name, element type and shape, and how big each of its dims is for a given run: symbolic dims are matched
 * by name (batch, past, total, sequence) or fixed by --dim and by user-given inputs.
 */
import { Graph } from '../graph/graph';
import { constantOf } from '../graph/poly';
import { Shapes } from '../graph/shapes';
import { DataType, Dimension, toNumber } from '../io/onnx';
import { InputError, opt } from '../errors';
import { ConvStep, convStack, describeStack, framesOf, samplesFor } from './waveform';

export type InputRole =
  | 'ids' | 'mask' | 'positions' | 'token-types' | 'past' | 'cache-flag' | 'encoder-states' | 'pixels' | 'values' | 'lengths';

/**
 * A declared dim: a number, a name, or nothing. `rule`: how a name or a blank no rule of resolveParam knows
 * is sized (see sizeByPosition), with the reason for the report.
 */
export type DimSpec = { value: number } | { param: string; rule?: DimRule } | { unknown: true; rule?: DimRule };

export interface DimRule {
  source: DimSource;
  size?: number;
  why: string;
  /** A waveform's sample axis: the convolutions that make the run's sequence (in frames) out of its samples. */
  frames?: ConvStep[];
  /** From an operator's contract (its cache indirection's beams, its shared cache buffer): it wins over the dim's name. */
  contract?: boolean;
}

/** The size of a dim that is neither a sequence, past nor batch axis and has a name no rule knows. */
const OTHER_SIZE = 4;
/** An image side (height, width) of a pixel input. */
const IMAGE_SIZE = 32;

export interface InputSpec {
  name: string;
  elemType: number;
  dims: DimSpec[];
  role: InputRole;
  /** Sizes the graph fixes for a past key/value input (heads, head size), where its shape leaves them open. */
  graphDims?: (number | undefined)[];
  /**
   * A float input with no declared shape (TensorRT's test graphs): synthesised as a square [seq, seq] matrix,
   * which every chain of MatMuls accepts, with the sequence varied like any sequence axis.
   */
  unshaped?: true;
}

/** The sizes a run asks for; symbolic dims are resolved against them. */
export interface RunShape {
  batch: number;
  seq: number;
  past: number;
}

/** What a dim was resolved from: the run's batch, sequence, past or past + sequence, or a fixed size. */
export type DimSource = 'batch' | 'seq' | 'past' | 'total' | 'fixed';

const INT_TYPES: number[] = [DataType.INT64, DataType.INT32, DataType.INT16, DataType.INT8, DataType.UINT8];
const FLOAT_TYPES: number[] = [DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16, DataType.DOUBLE];

export function describeInputs(graph: Graph): InputSpec[] {
  let shapes: Shapes | undefined;
  const specs = graph.proto.input.filter((v) => !graph.initializers.has(v.name)).map((v) => {
    const tensor = v.type?.tensorType;
    if (!tensor) throw new InputError(`input '${v.name}': not a tensor; only tensor inputs can be synthesised (give it with ${opt('inputFiles', `${v.name}=FILE`)})`, 'cannot-verify');
    const role = roleOf(v.name, tensor.elemType);
    if (!tensor.shape && FLOAT_TYPES.includes(tensor.elemType)) {
      const rule: DimRule = { source: 'seq', why: 'has no declared shape: synthesised as a square [seq, seq] matrix' };
      return { name: v.name, elemType: tensor.elemType, dims: [{ unknown: true, rule }, { unknown: true, rule }] as DimSpec[], role, unshaped: true as const };
    }
    const dims = (tensor.shape?.dim ?? []).map(dimSpec);
    const graphDims = role === 'past' ? pastDimsFromGraph(graph, v.name, shapes ??= new Shapes(graph)) : undefined;
    return { name: v.name, elemType: tensor.elemType, dims, role, ...(graphDims ? { graphDims } : {}) };
  });
  ruleUnknownDims(specs);
  ruleWaveforms(graph, specs);
  return specs;
}

/**
 * Every dim no name rule knows gets a size from where it is, the same for every input that names it (the first
 * input that names it decides): axis 0 the batch; the token axis (axis 1 of ids, masks, positions, token types
 * and 3-D float inputs, axis 2 of 4-D ones) the sequence length, varied like any sequence axis; axis −2 of a past
 * key/value the past length; an image side of a pixel input 32; anything else 4 (not 1, so a broadcast that
 * should not happen still fails).
 */
function ruleUnknownDims(specs: readonly InputSpec[]): void {
  const byName = new Map<string, DimRule>();
  const probe: RunShape = { batch: 2, seq: 5, past: 3 };
  for (const spec of specs.filter((x) => !x.unshaped)) {
    spec.dims.forEach((d, axis) => {
      if ('value' in d || spec.graphDims?.[axis] !== undefined) return;
      if ('param' in d ? resolveParam(d.param, probe, new Map()) : unnamedDim(spec, axis, probe)) return;
      const rule = ('param' in d ? byName.get(d.param) : undefined) ?? sizeByPosition(spec, axis);
      d.rule = rule;
      if ('param' in d && !byName.has(d.param)) byName.set(d.param, rule);
    });
  }
}

/**
 * A float input [B, samples] or [B, 1, samples] that strided 1-D convolutions turn into frames: its last axis is
 * sized from the run's sequence, counted in frames, whatever its name says.
 */
function ruleWaveforms(graph: Graph, specs: readonly InputSpec[]): void {
  for (const spec of specs) {
    const rank = spec.dims.length;
    const last = spec.dims[rank - 1];
    if (spec.unshaped || spec.role !== 'values' || (rank !== 2 && rank !== 3) || !last || 'value' in last) continue;
    const stack = convStack(graph, spec.name);
    if (stack.length && samplesFor(stack, 2) > samplesFor(stack, 1) + 1) last.rule = { source: 'seq', why: describeStack(stack), frames: stack };
  }
  for (const spec of specs) ruleImageWidth(graph, spec);
}

/**
 * A float image [B, C, H, W] of fixed height that strided convolutions and pools turn into one row of tokens (the
 * height down to 1): its dynamic width W is sized from the run's tokens. Where rows remain, the tokens are H'·W'
 * and no one width rule sizes them.
 */
function ruleImageWidth(graph: Graph, spec: InputSpec): void {
  const [, , height, width] = spec.dims;
  if (spec.unshaped || (spec.role !== 'values' && spec.role !== 'pixels') || spec.dims.length !== 4 || !height || !('value' in height) || !width || 'value' in width) return;
  const stack = convStack(graph, spec.name, 'width');
  const rows = convStack(graph, spec.name, 'height');
  if (!stack.length || rows.length !== stack.length || framesOf(rows, height.value) !== 1) return;
  if (samplesFor(stack, 2) > samplesFor(stack, 1)) width.rule = { source: 'seq', why: describeStack(stack, 'width'), frames: stack };
}

function sizeByPosition(spec: InputSpec, axis: number): DimRule {
  const rank = spec.dims.length;
  const tokens = ['ids', 'mask', 'positions', 'token-types'].includes(spec.role) ? 1
    : spec.role === 'pixels' ? -1 : rank === 3 ? 1 : rank === 4 && spec.role !== 'past' ? 2 : -1;
  if (axis === 0) return { source: 'batch', why: 'axis 0: the batch' };
  if (spec.role === 'past' && axis === rank - 2) return { source: 'past', why: 'axis −2 of a past key/value: the past length' };
  if (axis === tokens) return { source: 'seq', why: `axis ${axis} of a ${rank}-D ${spec.role === 'values' ? 'float' : spec.role} input: the sequence length` };
  if (spec.role === 'pixels' && axis >= rank - 2) return { source: 'fixed', size: IMAGE_SIZE, why: `an image side: ${IMAGE_SIZE}` };
  return { source: 'fixed', size: OTHER_SIZE, why: `no rule: ${OTHER_SIZE}` };
}

/** How the dims no name rule knows were sized, per input, for the report. */
export function ruledDims(spec: InputSpec): string[] {
  if (spec.unshaped) return [(spec.dims[0] as { rule: DimRule }).rule.why];
  return spec.dims.flatMap((d, axis) => ('rule' in d && d.rule ? [`dim ${axis}${'param' in d ? ` '${d.param}'` : ''}: ${d.rule.why}`] : []));
}

/**
 * A cached key or value is concatenated with the new one, which the graph builds by a Reshape to a constant
 * head count and head size (and a Transpose): the new one's static dims give the past input's heads and head size.
 */
function pastDimsFromGraph(graph: Graph, input: string, shapes: Shapes): (number | undefined)[] | undefined {
  for (const node of graph.consumersOf(input)) {
    if (node.opType !== 'Concat') continue;
    for (const other of node.input) {
      const dims = other && other !== input ? shapes.shape(other)?.map((d) => constantOf(d)).map((d) => (d !== undefined && d > 0 ? d : undefined)) : undefined;
      if (dims?.some((d) => d !== undefined)) return dims;
    }
  }
  return undefined;
}

function dimSpec(d: Dimension): DimSpec {
  if (d.dimParam) return { param: d.dimParam };
  if (Object.prototype.hasOwnProperty.call(d, 'dimValue') || d.value === 'dimValue') return { value: toNumber(d.dimValue) };
  return { unknown: true };
}

function roleOf(name: string, elemType: number): InputRole {
  const n = name.toLowerCase();
  const isInt = INT_TYPES.includes(elemType);
  const isFloat = FLOAT_TYPES.includes(elemType);
  if (elemType === DataType.BOOL && /use_cache|cache_branch/.test(n)) return 'cache-flag';
  if (/mask/.test(n)) return 'mask';
  // past_sequence_length and the like are lengths, not cached keys or values.
  if (isInt && /past|cache/.test(n) && /len/.test(n)) return 'lengths';
  if (/past|cache/.test(n)) return 'past';
  if (isInt && /position|pos_ids/.test(n)) return 'positions';
  if (isInt && /token_type|segment/.test(n)) return 'token-types';
  if (isInt && /seqlen|seq_len|lengths?$|_lens?$/.test(n)) return 'lengths';
  if (isInt) return 'ids';
  if (isFloat && /encoder_hidden|encoder_out|memory/.test(n)) return 'encoder-states';
  if (isFloat && /pixel|image/.test(n)) return 'pixels';
  return 'values';
}

/**
 * Resolves dim `axis` of `input` for a run. `fixed` holds sizes set by --dim or read from user-given inputs,
 * keyed by dim name. Dims no name rule knows are sized by their position (ruleUnknownDims).
 */
export function resolveDim(input: InputSpec, axis: number, shape: RunShape, fixed: ReadonlyMap<string, number>): { size: number; source: DimSource } {
  const d = input.dims[axis];
  if ('value' in d) return { size: d.value, source: 'fixed' };
  if (d.rule?.frames) return { size: samplesFor(d.rule.frames, shape.seq), source: 'seq' };
  if (input.unshaped) return { size: shape.seq, source: 'seq' };
  if (d.rule?.contract && !('param' in d && fixed.has(d.param))) return sized(d.rule, shape);
  const r = 'param' in d ? resolveParam(d.param, shape, fixed) : unnamedDim(input, axis, shape);
  if (r) return r;
  const fromGraph = input.graphDims?.[axis];
  if (fromGraph !== undefined) return { size: fromGraph, source: 'fixed' };
  return sized(d.rule ?? sizeByPosition(input, axis), shape);
}

function sized(rule: DimRule, shape: RunShape): { size: number; source: DimSource } {
  const size = { batch: shape.batch, seq: shape.seq, past: shape.past, total: shape.past + shape.seq, fixed: rule.size! }[rule.source];
  return { size, source: rule.source };
}

function resolveParam(param: string, shape: RunShape, fixed: ReadonlyMap<string, number>): { size: number; source: DimSource } | null {
  const exact = fixed.get(param);
  if (exact !== undefined) return { size: exact, source: 'fixed' };
  if (/[+-]/.test(param)) return expression(param, shape, fixed);
  const p = param.toLowerCase();
  if (/^(batch|bs$|n$|b$)/.test(p)) return { size: shape.batch, source: 'batch' };
  if (/past|cache|prev/.test(p)) return { size: shape.past, source: 'past' };
  if (/total|all_|kv|key|full|present/.test(p)) return { size: shape.past + shape.seq, source: 'total' };
  // 'max_seq_len_in_batch' is a sequence length, so sequence names are matched before a later 'batch'.
  if (/seq|len|token|time|step|position|enc|dec|^[st]$/.test(p)) return { size: shape.seq, source: 'seq' };
  if (/batch/.test(p)) return { size: shape.batch, source: 'batch' };
  return null;
}

/** Dims like 'past_seq_len + 1' or 'past_sequence_length+sequence_length'. */
function expression(param: string, shape: RunShape, fixed: ReadonlyMap<string, number>): { size: number; source: DimSource } | null {
  const terms = param.replace(/\s+/g, '').match(/[+-]?[^+-]+/g) ?? [];
  let size = 0;
  const sources = new Set<DimSource>();
  for (const term of terms) {
    const sign = term.startsWith('-') ? -1 : 1;
    const body = term.replace(/^[+-]/, '');
    if (/^\d+$/.test(body)) {
      size += sign * Number(body);
      continue;
    }
    const r = resolveParam(body, shape, fixed);
    if (!r) return null;
    size += sign * r.size;
    sources.add(r.source);
  }
  const source: DimSource = sources.has('past') && sources.has('seq') ? 'total' : sources.has('past') ? 'past' : sources.has('seq') ? 'seq' : 'fixed';
  return { size, source };
}

/** Unnamed dynamic dims: axis 0 is the batch; axis 1 of ids, masks and positions the sequence. */
function unnamedDim(input: InputSpec, axis: number, shape: RunShape): { size: number; source: DimSource } | null {
  if (axis === 0) return { size: shape.batch, source: 'batch' };
  if (axis === 1 && ['ids', 'positions', 'token-types'].includes(input.role)) return { size: shape.seq, source: 'seq' };
  if (axis === 1 && input.role === 'mask') {
    return shape.past > 0 ? { size: shape.past + shape.seq, source: 'total' } : { size: shape.seq, source: 'seq' };
  }
  return null;
}

/** Run sizes pinned by named dims: `--dim seq=128` or an input file fixing 'sequence' pins the sequence length. */
export function pinnedShape(fixed: ReadonlyMap<string, number>): Partial<RunShape> {
  const pinned: Partial<RunShape> = {};
  for (const [name, size] of fixed) {
    if (/[+-]/.test(name)) continue;
    const source = resolveParam(name, { batch: 0, seq: 0, past: 0 }, new Map())?.source;
    if (source === 'batch' || source === 'seq' || source === 'past') pinned[source] = size;
  }
  return pinned;
}

/** Checks user-given tensors against the declared shapes and records the sizes of the named dims they fix. */
export function bindGivenDims(specs: readonly InputSpec[], given: Record<string, { dims: number[] }>, fixed: Map<string, number>,
  origin: Map<string, string>): void {
  for (const [name, tensor] of Object.entries(given)) {
    // Every given input is one of the model's (readGivenInputs read it for one).
    const spec = specs.find((s) => s.name === name)!;
    // An input without a declared shape takes whatever was given.
    if (spec.unshaped) continue;
    const shape = `[${tensor.dims.join(', ')}]`;
    if (spec.dims.length && tensor.dims.length !== spec.dims.length) {
      throw new InputError(`${opt('inputFiles', name)}: shape ${shape} has rank ${tensor.dims.length}, the model declares rank ${spec.dims.length}`, 'usage');
    }
    spec.dims.forEach((d, axis) => {
      const size = tensor.dims[axis];
      if ('value' in d && d.value !== size) throw new InputError(`${opt('inputFiles', name)}: dim ${axis} is ${size}, the model declares ${d.value}`, 'usage');
      if (!('param' in d)) return;
      const known = fixed.get(d.param);
      if (known !== undefined && known !== size) {
        throw new InputError(`${opt('inputFiles', name)}: dim ${axis} ('${d.param}') is ${size}, but ${origin.get(d.param)} sets it to ${known}`, 'usage');
      }
      fixed.set(d.param, size);
      origin.set(d.param, opt('inputFiles', name));
    });
  }
}
