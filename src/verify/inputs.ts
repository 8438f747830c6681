/**
 * Synthesises inputs for a model from its graph alone: token ids inside the embedding's vocabulary, masks of
 * ones (or a right-padded last batch item), positions counting from the past length, token types 0, random past
 * key/values, encoder states and pixels; bf16 inputs as float32. User-given inputs are used as they are.
 */
import { Graph } from '../graph/graph';
import { opInfo } from '../graph/ops';
import { toNumber } from '../io/onnx';
import { InputError, opt } from '../errors';
import { DimSource, InputSpec, resolveDim, RunShape } from './signature';
import { elementCount, Feeds, HostTensor, hostTypeOf, makeHost } from './tensors';

export type { Feeds, HostTensor } from './tensors';

export interface SynthesisOptions {
  /** Sizes of named dims set by --dim or read from user-given inputs. */
  fixed?: ReadonlyMap<string, number>;
  /** Inputs given by the user; used as they are. */
  given?: Feeds;
  /** Zero the last quarter of the attention mask of the last batch item. */
  padded?: boolean;
  seed?: number;
}

/** A deterministic generator, so every session sees the same inputs for the same run. */
export function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
}



export function synthesize(graph: Graph, specs: InputSpec[], shape: RunShape, options: SynthesisOptions = {}): Feeds {
  const feeds: Feeds = {};
  const random = rng(options.seed ?? 1);
  const fixed = options.fixed ?? new Map<string, number>();
  for (const spec of specs) {
    const given = options.given?.[spec.name];
    if (given) {
      feeds[spec.name] = given;
      continue;
    }
    const dims = spec.dims.map((_, axis) => resolveDim(spec, axis, shape, fixed).size);
    feeds[spec.name] = fill(graph, spec, dims, shape, options.padded ?? false, random);
  }
  return feeds;
}

/** Which run sizes the synthesised inputs depend on: tells whether the sequence and past lengths can vary. */
export function dimSources(specs: InputSpec[], fixed: ReadonlyMap<string, number>, given: Feeds = {}): Set<DimSource> {
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

function fill(graph: Graph, spec: InputSpec, dims: number[], shape: RunShape, padded: boolean, random: () => number): HostTensor {
  const type = hostTypeOf(spec.elemType, spec.name);
  const count = elementCount(dims);
  const values = new Float64Array(count);
  const last = dims.length ? dims[dims.length - 1] : 1;
  switch (spec.role) {
    case 'lengths':
      // Per-item key counts or totals have model-specific meanings (total, total − 1, per-item padding).
      throw new InputError(`input '${spec.name}' holds lengths (by its name), which cannot be synthesised safely; give it with ${opt('inputFiles', `${spec.name}=FILE`)}`);
    case 'ids': {
      const vocab = vocabSize(graph, spec.name);
      for (let i = 0; i < count; i++) values[i] = Math.floor(random() * vocab);
      break;
    }
    case 'mask': {
      const perItem = dims.length ? count / Math.max(dims[0], 1) : count;
      const pad = Math.max(1, Math.floor(shape.seq / 4));
      for (let i = 0; i < count; i++) {
        const item = Math.floor(i / perItem);
        const key = i % last;
        values[i] = padded && dims.length >= 2 && dims[0] >= 2 && shape.seq >= 2 && item === dims[0] - 1 && key >= last - pad ? 0 : 1;
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
      for (let i = 0; i < count; i++) values[i] = random() * 2 - 1;
  }
  return makeHost(type, dims, values);
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
