/**
 * Where each decoded message came from. The reader registers, for every message it decodes, the bytes it
 * was decoded from; the writer re-emits those bytes unchanged when the message is unchanged. This is what
 * keeps fields this tool does not know (newer ONNX versions, other tools' extensions) and every weight byte.
 */
import { Entry } from './wire';
import { Source } from './source';
import { TypeName } from './proto';

/** The model a message was read from: its bytes and the folder its external data paths are relative to. */
export interface ModelContext {
  src: Source;
  /** Folder of the model file; null for bytes in memory without a known folder. */
  dir: string | null;
}

/** A message kept field by field: the writer walks its original fields and re-emits or replaces each. */
export interface ContainerOrigin {
  kind: 'container';
  type: TypeName;
  ctx: ModelContext;
  entries: Entry[];
  /** Digest of each decoded singular field's encoding at read time, to tell which ones changed. */
  scalars: Map<string, string>;
}

/** A message decoded whole: unchanged if its encoding still has the digest it had when read. */
export interface MessageOrigin {
  kind: 'message';
  type: TypeName;
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
}

export type Origin = ContainerOrigin | MessageOrigin | StubOrigin;

const origins = new WeakMap<object, Origin>();
/** Tensors with external data anywhere in a model (initializers, attribute tensors), and their model. */
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
 * int64 values are shared (nothing mutates them in place); stubs are frozen and shared.
 */
export function cloneTracked<T>(value: T): T {
  return copy(value) as T;
}

function copy(v: unknown): unknown {
  if (v === null || typeof v !== 'object') return v;
  if (v instanceof Uint8Array || typeof (v as { toNumber?: unknown }).toNumber === 'function') return v;
  if (Array.isArray(v)) return v.map(copy);
  const origin = origins.get(v);
  if (origin?.kind === 'stub') return v;
  const out = Object.create(Object.getPrototypeOf(v)) as Record<string, unknown>;
  for (const key of Object.keys(v)) out[key] = copy((v as Record<string, unknown>)[key]);
  if (origin) origins.set(out, origin);
  const ext = externals.get(v);
  if (ext) externals.set(out, ext);
  return out;
}
