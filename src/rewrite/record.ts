/** The record of a patch kept in metadata_props, and finding an earlier patch's s in the graph. */
import { Graph } from '../graph/graph';
import { DataType, ModelProto, NodeProto } from '../io/onnx';

export const RECORD_KEY = 'ssmax_patch';

export interface SiteRecord {
  layer: number;
  softmax: string;
  n: string;
  s: number | number[];
  sInitializer: string;
  apply: string;
  factor: string;
  factorType: number;
}

export interface PatchRecord {
  tool: 'ssmax-patch';
  version: string;
  preset: 'ssmax';
  scale: string;
  trainLen?: number;
  sites: SiteRecord[];
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

export function readRecord(model: ModelProto): PatchRecord | null {
  const entry = model.metadataProps.find((p) => p.key === RECORD_KEY);
  if (!entry) return null;
  try {
    return JSON.parse(entry.value) as PatchRecord;
  } catch {
    return null;
  }
}

/**
 * The s initializer feeding an inserted factor, found by walking up from the Mul that applies it: the one
 * named `.../s`, or, when another tool renamed things, the only floating-point initializer the factor uses.
 */
export function findScaleInitializer(graph: Graph, apply: NodeProto, factor = apply.input[1], logits = apply.input[0]): string | null {
  const queue = [factor];
  const seen = new Set<string>([logits]);
  const floats: string[] = [];
  while (queue.length) {
    const name = queue.shift()!;
    if (seen.has(name)) continue;
    seen.add(name);
    const init = graph.initializers.get(name);
    if (init && /\/s(_\d+)?$/.test(name)) return name;
    if (init && [DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16].includes(init.dataType as 1)) floats.push(name);
    const node = graph.producer.get(name);
    if (node) queue.push(...node.input.filter(Boolean));
  }
  return floats.length === 1 ? floats[0] : null;
}
