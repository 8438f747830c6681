/**
 * Synthesises inputs for a model from its graph alone: token ids inside the embedding's vocabulary, masks of
 * ones (or a right-padded last batch item), positions counting from the past length, token types 0, random past
 * key/values, encoder states and pixels; bf16 inputs as float32. User-given inputs are used as they are.
 */
import { inputOf, roleAt, specOf } from '../graph/attention-ops';
import { Graph } from '../graph/graph';
import { opInfo } from '../graph/ops';
import { DataType, NodeProto, toNumber } from '../io/onnx';
import { InputError, opt } from '../errors';
import { DimSource, InputSpec, resolveDim, RunShape } from '../analysis/signature';
import { elementCount, Feeds, HostTensor, hostTypeOf, makeHost } from './tensors';
import { sharedPasts } from './memory';

export type { Feeds, HostTensor } from './tensors';

export interface SynthesisOptions {
  /** Sizes of named dims set by --dim or read from user-given inputs. */
  fixed?: ReadonlyMap<string, number>;
  /** Inputs given by the user; used as they are. */
  given?: Feeds;
  /** Zero the last quarter of the attention mask of the last batch item. */
  padded?: boolean;
  seed?: number;
  /** Where the shared caches of runs over a large cache come from (CachePool); without it each run fills its own. */
  pool?: CachePool;
}

/**
 * The two buffers the runs over a large cache share (sharedPasts), filled once at the plan's largest shape with a
 * seed of their own: a run's cache is the front of each, so no run synthesises one again (the 12-layer × 768 decoder's
 * verification to 131072 keys filled 930 M values before, one cache per session and run; now 200 M).
 */
export interface CachePool { capacity: RunShape; buffers: Map<string, HostTensor> }

/**
 * The pool of `runs` (verify's plan, calibrate's lengths): sized by the largest batch and key count of those over a
 * large cache; undefined where none shares its caches. `given`: the user's inputs, never shared.
 */
export function cachePool(specs: readonly InputSpec[], fixed: ReadonlyMap<string, number>, runs: readonly RunShape[],
  given: ReadonlySet<string>): CachePool | undefined {
  const large = runs.filter((r) => sharedPasts(specs, r, fixed, given).size > 0);
  if (!large.length) return undefined;
  return { capacity: { batch: Math.max(...large.map((r) => r.batch)), seq: 0, past: Math.max(...large.map((r) => r.seq + r.past)) }, buffers: new Map() };
}

/** A uniform draw in [0, 1); `signed` fills an array with draws in [−1, 1), the same values as calls would give. */
export interface Random { (): number; signed(out: Float32Array | Float64Array): void }

/** A deterministic generator, so every session sees the same inputs for the same run. */
export function rng(seed: number): Random {
  let x = seed >>> 0 || 1;
  const next = (): number => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
  // The loop inlined: a cache of 100 M values fills in half the time of 100 M calls.
  const signed = (out: Float32Array | Float64Array): void => {
    let y = x;
    for (let i = 0; i < out.length; i++) {
      y ^= y << 13; y >>>= 0;
      y ^= y >>> 17;
      y ^= y << 5; y >>>= 0;
      out[i] = (y / 4294967296) * 2 - 1;
    }
    x = y;
  };
  return Object.assign(next, { signed });
}

