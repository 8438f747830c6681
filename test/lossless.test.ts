/**
 * Lossless rewriting: a model carrying fields this tool's schema does not know (at the model, graph, node,
 * attribute, tensor and value_info level), plus every field the rewrite never touches (doc strings, metadata,
 * value_info, sparse initializers, quantization annotations, graph metadata, training info, local functions),
 * keeps every one of them, byte for byte, through a patch; reading and writing without a change gives the
 * same file; a revert gives the input back exactly.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { encodeModel, parseModel, readModel, serializeModel, writeModel } from '../src/io/model-file';
import { ModelProto, NodeProto, TensorProto } from '../src/io/onnx';
import { decodeAs, encodeAs } from '../src/io/proto';
import { MemorySource } from '../src/io/source';
import { concatBytes, Entry, lenHeader, scanFields, varintField } from '../src/io/wire';
import { patchModel } from '../src/rewrite/patch';
import { revertModel } from '../src/rewrite/revert';
import { removeScratch, runIds, tmpdir } from './support/io';

const utf8 = (s: string): Uint8Array => Buffer.from(s, 'utf8');
const field = (id: number, payload: Uint8Array): Uint8Array => concatBytes([lenHeader(id, payload.length), payload]);
/** A LEN field with a number no onnx.proto version uses: what a newer exporter's field looks like to us. */
const unknown = (id: number, text: string): Uint8Array => field(id, utf8(text));

const SPEC = { layers: 2, d: 16, heads: 4, ff: 32, vocab: 40, tmax: 16 };
const IDS = [[1, 5, 9, 2, 33, 7, 11, 3, 0, 39]];

interface Built { bytes: Uint8Array; plain: ModelProto; entries: Record<string, Uint8Array[]> }

/** The test model as bytes, with the exact bytes of each element kept to look for them in outputs. */
function build(): Built {
  const plain = smallTransformer(SPEC);
  const g = plain.graph!;
  const entries: Record<string, Uint8Array[]> = { node: [], tensor: [], value: [], opaque: [] };
  const nodeBytes = (n: NodeProto, i: number): Uint8Array => {
    const attrs = n.attribute.map((a, j) => field(5, concatBytes([encodeAs('AttributeProto', a), unknown(40, `attr-${i}-${j}`)])));
    return concatBytes([encodeAs('NodeProto', { ...n, attribute: [] }), ...attrs, unknown(50, `node-${i}`)]);
  };
  const tensorBytes = (t: TensorProto): Uint8Array => concatBytes([encodeAs('TensorProto', t), unknown(30, `tensor-${t.name}`)]);
  const parts: Uint8Array[] = [];
  const add = (kind: string, id: number, payload: Uint8Array): void => {
    const e = field(id, payload);
    entries[kind].push(e);
    parts.push(e);
  };
  g.node.forEach((n, i) => add('node', 1, nodeBytes(n, i)));
  add('opaque', 2, utf8('graph name'));
  g.initializer.forEach((t) => add('tensor', 5, tensorBytes(t)));
  add('opaque', 10, utf8('graph doc string'));
  for (const v of g.input) add('value', 11, concatBytes([encodeAs('ValueInfoProto', v), unknown(20, `input-${v.name}`)]));
  for (const v of g.output) add('value', 12, concatBytes([encodeAs('ValueInfoProto', v), unknown(20, `output-${v.name}`)]));
  add('value', 13, concatBytes([encodeAs('ValueInfoProto', { name: 'h0', type: { tensorType: { elemType: 1 } } }), unknown(20, 'vi-h0')]));
  add('opaque', 14, concatBytes([field(1, utf8('h0')), field(2, concatBytes([field(1, utf8('SCALE_TENSOR')), field(2, utf8('sqrt_dh'))]))]));
  const sparseValues = encodeAs('TensorProto', { name: 'sparse_w', dataType: 1, dims: [2], floatData: [1.5, -2] });
  const sparseIndices = encodeAs('TensorProto', { name: 'sparse_w_idx', dataType: 7, dims: [2], int64Data: [0, 3] });
  add('opaque', 15, concatBytes([field(1, sparseValues), field(2, sparseIndices), varintField(3, 4)]));
  add('opaque', 16, concatBytes([field(1, utf8('graph-meta')), field(2, utf8('kept'))]));
  add('opaque', 99, utf8('a graph field from the future'));
  const graph = concatBytes(parts);
  const fn = encodeAs('FunctionProto', {
    name: 'unused_fn', domain: 'custom.local', input: ['x'], output: ['y'],
    node: [{ opType: 'Identity', domain: '', input: ['x'], output: ['y'], name: 'fn_id', attribute: [] }],
    opsetImport: [{ domain: '', version: 17 }],
  });
  const top = [
    varintField(1, 8),
    field(8, encodeAs('OperatorSetIdProto', { domain: '', version: 17 })),
    field(8, encodeAs('OperatorSetIdProto', { domain: 'custom.local', version: 1 })),
    field(2, utf8('lossless test')), field(3, utf8('1.0')), field(4, utf8('org.example')), varintField(5, 42),
    field(6, utf8('model doc string')),
    field(7, graph),
    field(14, concatBytes([field(1, utf8('author')), field(2, utf8('someone'))])),
    field(20, field(3, concatBytes([field(1, utf8('a')), field(2, utf8('b'))]))),
    field(25, fn),
    varintField(100, 7),
    unknown(101, 'a model field from the future'),
  ];
  for (const t of top.slice(9)) entries.opaque.push(t);
  entries.opaque.push(top[2], top[3], top[6], top[7]);
  return { bytes: concatBytes(top), plain, entries };
}

