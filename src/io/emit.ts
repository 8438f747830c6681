/**
 * Turns a model into the pieces of its output file: byte arrays for what changed, spans of the input for
 * what did not. A message read from the file and left unchanged is emitted as its original bytes, field for
 * field, so unknown fields, newer-schema fields and every initializer byte pass through untouched; a message
 * the rewrite changed is re-encoded only in the fields that changed, the others are copied.
 */
import { InputError } from '../errors';
import { memo } from '../memo';
import { EXTERNAL } from './constants';
import { dataFile, externalRef, forAttributes, isExternal } from './external';
import type { ModelProto, NodeProto, StringStringEntry, TensorProto } from './onnx';
import {
  cloneTracked, ContainerOrigin, externalContext, headerOf, MessageOrigin, originOf, PAYLOAD_FIELDS, payloadIntact, StubOrigin,
} from './origin';
import { decodeAs, encodeAs, encodeField, fieldIds, fieldName, TypeName } from './proto';
import { digest, SPECS } from './read';
import { FileSource, MemorySource, Source } from './source';
import { Entry, lenHeader, scanFields, varintField } from './wire';

/** Bytes in memory, or a span of a source: what the writer copies from input to output without holding it. */
export type Piece = Uint8Array | { src: Source; start: number; end: number };

/** An output under construction: its pieces in order and its total size. */
export class Out {
  readonly pieces: Piece[] = [];
  size = 0;

  bytes(b: Uint8Array): void {
    if (b.length === 0) return;
    this.pieces.push(b);
    this.size += b.length;
  }

  span(src: Source, start: number, end: number): void {
    if (end <= start) return;
    const last = this.pieces[this.pieces.length - 1];
    if (last && !(last instanceof Uint8Array) && last.src === src && last.end === start) last.end = end;
    else this.pieces.push({ src, start, end });
    this.size += end - start;
  }

  append(pieces: Piece[]): void {
    for (const p of pieces) {
      if (p instanceof Uint8Array) this.bytes(p);
      else this.span(p.src, p.start, p.end);
    }
  }

  /** Pads with zeros to a multiple of `alignment`. */
  align(alignment: number): void {
    const pad = (alignment - (this.size % alignment)) % alignment;
    if (pad) this.bytes(new Uint8Array(pad));
  }
}

export interface EmitPlan {
  /** New locations for external data files (absolute path → location string): reference mode. */
  relocate?: Map<string, string>;
  /** Moves the raw data of embedded tensors of at least `minBytes` into `data`, a file at `location`. */
  externalize?: { location: string; data: Out; minBytes: number };
  /** Puts external data back into the model, for bytes handed over in memory. */
  inline?: boolean;
}

export function emitModel(model: ModelProto, plan: EmitPlan = {}): Out {
  sources = new Map();
  const out = new Out();
  emitPayload('ModelProto', model, out, plan);
  return out;
}

function emitPayload(type: TypeName, obj: object, out: Out, plan: EmitPlan): void {
  if (type === 'TensorProto' && tensorTransform(obj as TensorProto, plan)) {
    emitTransformedTensor(obj as TensorProto, out, plan);
    return;
  }
  const value = rewritesNode(type, obj, plan) ? rewriteNodeTensors(obj as NodeProto, plan) : obj;
  const origin = originOf(value);
  if (!origin) out.bytes(encodeAs(type, value));
  else if (origin.kind === 'container') emitContainer(type, value, origin, out, plan);
  else if (origin.kind === 'stub') emitReplacing(tensorFields(value as TensorProto), new Map(), out);
  else if (unchanged(type, value, origin)) out.span(origin.ctx.src, origin.entry.data, origin.entry.end);
  else emitMerged(type, value, origin, out, plan);
}

function stubUnchanged(t: object, origin: StubOrigin): boolean {
  return payloadIntact(t) && digest(encodeAs('TensorProto', headerOf(t))) === origin.canon;
}

