/**
 * Bad input and faults, through the command line: each gets one clear line on stderr and exit 2, with no
 * stack trace, no output file (not even a temporary one), and the input folder exactly as it was.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { ErrorCode } from '../src/errors';
import { ModelProto } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { decodeAs, encodeAs } from '../src/io/proto';
import { varintField } from '../src/io/wire';
import { assertOneLineError, cli, removeScratch, snapshot, tmpdir, writeExternal } from './support/io';

const SPEC = { layers: 1, d: 16, heads: 2, ff: 16, vocab: 30, tmax: 8 };
const good = Buffer.from(encodeModel(smallTransformer(SPEC)));

/** The test model decoded plainly, to be broken in one place and encoded again. */
function broken(edit: (m: ModelProto) => void): Buffer {
  const m = decodeAs<ModelProto>('ModelProto', good);
  edit(m);
  return Buffer.from(encodeAs('ModelProto', m));
}

const graphEdit = (edit: (g: NonNullable<ModelProto['graph']>) => void): Buffer => broken((m) => edit(m.graph!));
const nodeNamed = (g: NonNullable<ModelProto['graph']>, output: string) => g.node.find((n) => n.output[0] === output)!;

/** Bytes in formats people mistake for ONNX. */
const magic: [string, Buffer, RegExp][] = [
  ['an empty file', Buffer.alloc(0), /empty file/],
  ['a zip (PyTorch checkpoint)', Buffer.concat([Buffer.from('PK\x03\x04', 'latin1'), Buffer.alloc(60)]), /zip archive/],
  ['a GGUF file', Buffer.concat([Buffer.from('GGUF'), Buffer.alloc(60)]), /GGUF/],
  ['a safetensors file', Buffer.concat([Buffer.from([20, 0, 0, 0, 0, 0, 0, 0]), Buffer.from('{"w":{"dtype":"F32"}}'), Buffer.alloc(40)]), /safetensors/],
  ['an onnxruntime .ort file', Buffer.concat([Buffer.from([0x10, 0, 0, 0]), Buffer.from('ORTM'), Buffer.alloc(60)]), /\.ort model/],
  ['a gzip file', Buffer.concat([Buffer.from([0x1f, 0x8b, 8, 0]), Buffer.alloc(60)]), /gzip/],
  ['a pickle', Buffer.concat([Buffer.from([0x80, 4, 0x95]), Buffer.alloc(60)]), /pickle/],
  ['an HDF5 file', Buffer.concat([Buffer.from('\x89HDF\r\n\x1a\n', 'latin1'), Buffer.alloc(60)]), /HDF5/],
  ['a JSON file', Buffer.from('{"model": "gpt2"}\n'), /JSON or text/],
];