const contains = (hay: Uint8Array, needle: Uint8Array): boolean => Buffer.from(hay).indexOf(Buffer.from(needle)) >= 0;

/** The node entries of a model's graph, as raw bytes. */
function nodeEntries(bytes: Uint8Array): Uint8Array[] {
  const src = new MemorySource(bytes, 'out');
  return src.session((r) => {
    const graph = scanFields(r, 0, bytes.length).find((e) => e.field === 7)!;
    return scanFields(r, graph.data, graph.end).filter((e: Entry) => e.field === 1).map((e) => bytes.subarray(e.start, e.end));
  });
}

describe('lossless rewriting', () => {
  after(removeScratch);
  const built = build();

  it('reading and writing an unchanged model gives back the same bytes, unknown fields included', () => {
    const dir = tmpdir();
    const input = path.join(dir, 'in.onnx');
    fs.writeFileSync(input, built.bytes);
    const out = path.join(dir, 'out.onnx');
    writeModel(out, readModel(input));
    assert.ok(fs.readFileSync(out).equals(Buffer.from(built.bytes)));
  });

  it('a patch keeps every unknown and untouched field, byte for byte, and the output runs', async () => {
    const dir = tmpdir();
    const input = path.join(dir, 'in.onnx');
    fs.writeFileSync(input, built.bytes);
    const { model, report } = patchModel(readModel(input), { trainLen: 8 });
    assert.equal(report.sites.length, SPEC.layers);
    const out = path.join(dir, 'out.onnx');
    writeModel(out, model);
    const bytes = fs.readFileSync(out);
    for (const e of [...built.entries.tensor, ...built.entries.value, ...built.entries.opaque]) {
      assert.ok(contains(bytes, e), `missing from the output: ${Buffer.from(e).subarray(0, 40).toString('latin1')}…`);
    }
    // Nodes: all unchanged ones verbatim; the rewired ones keep their own and their attributes' unknown fields.
    const outNodes = nodeEntries(bytes);
    let rewired = 0;
    built.entries.node.forEach((e, i) => {
      if (contains(bytes, e)) return;
      rewired++;
      const mine = outNodes.find((n) => contains(n, unknown(50, `node-${i}`)));
      assert.ok(mine, `node ${i}: changed and lost its unknown field`);
      const attrs = built.plain.graph!.node[i].attribute.length;
      for (let j = 0; j < attrs; j++) assert.ok(contains(mine, unknown(40, `attr-${i}-${j}`)), `node ${i}: attribute ${j} lost its unknown field`);
    });
    assert.equal(rewired, SPEC.layers, 'exactly one node per site (the mask Where) is rewired');
    // The same patch on the model without any extra field computes the same outputs.
    const plain = patchModel(built.plain, { trainLen: 8 }).model;
    const got = await runIds(out, IDS);
    const want = await runIds(encodeModel(plain), IDS);
    assert.ok(Buffer.from(got.logits.buffer).equals(Buffer.from(want.logits.buffer)), 'outputs differ from the same patch without extra fields');
  });

  it('revert of the patch gives back the input bytes exactly', () => {
    const patched = serializeModel(patchModel(parseModel(built.bytes, 'in'), { trainLen: 8 }).model);
    const back = serializeModel(revertModel(parseModel(patched, 'patched')).model);
    assert.ok(Buffer.from(back).equals(Buffer.from(built.bytes)));
  });

  it('a big initializer renamed in memory keeps its data; one whose data is replaced gets the new data', async () => {
    const dir = tmpdir();
    const input = path.join(dir, 'in.onnx');
    fs.writeFileSync(input, encodeModel(built.plain));
    const m = readModel(input);
    const g = m.graph!;
    const wte = g.initializer.find((t) => t.name === 'wte')!;
    const wq = g.initializer.find((t) => t.name === 'l0_wq')!;
    const oldWte = Buffer.from(wte.rawData!);
    wte.name = 'embedding';
    for (const n of g.node) n.input = n.input.map((i) => (i === 'wte' ? 'embedding' : i));
    const newWq = Buffer.from(new Float32Array(SPEC.d * SPEC.d).fill(0.25).buffer);
    wq.rawData = newWq;
    const out = path.join(dir, 'out.onnx');
    writeModel(out, m);
    const back = decodeAs<ModelProto>('ModelProto', fs.readFileSync(out)).graph!.initializer;
    assert.ok(Buffer.from(back.find((t) => t.name === 'embedding')!.rawData!).equals(oldWte));
    assert.ok(Buffer.from(back.find((t) => t.name === 'l0_wq')!.rawData!).equals(newWq));
    assert.ok(!back.some((t) => t.name === 'wte'));
    await runIds(out, IDS);
  });

  it('every initializer of a torch export is copied byte for byte', () => {
    const file = path.join(__dirname, '../../fixtures/torch/gpt2_past.onnx');
    const input = fs.readFileSync(file);
    const patched = serializeModel(patchModel(readModel(file), { trainLen: 64 }).model);
    const src = new MemorySource(input, 'in');
    const inits = src.session((r) => {
      const graph = scanFields(r, 0, input.length).find((e) => e.field === 7)!;
      return scanFields(r, graph.data, graph.end).filter((e) => e.field === 5);
    });
    assert.ok(inits.length > 10);
    for (const e of inits) assert.ok(contains(patched, input.subarray(e.start, e.end)));
  });
});