export function synthesize(graph: Graph, specs: readonly InputSpec[], shape: RunShape, options: SynthesisOptions = {}): Feeds {
  const feeds: Feeds = {};
  const random = rng(options.seed ?? 1);
  const fixed = options.fixed ?? new Map<string, number>();
  // A large cache: the layers' past inputs take two buffers' values in turn (their first two come first in order).
  const shared = sharedPasts(specs, shape, fixed, new Set(Object.keys(options.given ?? {})));
  const sources = new Set(shared.values());
  // Lengths last: their values follow from the shapes of the inputs they describe.
  for (const spec of [...specs.filter((s) => s.role !== 'lengths'), ...specs.filter((s) => s.role === 'lengths')]) {
    const given = options.given?.[spec.name] ?? feeds[shared.get(spec.name) ?? ''];
    if (given) {
      feeds[spec.name] = given;
      continue;
    }
    const dims = spec.dims.map((_, axis) => resolveDim(spec, axis, shape, fixed).size);
    const fromPool = options.pool && sources.has(spec.name) ? pooled(graph, spec, dims, options.pool, fixed) : undefined;
    if (fromPool) {
      feeds[spec.name] = fromPool;
      continue;
    }
    const slot = slotValue(graph, spec, shape) ?? beamValue(graph, spec, specs, shape, fixed);
    feeds[spec.name] = slot !== undefined ? makeHost(hostTypeOf(spec.elemType, spec.name), dims, new Array<number>(elementCount(dims)).fill(slot))
      : spec.role === 'lengths' ? lengths(graph, spec, specs, dims, shape, feeds) : fill(graph, spec, dims, shape, options.padded ?? false, random);
  }
  return feeds;
}

/**
 * The front of the pool's buffer for `spec` as a tensor of `dims`, the buffer filled at the pool's capacity on first
 * use; undefined for a run larger than the pool (it fills its own).
 */
function pooled(graph: Graph, spec: InputSpec, dims: number[], pool: CachePool, fixed: ReadonlyMap<string, number>): HostTensor | undefined {
  let buffer = pool.buffers.get(spec.name);
  if (!buffer) {
    const full = spec.dims.map((_, axis) => resolveDim(spec, axis, pool.capacity, fixed).size);
    const seed = [...spec.name].reduce((h, c) => Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0, 2166136261);
    buffer = fill(graph, spec, full, pool.capacity, false, rng(seed));
    pool.buffers.set(spec.name, buffer);
  }
  const count = elementCount(dims);
  if (count > buffer.data.length) return undefined;
  return { type: buffer.type, dims, data: buffer.data.subarray(0, count) } as HostTensor;
}

/** The keys of ONNX Attention's K ([B, Tk, H·D] or [B, H, Tk, D]), or past + sequence when K is not an input. */
function keyCount(k: HostTensor | undefined, shape: RunShape): number {
  return k ? k.dims[k.dims.length === 3 ? 1 : 2] : shape.past + shape.seq;
}

/**
 * Lengths have model-specific meanings (total, total − 1, per-item padding), so they are synthesised only where
 * the operator reading them says what they are (its spec's `contracts.lengths`): GroupQueryAttention's seqlens_k
 * (total − 1 per item) and total_sequence_length, ONNX Attention's nonpad_kv_seqlen (every key valid; also where
 * its function body was expanded into the graph, which keeps the names nonpad_kv_seqlen and K), the
 * past_sequence_length of MultiHeadAttention and DecoderMaskedMultiHeadAttention; a plain-op model's past length by
 * its name; per-item lengths beside the one input they describe.
 */
function lengths(graph: Graph, spec: InputSpec, specs: readonly InputSpec[], dims: number[], shape: RunShape, feeds: Feeds): HostTensor {
  const type = hostTypeOf(spec.elemType, spec.name);
  const count = elementCount(dims);
  const fill = (v: number): HostTensor => makeHost(type, dims, new Array<number>(count).fill(v));
  for (const node of readersThroughCasts(graph, spec.name)) {
    const op = specOf(node);
    const role = op && roleAt(op, node.input.indexOf(spec.name));
    const holds = op && role !== undefined ? op.contracts.lengths?.[role] : undefined;
    if (!op || !holds) continue;
    if (holds === 'total-1') return fill(shape.past + shape.seq - 1);
    if (holds === 'total') return fill(shape.past + shape.seq);
    if (holds === 'past') return fill(shape.past);
    return fill(keyCount(feeds[inputOf(op, node, holds.keysOf)], shape));
  }
  // ONNX Attention expanded into its function body keeps the input's name, and K's: every key valid.
  if (spec.name === 'nonpad_kv_seqlen' && feeds.K) return fill(keyCount(feeds.K, shape));
  // A past length read by plain ops (a streaming model's state, torchaudio Emformer's past_length_i): the run's
  // cached tokens, as the operators' 'past' contract gives it; 0 where the plan caches none, a stream's start.
  if (/^past_(sequence_)?len(gth)?(_\d+)?$/i.test(spec.name)) return fill(shape.past);
  const whole = itemLength(specs, spec, feeds);
  if (whole !== undefined) return fill(whole);
  throw new InputError(`input '${spec.name}' holds lengths (by its name), which cannot be synthesised safely; give it with ${opt('inputFiles', `${spec.name}=FILE`)}`, 'cannot-verify');
}

