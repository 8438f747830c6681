/**
 * Decodes a model from a Source by its wire structure. Nodes, inputs, outputs, value_info, metadata and small
 * tensors are decoded with protobufjs; a tensor above EAGER_TENSOR_BYTES becomes a stub whose header is decoded
 * and whose data stays in the file, read only if someone asks for its values. Fields the rewrite never
 * touches (training_info, sparse initializers, annotations, unknown fields) are not decoded at all: the writer
 * copies them from their original byte ranges.
 */
import { createHash } from 'node:crypto';
import { EXTERNAL, isKnownDataType, rawByteLength, toNumber } from './constants';
import type { AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto } from './onnx';
import { forAttributes } from './external';
import { ModelFormatError } from './format-error';
import { definePayload, ModelContext, PAYLOAD_FIELDS, setExternalContext, setOrigin, StubOrigin } from './origin';
import { allowedWireTypes, checkWireTree, decodeAs, encodeAs, encodeField, fieldName, TypeName } from './proto';
import { MemorySource, Reader, Source } from './source';
import { concatBytes, Entry, scanFields, WireError } from './wire';

export const MIN_IR_VERSION = 3;
export const MAX_IR_VERSION = 13;
/** Tensors up to this many bytes are decoded whole; larger ones stay in the file until their values are needed. */
export const EAGER_TENSOR_BYTES = 4096;

export interface ContainerSpec {
  lists: Record<number, [string, TypeName]>;
  single: Record<number, [string, TypeName]>;
  scalars: Record<number, string>;
}

/** Which fields of the two container messages are decoded; every other field is carried as bytes. */
export const SPECS: Partial<Record<TypeName, ContainerSpec>> = {
  ModelProto: {
    lists: { 8: ['opsetImport', 'OperatorSetIdProto'], 14: ['metadataProps', 'StringStringEntryProto'], 25: ['functions', 'FunctionProto'] },
    single: { 7: ['graph', 'GraphProto'] },
    scalars: { 1: 'irVersion', 2: 'producerName', 3: 'producerVersion', 4: 'domain', 5: 'modelVersion', 6: 'docString' },
  },
  GraphProto: {
    lists: {
      1: ['node', 'NodeProto'], 5: ['initializer', 'TensorProto'], 11: ['input', 'ValueInfoProto'],
      12: ['output', 'ValueInfoProto'], 13: ['valueInfo', 'ValueInfoProto'],
    },
    single: {},
    scalars: { 2: 'name', 10: 'docString' },
  },
};

export function digest(bytes: Uint8Array): string {
  return createHash('sha1').update(bytes).digest('base64');
}

export function decodeModelFrom(src: Source, dir: string | null): ModelProto {
  const ctx: ModelContext = { src, dir };
  return src.session((r) => {
    const other = otherFormat(r, src.size);
    if (other) throw new ModelFormatError(`not an ONNX model (${other})`);
    try {
      const model = decodeContainer<ModelProto>('ModelProto', r, 0, src.size, ctx);
      checkModel(model);
      return model;
    } catch (e) {
      if (e instanceof WireError) throw new ModelFormatError(`not a readable ONNX model (${e.message})`);
      throw e;
    }
  });
}

function checkModel(model: ModelProto): void {
  const ir = toNumber(model.irVersion);
  if (!model.graph) throw new ModelFormatError('not an ONNX model (no graph)');
  if (ir === 0) throw new ModelFormatError('not an ONNX model (no IR version)');
  if (ir < MIN_IR_VERSION || ir > MAX_IR_VERSION) {
    throw new ModelFormatError(`unsupported IR version ${ir} (this tool reads IR ${MIN_IR_VERSION} to ${MAX_IR_VERSION})`);
  }
  if (model.opsetImport.length === 0) throw new ModelFormatError('not an ONNX model (no opset_import)');
}

function decodeContainer<T>(type: TypeName, r: Reader, start: number, end: number, ctx: ModelContext): T {
  const spec = SPECS[type]!;
  const entries = scanFields(r, start, end);
  for (const e of entries) checkWire(type, e);
  const scalarBytes = entries.filter((e) => spec.scalars[e.field] !== undefined).map((e) => r.bytes(e.start, e.end));
  const obj = decodeOrFail<Record<string, unknown>>(type, concatBytes(scalarBytes), type);
  for (const [name] of Object.values(spec.lists)) obj[name] = [];
  const counts = new Map<number, number>();
  for (const e of entries) {
    const list = spec.lists[e.field];
    const single = spec.single[e.field];
    const index = counts.get(e.field) ?? 0;
    counts.set(e.field, index + 1);
    if (list) (obj[list[0]] as unknown[]).push(decodeElement(list[1], r, e, ctx, `${list[0]} #${index}`));
    if (single) {
      if (index > 0) throw new ModelFormatError(`not an ONNX model (two ${single[0]} fields)`);
      obj[single[0]] = decodeContainer(single[1], r, e.data, e.end, ctx);
    }
  }
  const scalars = new Map(Object.values(spec.scalars).map((n) => [n, digest(encodeField(type, obj, n))]));
  setOrigin(obj, { kind: 'container', ctx, entries, scalars });
  return obj as T;
}

