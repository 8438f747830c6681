/**
 * The protobuf wire format, read by position: each field of a message becomes an Entry (where its tag starts,
 * where its data starts, where it ends), so large fields can be skipped and later copied by range.
 */
import { Reader } from './source';

export const VARINT = 0;
export const I64 = 1;
export const LEN = 2;
export const I32 = 5;

export interface Entry {
  field: number;
  wire: number;
  /** Position of the tag. */
  start: number;
  /** Position of the field's data (after the length prefix, for LEN fields). */
  data: number;
  end: number;
}

/** A structural problem in the bytes: truncated, impossible lengths, wire types the format does not use. */
export class WireError extends Error {}

export function readVarint(r: Reader, pos: number, limit: number): { value: number; next: number } {
  let value = 0;
  for (let i = 0; i < 10; i++) {
    if (pos + i >= limit) throw new WireError(`truncated at byte ${pos + i}`);
    const b = r.byte(pos + i);
    value += (b & 0x7f) * 2 ** (7 * i);
    if (b < 0x80) return { value, next: pos + i + 1 };
  }
  throw new WireError(`malformed varint at byte ${pos}`);
}

/** Every field of the message held in [start, end), in order. */
export function scanFields(r: Reader, start: number, end: number): Entry[] {
  const entries: Entry[] = [];
  let pos = start;
  while (pos < end) {
    const tag = readVarint(r, pos, end);
    const field = Math.floor(tag.value / 8);
    const wire = tag.value % 8;
    if (field === 0) throw new WireError(`field number 0 at byte ${pos}`);
    let data = tag.next;
    let next: number;
    if (wire === VARINT) next = readVarint(r, data, end).next;
    else if (wire === I64) next = data + 8;
    else if (wire === I32) next = data + 4;
    else if (wire === LEN) {
      const len = readVarint(r, data, end);
      data = len.next;
      next = data + len.value;
    } else throw new WireError(`wire type ${wire} (groups are not used by ONNX) at byte ${pos}`);
    if (next > end) throw new WireError(`field ${field} at byte ${pos} runs past the end of its message (truncated?)`);
    entries.push({ field, wire, start: pos, data, end: next });
    pos = next;
  }
  return entries;
}

export function encodeVarint(value: number): Uint8Array {
  const out: number[] = [];
  let v = value;
  while (v >= 0x80) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
  return Uint8Array.from(out);
}

/** Tag and length prefix of a LEN field holding `length` bytes. */
export function lenHeader(field: number, length: number): Uint8Array {
  return concatBytes([encodeVarint(field * 8 + LEN), encodeVarint(length)]);
}

export function varintField(field: number, value: number): Uint8Array {
  return concatBytes([encodeVarint(field * 8 + VARINT), encodeVarint(value)]);
}

export function concatBytes(parts: Uint8Array[]): Uint8Array {
  const total = parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(total);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