const cases: [string, () => Buffer, RegExp][] = [
  ['a file truncated to 1 byte', () => good.subarray(0, 1), /not a readable ONNX model/],
  ['a file truncated in the middle', () => good.subarray(0, Math.floor(good.length / 2)), /not a readable ONNX model.*runs past the end/],
  ['a file missing its last byte', () => good.subarray(0, good.length - 1), /not a readable ONNX model/],
  ['a flipped bit in the first tag', () => { const b = Buffer.from(good); b[0] ^= 0x01; return b; }, /not an ONNX model/],
  ['a flipped bit making a group tag', () => { const b = Buffer.from(good); b[b.indexOf(0x3a)] ^= 0x01; return b; }, /not a readable ONNX model.*wire type 3/],
  ['a TensorProto, not a model', () => Buffer.from(encodeAs('TensorProto', { name: 'w', dataType: 1, dims: [2, 2], rawData: Buffer.alloc(16) })), /not an ONNX model/],
  ['a NodeProto, not a model', () => Buffer.from(encodeAs('NodeProto', { opType: 'Relu', input: ['x'], output: ['y'], name: 'r' })), /not an ONNX model/],
  ['a GraphProto, not a model', () => Buffer.from(encodeAs('GraphProto', decodeAs<ModelProto>('ModelProto', good).graph!)), /not an ONNX model/],
  ['a model without a graph', () => Buffer.from(varintField(1, 8)), /not an ONNX model \(no graph\)/],
  ['a graph with a cycle', () => graphEdit((g) => { nodeNamed(g, 'l0_q').input[0] = 'l0_out'; }), /cycle/],
  ['a tensor produced twice', () => graphEdit((g) => { nodeNamed(g, 'l0_k').output[0] = 'l0_q'; }), /'l0_q' is produced twice/],
  ['a computing node producing an initializer', () => graphEdit((g) => { nodeNamed(g, 'l0_q').output[0] = g.initializer[0].name; }), /which is already an initializer/],
  ['a graph input declared twice', () => graphEdit((g) => { g.input.push(g.input[0]); }), /input 'input_ids' is declared twice/],
  ['a node reading a name nothing defines', () => graphEdit((g) => { nodeNamed(g, 'l0_q').input[1] = 'nowhere'; }), /reads 'nowhere', which no node/],
  ['a graph output nothing produces', () => graphEdit((g) => { g.output[0].name = 'ghost'; }), /output 'ghost' is not produced/],
  ['a node without op_type', () => graphEdit((g) => { g.node[3].opType = ''; }), /has no op_type/],
  ['an initializer whose data does not match its dims', () => graphEdit((g) => { g.initializer.find((t) => t.name === 'wte')!.dims = [31, 16]; }), /raw_data holds \d+ bytes, but dims \[31, 16\]/],
  ['IR version 99', () => broken((m) => { m.irVersion = 99; }), /unsupported IR version 99/],
  ['IR version 2', () => broken((m) => { m.irVersion = 2; }), /unsupported IR version 2/],
  ['no IR version', () => broken((m) => { m.irVersion = 0; }), /no IR version/],
  ['no opset_import', () => broken((m) => { m.opsetImport = []; }), /no opset_import/],
];

function folder(): { dir: string; input: string } {
  const dir = tmpdir('ssmax-faults-');
  const input = path.join(dir, 'm.onnx');
  fs.writeFileSync(input, good);
  return { dir, input };
}

/** One line, exit 2, the folder as it was; with --json, the report's error has `code`. */
function expectRefusal(dir: string, args: string[], pattern: RegExp, code: ErrorCode): void {
  const before = snapshot(dir);
  assertOneLineError(cli(args), 2, pattern);
  assert.equal(JSON.parse(cli([...args, '--json']).stdout).error.code, code);
  assert.deepEqual(snapshot(dir), before, 'the folder changed');
}

describe('bad input files', () => {
  after(removeScratch);
  for (const [what, bytes, pattern] of [...magic.map(([w, b, p]) => [w, () => b, p] as const), ...cases]) {
    it(`${what}: one line, exit 2, nothing written`, () => {
      const { dir } = folder();
      const bad = path.join(dir, 'bad.onnx');
      fs.writeFileSync(bad, bytes());
      expectRefusal(dir, [bad, '--train-len', '8', '-o', path.join(dir, 'out.onnx')], pattern, 'bad-model');
    });
  }
});

describe('bad external data', () => {
  after(removeScratch);
  const external: [string, (dir: string) => void, RegExp][] = [
    ['a missing data file', (dir) => fs.rmSync(path.join(dir, 'm.onnx.data')), /external data file 'm\.onnx\.data' not found/],
    ['an offset past the end of the data file', (dir) => fs.truncateSync(path.join(dir, 'm.onnx.data'), 1000), /runs past the end of 'm\.onnx\.data'/],
  ];
  for (const [what, damage, pattern] of external) {
    it(`${what}: one line, exit 2, nothing written`, () => {
      const dir = tmpdir('ssmax-faults-');
      const input = writeExternal(good, dir, 'm.onnx');
      damage(dir);
      expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')], pattern, 'bad-external-data');
    });
  }

  const relocated: [string, string, RegExp][] = [
    ['an absolute location', '/etc/passwd', /absolute path/],
  ];
  for (const [what, location, pattern] of relocated) {
    it(`${what}: one line, exit 2, nothing written`, () => {
      const dir = tmpdir('ssmax-faults-');
      const input = writeExternal(good, dir, 'm.onnx');
      const m = decodeAs<ModelProto>('ModelProto', fs.readFileSync(input));
      for (const t of m.graph!.initializer) for (const kv of t.externalData) if (kv.key === 'location') kv.value = location;
      fs.writeFileSync(input, encodeAs('ModelProto', m));
      expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')], pattern, 'bad-external-data');
    });
  }

  it('a length entry that disagrees with the dims: one line, exit 2', () => {
    const dir = tmpdir('ssmax-faults-');
    const input = writeExternal(good, dir, 'm.onnx');
    const m = decodeAs<ModelProto>('ModelProto', fs.readFileSync(input));
    const kv = m.graph!.initializer.find((t) => t.name === 'wte')!.externalData.find((e) => e.key === 'length')!;
    kv.value = String(Number(kv.value) - 4);
    fs.writeFileSync(input, encodeAs('ModelProto', m));
    expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')], /external data length \d+, but dims \[30, 16\] need 1920 bytes/, 'bad-external-data');
  });
});

