/** The record of a patch kept in metadata_props, and finding an earlier patch's s in the graph. */
import type { RopeSpec } from '../policy/rope';
import type { RopeSiteRecord } from './rope';
import { Graph } from '../graph/graph';
import { DataType, ModelProto, NodeProto } from '../io/onnx';
import { Preset } from '../policy/factor';
import { isScaleName, RECORD_KEY } from '../identity';
import { ScopeEdits } from './journal';
import type { CacheSplit } from './ms-attention';
import type { PresetName } from '../policy/factor';
import type { PriorName, ThetaName } from '../policy/prior';
import type { WindowSpec } from '../policy/window';

export interface SiteRecord {
  layer: number;
  /** The graph holding the site, when recorded (`main`, a subgraph path). */
  scope?: string;
  /**
   * The Softmax node or the fused operator node (for a site inside a model-local function, the node in its body).
   * Records written before `call` existed hold `<call> → <node in the function body>` here: read it with recordedNode.
   */
  softmax: string;
  /** For a site inside a model-local function: the call node that runs it. */
  call?: string;
  /** The fused operator, for fused sites. */
  kind?: string;
  /** The n mode; `none` for the none preset (no factor). */
  n: string;
  /** s, its initializer, the Mul applying the factor, the factor and its type: absent for the none preset. */
  s?: number | number[];
  sInitializer?: string;
  apply?: string;
  factor?: string;
  factorType?: number;
  /** The θ initializers of the site's positional prior, if any. */
  prior?: Record<ThetaName, string>;
  /** The int64 constants of the sliding window's W and S (shared by the scope's sites), if any. */
  window?: { size: string; sinks: string };
  /** Where the factor multiplies: the query rows or the logits. */
  target?: 'query' | 'logits';
  /** The QK MatMul output: the logits before any scaling, for probes. */
  logits?: string;
  /**
   * Set for a fused operator the patch expanded (its node is gone, so an update finds the site by this record
   * alone): its head count, for per-head s.
   */
  expanded?: { heads?: number };
}

export interface PatchRecord {
  tool: 'ssmax-patch';
  version: string;
  preset: PresetName;
  scale: string;
  /** The positional prior added, if any, and where its θ came from. */
  prior?: { kind: PriorName; from: string };
  /** The sliding window added, if any. */
  window?: WindowSpec;
  /** RoPE rescaled, if asked: how, and each constant of frequencies it rescaled. */
  rope?: RopeSpec & { sites: RopeSiteRecord[] };
  /** The stacked caches `--cache-layout split` replaced by their halves (the model's interface changed). */
  cacheLayout?: CacheSplit[];
  trainLen?: number;
  b?: number;
  floorScale?: number;
  attnScale?: number;
  sites: SiteRecord[];
  /** Every edit the patch made, scope by scope. */
  /** @internal */
  journal: ScopeEdits[];
}

/** Separates a call and its body's node in a site's label, and in records written before SiteRecord.call. */
const CALL_ARROW = ' → ';

/** The call (for a site inside a function) and the node of a recorded site: its stable key. */
export function recordedNode(r: SiteRecord): { call?: string; node: string } {
  if (r.call !== undefined) return { call: r.call, node: r.softmax };
  const arrow = r.softmax.indexOf(CALL_ARROW);
  // A record from before `call` existed: `<call> → <node>`. A plain site whose node's name holds the arrow reads
  // as a call there: such records cannot tell the two apart.
  return arrow < 0 ? { node: r.softmax } : { call: r.softmax.slice(0, arrow), node: r.softmax.slice(arrow + CALL_ARROW.length) };
}

/** How a site is shown in reports: its node, after its call for a site inside a function. */
export const callSiteLabel = (call: string | undefined, node: string): string => (call === undefined ? node : `${call}${CALL_ARROW}${node}`);

/** A recorded site as reports show it. */
export const recordedLabel = (r: SiteRecord): string => {
  const { call, node } = recordedNode(r);
  return callSiteLabel(call, node);
};

/** The preset a record was written with, parameters included (what patchModel records of its plan). */
export function recordedPreset(r: PatchRecord): Preset {
  if (r.preset === 'qwen-logn') return { kind: 'qwen-logn', trainLen: r.trainLen ?? NaN };
  if (r.preset === 'slope') return { kind: 'slope', trainLen: r.trainLen ?? NaN };
  if (r.preset === 'llama4') return { kind: 'llama4', floorScale: r.floorScale ?? 8192, attnScale: r.attnScale ?? 0.1 };
  if (r.preset === 'none') return { kind: 'none' };
  return r.b === undefined ? { kind: 'ssmax' } : { kind: 'ssmax', b: r.b };
}

export function writeRecord(model: ModelProto, record: PatchRecord): void {
  const props = model.metadataProps.filter((p) => p.key !== RECORD_KEY);
  props.push({ key: RECORD_KEY, value: JSON.stringify(record) });
  model.metadataProps = props;
}

/** Removes the record; true if there was one. */
export function removeRecord(model: ModelProto): boolean {
  const props = model.metadataProps.filter((p) => p.key !== RECORD_KEY);
  const had = props.length !== model.metadataProps.length;
  if (had) model.metadataProps = props;
  return had;
}

/**
 * The patch record, or null when the model has none, or none this tool can use: not JSON, or without its sites and
 * journal. Without one, revert and --update-s find the patch from the graph (existing.ts).
 */
export function readRecord(model: ModelProto): PatchRecord | null {
  const entry = model.metadataProps.find((p) => p.key === RECORD_KEY);
  if (!entry) return null;
  let value: unknown;
  try {
    value = JSON.parse(entry.value);
  } catch {
    return null;
  }
  const r = value as Partial<PatchRecord> | null;
  return r && typeof r === 'object' && Array.isArray(r.sites) && Array.isArray(r.journal) ? r as PatchRecord : null;
}

/**
 * The s tensor feeding an inserted factor, found by walking up from the node that applies it: an initializer
 * (or, in a function body, a Constant) named as the patch names s, the input through which a function gets s, or,
 * when another tool renamed things, the only floating-point initializer the factor uses.
 */
export function findScaleTensor(graph: Graph, apply: NodeProto, factor = apply.input[1], logits = apply.input[0]): string | null {
  const queue = [factor];
  const seen = new Set<string>([logits]);
  const floats: string[] = [];
  while (queue.length) {
    const name = queue.shift()!;
    if (!name || seen.has(name)) continue;
    seen.add(name);
    const init = graph.initializers.get(name);
    const node = graph.producer.get(name);
    if ((init || node?.opType === 'Constant') && isScaleName(name, 'constant')) return name;
    // A function's s input: bound to the call's s when the body is read through its call, so ask the input list itself.
    if ((graph.inputs.has(name) || graph.declaresInput(name)) && isScaleName(name, 'input')) return name;
    if (init && [DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16].includes(init.dataType as 1)) floats.push(name);
    if (node) queue.push(...node.input);
  }
  if (floats.length === 1) return floats[0];
  // Several constants (mask thresholds, ones): s is the one multiplying a logarithm.
  const scales = floats.filter((name) => graph.consumersOf(name).some((c) => c.opType === 'Mul'
    && c.input.some((i) => i !== name && graph.query.reachesOp(i, 'Log'))));
  return scales.length === 1 ? scales[0] : null;
}