function checkWire(type: TypeName, e: Entry): void {
  const allowed = allowedWireTypes(type, e.field);
  if (!allowed || allowed.includes(e.wire)) return;
  const name = `${type}.${fieldName(type, e.field)}`;
  if (type === 'ModelProto') {
    throw new ModelFormatError(`not an ONNX model (protobuf field ${e.field} at byte ${e.start} cannot be ${name}: another kind of protobuf message?)`);
  }
  throw new ModelFormatError(`not a readable ONNX model (corrupt ${name} at byte ${e.start})`);
}

function decodeOrFail<T>(type: TypeName, bytes: Uint8Array, what: string): T {
  let problem: string | null;
  try {
    problem = new MemorySource(bytes, what).session((r) => checkWireTree(type, r, 0, bytes.length));
  } catch (e) {
    problem = (e as Error).message;
  }
  if (problem) throw new ModelFormatError(`not a readable ONNX model (${what}: ${problem})`);
  try {
    return decodeAs<T>(type, bytes);
  } catch (e) {
    throw new ModelFormatError(`not a readable ONNX model (${what}: ${(e as Error).message})`);
  }
}

function decodeElement(type: TypeName, r: Reader, e: Entry, ctx: ModelContext, what: string): object {
  if (type === 'TensorProto' && e.end - e.data > EAGER_TENSOR_BYTES) return decodeStub(r, e, ctx, what);
  const el = decodeOrFail<object>(type, r.bytes(e.data, e.end), what);
  setOrigin(el, { kind: 'message', ctx, entry: e, canon: digest(encodeAs(type, el)) });
  if (type === 'TensorProto') checkTensor(el as TensorProto, (el as TensorProto).rawData?.length, true);
  if (type === 'NodeProto') {
    trackSubgraphs(el as NodeProto, r, e, ctx);
    registerAttributeTensors((el as NodeProto).attribute, ctx);
  }
  if (type === 'FunctionProto') for (const n of (el as { node: NodeProto[] }).node) registerAttributeTensors(n.attribute, ctx);
  return el;
}

/** A tensor too large to decode whole: its header is decoded, its data stays in the source. */
function decodeStub(r: Reader, e: Entry, ctx: ModelContext, what: string): TensorProto {
  const fields = scanFields(r, e.data, e.end);
  for (const f of fields) checkWire('TensorProto', f);
  const header = fields.filter((f) => !PAYLOAD_FIELDS.has(f.field)).map((f) => r.bytes(f.start, f.end));
  const t = decodeOrFail<TensorProto>('TensorProto', concatBytes(header), what);
  const origin: StubOrigin = { kind: 'stub', ctx, entry: e, fields, canon: digest(encodeAs('TensorProto', t)) };
  const raw = fields.filter((f) => f.field === 9).pop();
  definePayload(t, origin);
  checkTensor(t, raw ? raw.end - raw.data : undefined, false);
  setOrigin(t, origin);
  return t;
}

/** Shape, type and size checks onnxruntime would otherwise fail on later, reported while reading. */
function checkTensor(t: TensorProto, rawLength: number | undefined, decoded: boolean): void {
  const label = `initializer '${t.name}'`;
  if (!t.name) throw new ModelFormatError('an initializer has no name');
  if (!isKnownDataType(t.dataType)) throw new ModelFormatError(`${label}: unknown data type ${t.dataType}`);
  const dims = t.dims.map(toNumber);
  if (dims.some((d) => d < 0 || !Number.isSafeInteger(d))) throw new ModelFormatError(`${label}: invalid dims [${dims.join(', ')}]`);
  const count = dims.reduce((a, b) => a * b, 1);
  if (!Number.isSafeInteger(count)) throw new ModelFormatError(`${label}: dims [${dims.join(', ')}] are too large`);
  if (t.dataLocation === EXTERNAL) {
    if (!t.externalData.some((kv) => kv.key === 'location' && kv.value)) throw new ModelFormatError(`${label}: external data without a location`, 'bad-external-data');
    return;
  }
  if (t.dataLocation !== 0 && t.dataLocation !== undefined) throw new ModelFormatError(`${label}: unknown data_location ${t.dataLocation}`);
  const expected = rawByteLength(t.dataType, count);
  if (rawLength !== undefined && rawLength > 0) {
    if (expected !== undefined && rawLength !== expected) {
      throw new ModelFormatError(`${label}: raw_data holds ${rawLength} bytes, but dims [${dims.join(', ')}] of data type ${t.dataType} need ${expected}`);
    }
    return;
  }
  if (decoded) checkTypedCount(t, label, count);
}