describe('bad output targets', () => {
  after(removeScratch);
  it('the output path equal to the input, by name, through a symlink, or as a hard link', () => {
    const { dir, input } = folder();
    fs.symlinkSync(input, path.join(dir, 'sym.onnx'));
    fs.linkSync(input, path.join(dir, 'hard.onnx'));
    for (const out of [input, path.join(dir, 'sym.onnx'), path.join(dir, 'hard.onnx'), path.join(dir, '.', 'm.onnx')]) {
      expectRefusal(dir, [input, '--train-len', '8', '-o', out, '--force'], /refusing to overwrite the input model/, 'usage');
    }
  });

  it("the output path equal to the input's external data file", () => {
    const dir = tmpdir('ssmax-faults-');
    const input = writeExternal(good, dir, 'm.onnx');
    expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(dir, 'm.onnx.data'), '--force'], /refusing to overwrite the input model \(its external data m\.onnx\.data\)/, 'usage');
  });

  it('an output folder that does not exist', () => {
    const { dir, input } = folder();
    expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(dir, 'no', 'such', 'out.onnx')], /folder .* does not exist/, 'io');
  });

  it('a bad --external-data mode', () => {
    const { dir, input } = folder();
    expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(dir, 'out.onnx'), '--external-data', 'symlink'], /--external-data must be reference, copy or link/, 'usage');
  });

  it('a read-only target folder', (t) => {
    const { dir, input } = folder();
    const target = path.join(dir, 'locked');
    fs.mkdirSync(target);
    if (!lock(target)) {
      t.skip('cannot make a folder read-only here');
      return;
    }
    try {
      expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(target, 'out.onnx')], /cannot write \((permission denied|operation not permitted|read-only file system|folder \S+ is not writable)\)/, 'io');
    } finally {
      unlock(target);
    }
  });

  it('a full target folder', (t) => {
    const { dir, input } = folder();
    const target = path.join(dir, 'full');
    fs.mkdirSync(target);
    // A one-page tmpfs cannot hold the output: the write fails half-way, and nothing may remain.
    if (spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=4k', 'tmpfs', target]).status !== 0) {
      t.skip('cannot mount a small tmpfs here (needs root)');
      return;
    }
    try {
      expectRefusal(dir, [input, '--train-len', '8', '-o', path.join(target, 'out.onnx')], /cannot write \(no space left on the device\)/, 'io');
      assert.deepEqual(fs.readdirSync(target), []);
    } finally {
      spawnSync('umount', [target]);
    }
  });
});

/** Makes a folder unwritable: chattr +i for root (who ignores permissions), chmod otherwise. */
function lock(dir: string): boolean {
  if (process.getuid?.() === 0) {
    try {
      execFileSync('chattr', ['+i', dir], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  }
  fs.chmodSync(dir, 0o555);
  return true;
}

function unlock(dir: string): void {
  if (process.getuid?.() === 0) execFileSync('chattr', ['-i', dir], { stdio: 'ignore' });
  else fs.chmodSync(dir, 0o755);
}
