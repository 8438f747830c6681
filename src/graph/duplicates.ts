/**
 * Names defined more than once by initializers or Constant nodes, which onnxruntime loads (with a warning). Which
 * definition it then uses is decided by how it stores them: it turns Constant nodes into initializers after the
 * graph's own, and a repeated name keeps the last definition when the tensors are under 128 bytes, the first
 * one from 128 bytes on (onnxruntime 1.30, measured in test/ort-accepts.test.ts). The tool reads the same one.
 */
import { rawByteLength } from '../io/constants';
import { GraphProto, NodeProto, TensorProto, toNumber } from '../io/onnx';
import { memo } from '../memo';
import { ConstTensor, readTensor } from './tensor';

/** One definition of a name: an initializer, or a Constant node. */
export type ConstantDef = { tensor: TensorProto } | { node: NodeProto };

/** onnxruntime's threshold between tensors it keeps inline and tensors it moves into its own buffers. */
const SMALL_BYTES = 128;

/** The definitions of every name defined more than once, in onnxruntime's order (initializers first). */
export function repeatedConstants(g: GraphProto): Map<string, ConstantDef[]> {
  const defs = new Map<string, ConstantDef[]>();
  for (const t of g.initializer) memo(defs, t.name, () => []).push({ tensor: t });
  for (const n of g.node) if (n.opType === 'Constant' && n.output[0]) memo(defs, n.output[0], () => []).push({ node: n });
  for (const [name, list] of defs) if (list.length < 2) defs.delete(name);
  return defs;
}

/** The tensor a definition holds (Constant nodes with value_float & co. hold none: they are tiny). */
export function defTensor(d: ConstantDef): TensorProto | undefined {
  return 'tensor' in d ? d.tensor : d.node.attribute.find((a) => a.name === 'value')?.t;
}

function bytesOf(d: ConstantDef): number {
  const t = defTensor(d);
  if (!t) return 0;
  return rawByteLength(t.dataType, t.dims.map(toNumber).reduce((a, b) => a * b, 1)) ?? Infinity;
}

const sameValue = (a: ConstTensor | null, b: ConstTensor | null): boolean => a !== null && b !== null && a.dataType === b.dataType
  && a.dims.join() === b.dims.join() && a.values.length === b.values.length && a.values.every((v, i) => Object.is(v, b.values[i]));

/**
 * The index of the definition onnxruntime uses, or null when their sizes straddle its threshold and their values
 * differ (then which one it uses is not defined).
 */
export function chosenDefinition(defs: ConstantDef[]): number | null {
  const small = defs.map((d) => bytesOf(d) < SMALL_BYTES);
  if (small.every(Boolean)) return defs.length - 1;
  if (!small.some(Boolean)) return 0;
  const first = defValue(defs[0]);
  return defs.every((d) => sameValue(defValue(d), first)) ? defs.length - 1 : null;
}

function defValue(d: ConstantDef): ConstTensor | null {
  const t = defTensor(d);
  return t ? readTensor(t) : null;
}