/**
 * Per-item lengths [B] beside the one input they can describe (torchaudio's wav2vec2, HuBERT, Conformer and
 * Emformer take `lengths` so): a waveform's samples, else a float [B, T, D] input's frames. Every item is whole,
 * its length the axis's size, the one value a length can have without knowing how the model pads.
 */
function itemLength(specs: readonly InputSpec[], spec: InputSpec, feeds: Feeds): number | undefined {
  if (spec.dims.length !== 1) return undefined;
  const waveform = specs.find((s) => s.dims.some((d) => 'rule' in d && d.rule?.frames));
  const frames = specs.filter((s) => s.role === 'values' && s.dims.length === 3);
  const carrier = waveform ?? (frames.length === 1 ? frames[0] : undefined);
  const tensor = carrier && feeds[carrier.name];
  if (!tensor) return undefined;
  return tensor.dims[waveform ? tensor.dims.length - 1 : 1];
}

/**
 * Scalars of the com.microsoft generation operators, by input slot: GreedySearch and BeamSearch generate four
 * tokens (max_length = sequence + 4, min_length 1), BeamSearch with 2 beams returning 1 sequence, penalties 1
 * (no effect). Undefined for any other input.
 */
function slotValue(graph: Graph, spec: InputSpec, shape: RunShape): number | undefined {
  const slots: Record<string, Record<number, number>> = {
    GreedySearch: { 1: shape.seq + 4, 2: 1, 3: 1 },
    BeamSearch: { 1: shape.seq + 4, 2: 1, 3: 2, 4: 1, 5: 1, 6: 1 },
  };
  for (const node of readersThroughCasts(graph, spec.name)) {
    const table = node.domain === 'com.microsoft' ? slots[node.opType] : undefined;
    const value = table?.[node.input.indexOf(spec.name)];
    if (value !== undefined) return value;
  }
  return undefined;
}

/**
 * An operator's beam inputs (its spec's `contracts.beams`): the width is the cache indirection's beam axis, and
 * the indirection holds beam 0 everywhere (every beam reads its own cache). Undefined for any other input.
 */
function beamValue(graph: Graph, spec: InputSpec, specs: readonly InputSpec[], shape: RunShape, fixed: ReadonlyMap<string, number>): number | undefined {
  for (const node of readersThroughCasts(graph, spec.name)) {
    const op = specOf(node);
    const beams = op?.contracts.beams;
    const role = op && roleAt(op, node.input.indexOf(spec.name));
    if (!op || !beams || role === undefined) continue;
    if (role === beams.indirection) return 0;
    if (role !== beams.width) continue;
    const indirection = specs.find((s) => s.name === inputOf(op, node, beams.indirection));
    return indirection && indirection.dims.length >= 2 ? resolveDim(indirection, 1, shape, fixed).size : 1;
  }
  return undefined;
}

/** The nodes reading a tensor directly or through Casts, each with `input` set to the name it reads. */
function readersThroughCasts(graph: Graph, name: string): NodeProto[] {
  const out: NodeProto[] = [];
  for (const node of graph.consumersOf(name)) {
    if (node.opType === 'Cast') out.push(...readersThroughCasts(graph, node.output[0]).map((n) => ({ ...n, input: n.input.map((i) => (i === node.output[0] ? name : i)) })));
    else out.push(node);
  }
  return out;
}