function checkTypedCount(t: TensorProto, label: string, count: number): void {
  const lengths = [t.floatData.length, t.int32Data.length, t.stringData.length, t.int64Data.length, t.doubleData.length, t.uint64Data.length];
  const held = Math.max(...lengths);
  if (count > 0 && held === 0) throw new ModelFormatError(`${label}: holds no data for ${count} elements`);
  const perElement = t.dataType === 14 || t.dataType === 15 ? 2 : 1;
  const exact = [1, 6, 7, 8, 11, 12, 13, 14, 15].includes(t.dataType);
  if (exact && held !== count * perElement) {
    throw new ModelFormatError(`${label}: holds ${held} values, but dims [${t.dims.map(toNumber).join(', ')}] need ${count * perElement}`);
  }
}

/**
 * The graphs a node holds in its attributes (If branches, Loop bodies, GreedySearch decoders) are read as
 * containers, like the main graph, and each such attribute keeps its origin: a patch inside a subgraph then
 * re-emits only what it changed, and the rest of the node (other attributes, the subgraph's other nodes and
 * tensors, however the file encoded them) keeps its bytes.
 */
function trackSubgraphs(node: NodeProto, r: Reader, e: Entry, ctx: ModelContext): void {
  if (!node.attribute.some((a) => a.g || a.graphs?.length)) return;
  const entries = scanFields(r, e.data, e.end).filter((f) => f.field === 5);
  if (entries.length !== node.attribute.length) return;
  node.attribute.forEach((a, k) => {
    if (!a.g && !a.graphs?.length) return;
    const fields = scanFields(r, entries[k].data, entries[k].end);
    const single = fields.filter((f) => f.field === 6);
    const list = fields.filter((f) => f.field === 11);
    if (a.g && single.length === 1) a.g = decodeContainer<GraphProto>('GraphProto', r, single[0].data, single[0].end, ctx);
    if (a.graphs?.length && list.length === a.graphs.length) a.graphs = list.map((f) => decodeContainer<GraphProto>('GraphProto', r, f.data, f.end, ctx));
    setOrigin(a, { kind: 'message', ctx, entry: entries[k], canon: digest(encodeAs('AttributeProto', a)) });
  });
}

/** Tensors with external data inside node attributes (Constant values, subgraph initializers). */
function registerAttributeTensors(attributes: AttributeProto[], ctx: ModelContext): void {
  forAttributes(attributes, (t) => {
    if (t.dataLocation === EXTERNAL) setExternalContext(t, ctx);
  });
}

/** Recognises files that are something else, so the message can say what they are. */
function otherFormat(r: Reader, size: number): string | null {
  if (size === 0) return 'empty file';
  const head = r.bytes(0, Math.min(size, 16));
  const ascii = (from: number, to: number): string => String.fromCharCode(...head.subarray(from, to));
  if (ascii(0, 4) === 'PK\x03\x04') return 'a zip archive, e.g. a PyTorch .pt/.pth checkpoint';
  if (ascii(0, 4) === 'GGUF') return 'a GGUF file';
  if (head[0] === 0x1f && head[1] === 0x8b) return 'gzip-compressed: decompress it first';
  if (ascii(0, 4) === '\x89HDF') return 'an HDF5 file, e.g. a Keras .h5 model';
  if (ascii(4, 8) === 'ORTM') return 'an onnxruntime .ort model: use the .onnx it was converted from';
  if (ascii(4, 8) === 'TFL3') return 'a TensorFlow Lite model';
  if (ascii(0, 6) === '\x93NUMPY') return 'a NumPy array file';
  if (head[0] === 0x80 && head[1] >= 2 && head[1] <= 5) return 'a Python pickle';
  if (size > 9 && head[8] === 0x7b && isSafetensors(head, size)) return 'a safetensors file';
  if (head[0] === 0x7b || head[0] === 0x5b) return 'a JSON or text file';
  return null;
}

function isSafetensors(head: Uint8Array, size: number): boolean {
  const n = Buffer.from(head.buffer, head.byteOffset, 8).readBigUInt64LE(0);
  return n > 0n && n < BigInt(size);
}