/** One element of a repeated field: its original entry (tag and length included) when it can be reused. */
function emitElement(field: number, type: TypeName, obj: object, out: Out, plan: EmitPlan): void {
  const origin = originOf(obj);
  const reusable = origin && origin.kind !== 'container' && origin.entry.field === field
    && (origin.kind === 'stub' ? stubUnchanged(obj, origin) : unchanged(type, obj, origin))
    && !(type === 'TensorProto' && tensorTransform(obj as TensorProto, plan))
    && !rewritesNode(type, obj, plan);
  if (reusable) out.span(origin.ctx.src, origin.entry.start, origin.entry.end);
  else emitEmbedded(field, type, obj, out, plan);
}

/** A message as a field of its parent: tag and length, then the message. */
function emitEmbedded(field: number, type: TypeName, obj: object, out: Out, plan: EmitPlan): void {
  const sub = new Out();
  emitPayload(type, obj, sub, plan);
  out.bytes(lenHeader(field, sub.size));
  out.append(sub.pieces);
}

function unchanged(type: TypeName, obj: object, origin: MessageOrigin): boolean {
  return digest(encodeAs(type, obj)) === origin.canon;
}

/** Model and graph: original fields in their original order, each list re-emitted element by element. */
function emitContainer(type: TypeName, obj: object, origin: ContainerOrigin, out: Out, plan: EmitPlan): void {
  const spec = SPECS[type]!;
  const record = obj as Record<string, unknown>;
  const done = new Set<number>();
  const emitField = (id: number): void => {
    const list = spec.lists[id];
    const single = spec.single[id];
    if (list) for (const el of (record[list[0]] as object[] | undefined) ?? []) emitElement(id, list[1], el, out, plan);
    else if (single && record[single[0]]) emitEmbedded(id, single[1], record[single[0]] as object, out, plan);
    else if (spec.scalars[id] !== undefined) out.bytes(encodeField(type, obj, spec.scalars[id]));
  };
  for (const e of origin.entries) {
    if (done.has(e.field)) continue;
    const scalar = spec.scalars[e.field];
    const changed = scalar !== undefined && digest(encodeField(type, obj, scalar)) !== origin.scalars.get(scalar);
    if (spec.lists[e.field] || spec.single[e.field] || changed) {
      emitField(e.field);
      done.add(e.field);
    } else {
      out.span(origin.ctx.src, e.start, e.end);
    }
  }
  const present = new Set(origin.entries.map((e) => e.field));
  const ids = [...Object.keys(spec.lists), ...Object.keys(spec.single), ...Object.keys(spec.scalars)].map(Number).sort((a, b) => a - b);
  for (const id of ids) if (!present.has(id)) emitField(id);
}

/** Message fields whose elements keep origins of their own (read.ts trackSubgraphs): re-emitted element by element. */
const NESTED: Partial<Record<TypeName, Record<string, TypeName>>> = {
  NodeProto: { attribute: 'AttributeProto' },
  AttributeProto: { g: 'GraphProto', graphs: 'GraphProto' },
};

/** Emits a changed field of nested messages that have origins; false when it has none (then it is encoded anew). */
function emitNested(type: TypeName, field: number, name: string, obj: object, out: Out, plan: EmitPlan): boolean {
  const elemType = NESTED[type]?.[name];
  const value = (obj as Record<string, unknown>)[name];
  const elements = (Array.isArray(value) ? value : value ? [value] : []) as object[];
  if (!elemType || !elements.some((el) => originOf(el))) return false;
  const emit = Array.isArray(value) ? emitElement : emitEmbedded;
  for (const el of elements) emit(field, elemType, el, out, plan);
  return true;
}