/** Which run sizes the synthesised inputs depend on: tells whether the sequence and past lengths can vary. */
export function dimSources(specs: readonly InputSpec[], fixed: ReadonlyMap<string, number>, given: Feeds): Set<DimSource> {
  const out = new Set<DimSource>();
  const probe: RunShape = { batch: 2, seq: 5, past: 3 };
  for (const spec of specs) {
    if (given[spec.name]) continue;
    spec.dims.forEach((_, axis) => {
      try {
        out.add(resolveDim(spec, axis, probe, fixed).source);
      } catch {
        // Reported when the inputs are actually synthesised.
      }
    });
  }
  return out;
}

function fill(graph: Graph, spec: InputSpec, dims: number[], shape: RunShape, padded: boolean, random: Random): HostTensor {
  const count = elementCount(dims);
  const type = hostTypeOf(spec.elemType, spec.name);
  // float32 filled in place: a large cache is not held twice (the values are the ones a float64 copy would round to).
  const values = type === 'float32' ? new Float32Array(count) : new Float64Array(count);
  const last = dims.length ? dims[dims.length - 1] : 1;
  switch (spec.role) {
    case 'ids': {
      const vocab = vocabSize(graph, spec.name);
      for (let i = 0; i < count; i++) values[i] = Math.floor(random() * vocab);
      break;
    }
    case 'mask': {
      const pad = Math.max(1, Math.floor(shape.seq / 4));
      if (dims.length === 1 && isMaskIndex(graph, spec.name)) {
        // com.microsoft Attention's 1-D mask_index holds each item's key end (then start positions, 0 here): every
        // key of the run, the last item a quarter fewer when padded.
        const T = shape.past + shape.seq, items = Math.min(count, shape.batch);
        for (let i = 0; i < items; i++) values[i] = padded && items >= 2 && i === items - 1 ? T - pad : T;
        break;
      }
      const perItem = dims.length ? count / Math.max(dims[0], 1) : count;
      // A mask named for padding (PyTorch's key_padding_mask, fairseq's padding_mask) marks the keys to drop:
      // true = pad, the opposite of an attention mask's 1 = attend.
      const [keep, drop] = /pad/i.test(spec.name) && /mask/i.test(spec.name) ? [0, 1] : [1, 0];
      for (let i = 0; i < count; i++) {
        const item = Math.floor(i / perItem);
        const key = i % last;
        values[i] = padded && dims.length >= 2 && dims[0] >= 2 && shape.seq >= 2 && item === dims[0] - 1 && key >= last - pad ? drop : keep;
      }
      break;
    }
    case 'positions':
      for (let i = 0; i < count; i++) values[i] = shape.past + (i % last);
      break;
    case 'token-types':
      break;
    case 'cache-flag':
      values.fill(shape.past > 0 ? 1 : 0);
      break;
    default:
      // Other bool inputs (an If's condition, say) alternate with the run: true at even lengths, false at odd
      // ones, so the short runs (12 and 7 tokens) take both branches.
      if (spec.elemType === DataType.BOOL) values.fill(shape.seq % 2 === 0 ? 1 : 0);
      else random.signed(values);
  }
  return values instanceof Float32Array ? { type, dims, data: values } : makeHost(type, dims, values);
}

/** The input is a mask whose 1-D form holds key ends (com.microsoft Attention's mask_index), directly or through Casts. */
function isMaskIndex(graph: Graph, name: string): boolean {
  return readersThroughCasts(graph, name).some((n) => {
    const op = specOf(n);
    return op?.contracts.keyEnds !== undefined && roleAt(op, n.input.indexOf(name)) === op.contracts.keyEnds;
  });
}

/** Rows of the embedding table the ids index (Gather of an initializer), or 2 when no table is found. */
function vocabSize(graph: Graph, input: string): number {
  for (const node of graph.consumersOf(input)) {
    if (node.opType === 'Gather' && node.input[1] === input && graph.initializers.has(node.input[0])) {
      return toNumber(graph.initializers.get(node.input[0])!.dims[0]);
    }
    // The same ids in another shape or type (no cycles: the graph was validated).
    if (opInfo(node).view) return vocabSize(graph, node.output[0]);
  }
  return 2;
}
