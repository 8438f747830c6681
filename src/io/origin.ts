/**
 * Where each decoded message came from. The reader registers, for every message it decodes, the bytes it
 * was decoded from; the writer re-emits those bytes unchanged when the message is unchanged. This is what
 * keeps fields this tool does not know (newer ONNX versions, other tools' extensions) and every weight byte.
 */
import { Entry } from './wire';
import { Source } from './source';
import { decodeAs } from './proto';

/** The model a message was read from: its bytes and the folder its external data paths are relative to. */
export interface ModelContext {
  src: Source;
  /** Folder of the model file; null for bytes in memory without a known folder. */
  dir: string | null;
  /**
   * Small external tensors already read, by location, offset and length: a model and its copies (cloneTracked keeps
   * the context) read each constant once, whichever of them asks.
   */
  reads?: Map<string, Uint8Array>;
}

/** A message kept field by field: the writer walks its original fields and re-emits or replaces each. */
export interface ContainerOrigin {
  kind: 'container';
  ctx: ModelContext;
  entries: Entry[];
  /** Digest of each decoded singular field's encoding at read time, to tell which ones changed. */
  scalars: Map<string, string>;
}

/** A message decoded whole: unchanged if its encoding still has the digest it had when read. */
export interface MessageOrigin {
  kind: 'message';
  ctx: ModelContext;
  entry: Entry;
  canon: string;
}

/** A tensor whose data was not read: its header is decoded, its payload fields are spans of the source. */
export interface StubOrigin {
  kind: 'stub';
  ctx: ModelContext;
  entry: Entry;
  /** The tensor's own fields, positions absolute in the source. */
  fields: Entry[];
  /** Digest of the header (every field but the data) at read time. */
  canon: string;
}

/** TensorProto fields that hold the data: float, int32, string, int64, raw, double, uint64. */
export const PAYLOAD_FIELDS = new Map([
  [4, 'floatData'], [5, 'int32Data'], [6, 'stringData'], [7, 'int64Data'], [9, 'rawData'], [10, 'doubleData'], [11, 'uint64Data'],
]);
const PAYLOAD_NAMES = new Set(PAYLOAD_FIELDS.values());

let lastPayload: { origin: StubOrigin; tensor: Record<string, unknown> } | null = null;

/**
 * Gives a stub tensor its data fields as properties read from the source on first use (not kept: callers
 * cache the values they need). Assigning one replaces it with the new value, which the writer then encodes.
 */
export function definePayload(t: object, origin: StubOrigin): void {
  for (const f of origin.fields) {
    const name = PAYLOAD_FIELDS.get(f.field);
    if (!name) continue;
    Object.defineProperty(t, name, {
      enumerable: true,
      configurable: true,
      get: () => payloadOf(origin)[name],
      set(this: object, value: unknown) {
        Object.defineProperty(this, name, { value, writable: true, enumerable: true, configurable: true });
      },
    });
  }
}

function payloadOf(origin: StubOrigin): Record<string, unknown> {
  if (lastPayload?.origin !== origin) {
    const bytes = origin.ctx.src.read(origin.entry.data, origin.entry.end);
    lastPayload = { origin, tensor: decodeAs<Record<string, unknown>>('TensorProto', bytes) };
  }
  return lastPayload.tensor;
}

/** True when a stub's data fields are still the ones in the source: no accessor replaced, no empty field filled. */
export function payloadIntact(t: object): boolean {
  return [...PAYLOAD_NAMES].every((name) => {
    const d = Object.getOwnPropertyDescriptor(t, name);
    if (!d || d.get) return true;
    const v = d.value as { length?: number } | null | undefined;
    return v === undefined || v === null || v.length === 0;
  });
}

/** The header of a tensor: every own field but the data, as a plain object to encode. */
export function headerOf(t: object): Record<string, unknown> {
  const out = Object.create(Object.getPrototypeOf(t)) as Record<string, unknown>;
  for (const key of Object.keys(t)) if (!PAYLOAD_NAMES.has(key)) out[key] = (t as Record<string, unknown>)[key];
  return out;
}

export type Origin = ContainerOrigin | MessageOrigin | StubOrigin;

const origins = new WeakMap<object, Origin>();
/** Tensors with external data inside node attributes, and their model (an attribute's own tensors have no origin to tell it). */
const externals = new WeakMap<object, ModelContext>();

export function originOf(message: object): Origin | undefined {
  return origins.get(message);
}

export function setOrigin(message: object, origin: Origin): void {
  origins.set(message, origin);
}

export function externalContext(tensor: object): ModelContext | undefined {
  return externals.get(tensor) ?? originOf(tensor)?.ctx;
}

export function setExternalContext(tensor: object, ctx: ModelContext): void {
  externals.set(tensor, ctx);
}

/**
 * A deep copy that keeps each message's provenance, so a copy is still written losslessly. Byte arrays and
 * int64 values are shared (nothing mutates them in place); a stub's data accessors are copied, not read.
 */
export function cloneTracked<T>(v: T): T {
  if (v === null || typeof v !== 'object') return v;
  if (v instanceof Uint8Array || typeof (v as { toNumber?: unknown }).toNumber === 'function') return v;
  if (Array.isArray(v)) return v.map(cloneTracked) as T;
  const origin = origins.get(v);
  const out = Object.create(Object.getPrototypeOf(v)) as Record<string, unknown>;
  for (const key of Object.keys(v)) {
    const d = Object.getOwnPropertyDescriptor(v, key)!;
    // A stub's data stays in the file: copy the accessor, not the bytes.
    if (d.get) Object.defineProperty(out, key, d);
    else out[key] = cloneTracked(d.value);
  }
  if (origin) origins.set(out, origin);
  const ext = externals.get(v);
  if (ext) externals.set(out, ext);
  return out as T;
}