/** A changed message: fields equal to the original keep their original bytes, unknown fields included. */
function emitMerged(type: TypeName, obj: object, origin: MessageOrigin, out: Out, plan: EmitPlan): void {
  const bytes = origin.ctx.src.read(origin.entry.data, origin.entry.end);
  const was = decodeAs<object>(type, bytes);
  const fields = new MemorySource(bytes, '').session((r) => scanFields(r, 0, bytes.length));
  const done = new Set<number>();
  for (const f of fields) {
    const name = fieldName(type, f.field);
    if (!name) {
      out.bytes(bytes.subarray(f.start, f.end));
      continue;
    }
    if (done.has(f.field)) continue;
    const now = encodeField(type, obj, name);
    if (Buffer.compare(now, encodeField(type, was, name)) === 0) out.bytes(bytes.subarray(f.start, f.end));
    else {
      if (!emitNested(type, f.field, name, obj, out, plan)) out.bytes(now);
      done.add(f.field);
    }
  }
  const present = new Set(fields.map((f) => f.field));
  for (const id of fieldIds(type)) if (!present.has(id)) out.bytes(encodeField(type, obj, fieldName(type, id)!));
}

// ---- tensors whose data moves: external ↔ embedded, or whose external location changes ----

function tensorTransform(t: TensorProto, plan: EmitPlan): boolean {
  if (isExternal(t)) return Boolean(plan.inline || relocated(t, plan));
  if (!plan.externalize) return false;
  const origin = originOf(t);
  const raw = origin?.kind === 'stub' && payloadIntact(t) ? rawField(origin) : undefined;
  return raw !== undefined && raw.end - raw.data >= plan.externalize.minBytes;
}

function rawField(origin: StubOrigin): Entry | undefined {
  const payload = origin.fields.filter((f) => PAYLOAD_FIELDS.has(f.field));
  return payload.length === 1 && payload[0].field === 9 ? payload[0] : undefined;
}

function emitTransformedTensor(t: TensorProto, out: Out, plan: EmitPlan): void {
  const fields = tensorFields(t);
  const replace = new Map<number, Piece[]>();
  if (isExternal(t) && plan.inline) {
    const { file, ref } = locate(t);
    replace.set(13, []).set(14, []);
    replace.set(9, [lenHeader(9, ref.length), { src: sourceFor(file), start: ref.offset, end: ref.offset + ref.length }]);
  } else if (isExternal(t)) {
    const { file } = locate(t);
    const entries = t.externalData.map((kv) => (kv.key === 'location' ? { key: kv.key, value: plan.relocate!.get(file)! } : kv));
    replace.set(13, [encodeField('TensorProto', { externalData: entries }, 'externalData')]);
  } else {
    const x = plan.externalize!;
    const origin = originOf(t) as StubOrigin;
    const raw = rawField(origin)!;
    const length = raw.end - raw.data;
    x.data.align(length >= 1 << 20 ? 65536 : 16);
    const offset = x.data.size;
    x.data.span(origin.ctx.src, raw.data, raw.end);
    const entries: StringStringEntry[] = [
      { key: 'location', value: x.location }, { key: 'offset', value: String(offset) }, { key: 'length', value: String(length) },
    ];
    replace.set(9, []).set(13, [encodeField('TensorProto', { externalData: entries }, 'externalData')]);
    replace.set(14, [varintField(14, EXTERNAL)]);
  }
  emitReplacing(fields, replace, out);
}

/** A field of a message and the source its bytes are in. */
type Located = Entry & { src: Source };

/** Emits fields in order, putting each replacement where its field first appeared (or at the end). */
function emitReplacing(fields: Located[], replace: Map<number, Piece[]>, out: Out): void {
  const done = new Set<number>();
  for (const f of fields) {
    const r = replace.get(f.field);
    if (!r) out.span(f.src, f.start, f.end);
    else if (!done.has(f.field)) {
      out.append(r);
      done.add(f.field);
    }
  }
  for (const [id, r] of [...replace].sort((a, b) => a[0] - b[0])) if (!done.has(id)) out.append(r);
}

