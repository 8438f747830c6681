/** The protobufjs message types of onnx.proto, and encoding of whole messages or single fields. */
import * as protobuf from 'protobufjs';
import { memo } from '../memo';
import { onnxSchema } from './schema';
import { Reader } from './source';
import { scanFields } from './wire';

const root = protobuf.Root.fromJSON(onnxSchema as protobuf.INamespace);

export type TypeName =
  | 'ModelProto' | 'GraphProto' | 'NodeProto' | 'TensorProto' | 'ValueInfoProto' | 'StringStringEntryProto'
  | 'OperatorSetIdProto' | 'FunctionProto' | 'AttributeProto';

const types = new Map<string, protobuf.Type>();

export function protoType(name: TypeName): protobuf.Type {
  return memo(types, name, () => root.lookupType(`onnx.${name}`));
}

export function decodeAs<T>(name: TypeName, bytes: Uint8Array): T {
  return protoType(name).decode(bytes) as unknown as T;
}

export function encodeAs(name: TypeName, message: object): Uint8Array {
  return protoType(name).encode(message as protobuf.Message).finish();
}

/** The field's name in the decoded object, or undefined for a field number the schema does not know. */
export function fieldName(name: TypeName, id: number): string | undefined {
  return protoType(name).fieldsById[id]?.name;
}

export function fieldIds(name: TypeName): number[] {
  return Object.keys(protoType(name).fieldsById).map(Number).sort((a, b) => a - b);
}

/**
 * The encoding of one field of a message (every occurrence of a repeated field), honouring presence: a
 * singular field that was never set (a prototype default) encodes to nothing.
 */
export function encodeField(name: TypeName, message: object, field: string): Uint8Array {
  const f = protoType(name).fields[field];
  const value = (message as Record<string, unknown>)[field];
  if (f.repeated) {
    if (!Array.isArray(value) || value.length === 0) return new Uint8Array(0);
  } else if (value === undefined || value === null || !Object.prototype.hasOwnProperty.call(message, field)) {
    return new Uint8Array(0);
  }
  return protoType(name).encode({ [field]: value } as unknown as protobuf.Message).finish();
}

/** Wire types the schema allows for a field number (packed repeated scalars also arrive as LEN). */
export function allowedWireTypes(name: TypeName, id: number): number[] | undefined {
  const f = protoType(name).fieldsById[id];
  return f && wireTypesOf(f);
}

function wireTypesOf(f: protobuf.Field): number[] {
  const wire = scalarWire[f.type] ?? 2;
  return f.repeated && wire !== 2 ? [wire, 2] : [wire];
}

/**
 * Checks a message's bytes against the schema all the way down: every known field carries the wire type its
 * type has, every nested message is well formed. protobufjs does not check wire types (it would read a
 * corrupt field as something else), so the reader runs this before trusting a decode.
 */
export function checkWireTree(name: TypeName, r: Reader, start: number, end: number): string | null {
  return checkType(protoType(name), r, start, end, 0);
}

function checkType(type: protobuf.Type, r: Reader, start: number, end: number, depth: number): string | null {
  if (depth > 64) return 'messages nested too deep';
  for (const e of scanFields(r, start, end)) {
    const f = type.fieldsById[e.field];
    if (!f) continue;
    if (!wireTypesOf(f).includes(e.wire)) return `corrupt ${type.name}.${f.name} at byte ${e.start}`;
    f.resolve();
    if (f.resolvedType instanceof protobuf.Type) {
      const problem = checkType(f.resolvedType, r, e.data, e.end, depth + 1);
      if (problem) return problem;
    }
  }
  return null;
}

const scalarWire: Record<string, number> = {
  int32: 0, int64: 0, uint32: 0, uint64: 0, sint32: 0, sint64: 0, bool: 0, enum: 0,
  fixed64: 1, sfixed64: 1, double: 1, fixed32: 5, sfixed32: 5, float: 5, string: 2, bytes: 2,
};
