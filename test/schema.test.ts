/**
 * The ONNX schema written here (src/io/schema.ts) against an onnx.proto from outside: Debian's python3-onnx ships
 * the onnx.proto it was built from. Every message and field of that file must be in ours with the same field
 * number, wire type and repetition, so nothing the installed onnx writes is read as something else. Fields newer
 * than both are kept as unknown bytes by the writer (test/lossless.test.ts). Skipped, saying so, without
 * python3-onnx (.ci/run installs it).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import * as protobuf from 'protobufjs';
import { onnxSchema } from '../src/io/schema';

const found = spawnSync('/usr/bin/python3', ['-c', 'import onnx, os; print(os.path.dirname(onnx.__file__), onnx.__version__)'], { encoding: 'utf8' });
const [dir, version] = found.status === 0 ? found.stdout.trim().split(' ') : ['', ''];
const proto = dir ? path.join(dir, 'onnx.proto') : '';
const skip = proto && fs.existsSync(proto) ? false : 'python3-onnx (with its onnx.proto) is not installed';

/** Every message type under a namespace, nested ones by their dotted name. */
function messages(ns: protobuf.NamespaceBase, prefix = ''): [string, protobuf.Type][] {
  return ns.nestedArray.flatMap((t): [string, protobuf.Type][] =>
    t instanceof protobuf.Type ? [[prefix + t.name, t], ...messages(t, `${prefix}${t.name}.`)] : []);
}

/** The wire view of a field: an enum is written as an int32, as ours declares it. */
function wire(f: protobuf.Field): string {
  f.resolve();
  return `${f.id} ${f.resolvedType instanceof protobuf.Enum ? 'int32' : f.type.split('.').pop()}${f.repeated ? '[]' : ''}`;
}

/** How a schema differs from onnx.proto's, field by field; and how many fields onnx.proto has. */
function compare(schema: object): { differences: string[]; fields: number } {
  const theirs = protobuf.parse(fs.readFileSync(proto, 'utf8')).root.lookup('onnx') as protobuf.Namespace;
  const ours = protobuf.Root.fromJSON(schema as protobuf.INamespace).lookup('onnx') as protobuf.Namespace;
  const differences: string[] = [];
  let fields = 0;
  for (const [name, type] of messages(theirs)) {
    const mine = ours.lookup(name);
    if (!(mine instanceof protobuf.Type)) { differences.push(`${name}: no such message`); continue; }
    for (const f of type.fieldsArray) {
      fields++;
      const m = mine.fields[f.name];
      if (!m) differences.push(`${name}.${f.name} (${f.id}): missing`);
      else if (wire(m) !== wire(f)) differences.push(`${name}.${f.name}: ours ${wire(m)}, onnx.proto ${wire(f)}`);
    }
  }
  return { differences, fields };
}

describe(`src/io/schema.ts covers onnx.proto of python3-onnx ${version}`, { skip }, () => {
  it('every message and field, with the same number, wire type and repetition', () => {
    const { differences, fields } = compare(onnxSchema);
    assert.deepEqual(differences, []);
    assert.ok(fields > 100, `only ${fields} fields read from ${proto}`);
  });

  it('a field renumbered or dropped in our copy is caught', () => {
    const changed = JSON.parse(JSON.stringify(onnxSchema)) as typeof onnxSchema;
    const node = changed.nested.onnx.nested.NodeProto.fields as Record<string, { id: number }>;
    node.opType.id = 99;
    delete node.domain;
    assert.deepEqual(compare(changed).differences, ['NodeProto.opType: ours 99 string, onnx.proto 4 string', 'NodeProto.domain (7): missing']);
  });
});