/**
 * A tensor's fields, each with the source its bytes are in, whatever the tensor's origin and edits. A tensor whose
 * data stayed in the file: unchanged, its bytes; header edited (a rename, new dims), the new header, then the
 * original data and unknown fields, copied; data replaced, encoded anew.
 */
function tensorFields(t: TensorProto): Located[] {
  const origin = originOf(t);
  const located = (src: Source, entries: Entry[]): Located[] => entries.map((e) => ({ ...e, src }));
  const scan = (bytes: Uint8Array): Located[] => {
    const mem = new MemorySource(bytes, t.name);
    return located(mem, mem.session((r) => scanFields(r, 0, bytes.length)));
  };
  if (origin?.kind === 'stub' && stubUnchanged(t, origin)) return located(origin.ctx.src, origin.fields);
  if (origin?.kind === 'stub' && payloadIntact(t)) {
    // Header edited: the new header from memory; the data and unknown fields from the source.
    const kept = origin.fields.filter((f) => PAYLOAD_FIELDS.has(f.field) || !fieldName('TensorProto', f.field));
    return [...scan(encodeAs('TensorProto', headerOf(t))), ...located(origin.ctx.src, kept)];
  }
  if (origin?.kind === 'message' && unchanged('TensorProto', t, origin)) {
    const src = origin.ctx.src;
    return located(src, src.session((r) => scanFields(r, origin.entry.data, origin.entry.end)));
  }
  return scan(encodeAs('TensorProto', t));
}

function locate(t: TensorProto): { file: string; ref: ReturnType<typeof externalRef> } {
  const ctx = externalContext(t);
  const ref = externalRef(t);
  if (!ctx || ctx.dir === null) {
    throw new InputError(`tensor '${t.name}': its external data cannot be found (model read from memory without its folder)`, 'bad-external-data');
  }
  return { file: dataFile(ctx.dir, ref.location), ref };
}

/** Data files opened during one emission (each source takes the file's identity when created). */
let sources = new Map<string, FileSource>();

function sourceFor(file: string): FileSource {
  return memo(sources, file, () => new FileSource(file));
}

// ---- external tensors inside node attributes (Constant values, subgraph initializers) ----

function relocated(t: TensorProto, plan: EmitPlan): boolean {
  const ctx = externalContext(t);
  if (!plan.relocate?.size || !ctx || ctx.dir === null) return false;
  return plan.relocate.has(dataFile(ctx.dir, externalRef(t).location));
}

/** True for a node with external attribute tensors when the plan inlines or relocates external data. */
function rewritesNode(type: TypeName, obj: object, plan: EmitPlan): boolean {
  if (type !== 'NodeProto' || !(plan.inline || plan.relocate?.size)) return false;
  let found = false;
  forAttributes((obj as NodeProto).attribute, (t) => {
    found ||= isExternal(t);
  });
  return found;
}

/** A copy of the node whose external attribute tensors are inlined or relocated; the node keeps its origin. */
function rewriteNodeTensors(node: NodeProto, plan: EmitPlan): NodeProto {
  const copy = cloneTracked(node);
  const fix = (t: TensorProto): void => {
    if (!isExternal(t) || !(plan.inline || relocated(t, plan))) return;
    const { file, ref } = locate(t);
    if (plan.inline) {
      t.rawData = sourceFor(file).read(ref.offset, ref.offset + ref.length);
      t.dataLocation = 0;
      t.externalData = [];
    } else t.externalData = t.externalData.map((kv) => (kv.key === 'location' ? { key: kv.key, value: plan.relocate!.get(file)! } : kv));
  };
  forAttributes(copy.attribute, fix);
  return copy;
}

/** All pieces read into one buffer. */
export function toBytes(out: Out): Uint8Array {
  const bytes = Buffer.allocUnsafe(out.size);
  let o = 0;
  for (const p of out.pieces) {
    const b = p instanceof Uint8Array ? p : p.src.read(p.start, p.end);
    bytes.set(b, o);
    o += b.length;
  }
  return bytes;
}
