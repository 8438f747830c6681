/**
 * External data: models whose weights live in other files are patched without reading the weights, written
 * so their references resolve (same folder: the same files; another folder: linked, copied or referenced),
 * and a model whose protobuf would pass 2 GB is written with its weights in a data file.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it, mock } from 'node:test';
// The real module object (not the import wrapper), so the methods can be mocked where the tool calls them.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const realFs: typeof fs = require('node:fs');
import { smallTransformer } from '../bench/transformer';
import { readModel, writeModel } from '../src/io/model-file';
import { encodeModel } from '../src/io/onnx';
import { externalRef } from '../src/io/external';
import { patchModel } from '../src/rewrite/patch';
import { assertOneLineError, assertSameOutputs, cli, ortLoadError, removeScratch, runIds, scratchdir, sha, snapshot, tmpdir, writeExternal, writeSparseModel } from './support/io';

const SPEC = { layers: 2, d: 64, heads: 4, ff: 128, vocab: 200, tmax: 16 };
const IDS = [[1, 5, 9, 2, 33, 7, 11, 3, 0, 199], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4]];
const embedded = Buffer.from(encodeModel(smallTransformer(SPEC)));
const expected = runIds(encodeModel(patchModel(readFromBytes(), { trainLen: 8 }).model), IDS);

function readFromBytes(): ReturnType<typeof readModel> {
  const dir = tmpdir();
  fs.writeFileSync(path.join(dir, 'm.onnx'), embedded);
  return readModel(path.join(dir, 'm.onnx'));
}

/** Bytes read from the given files while `fn` runs (counts every fs.readSync on their descriptors). */
function bytesReadFrom(files: string[], fn: () => void): number {
  const fds = new Set<number>();
  let total = 0;
  const open = realFs.openSync;
  const read = realFs.readSync;
  const o = mock.method(realFs, 'openSync', (...args: Parameters<typeof fs.openSync>) => {
    const fd = open(...args);
    if (files.includes(path.resolve(String(args[0])))) fds.add(fd);
    return fd;
  });
  const r = mock.method(realFs, 'readSync', (...args: Parameters<typeof fs.readSync>) => {
    const n = (read as (...a: unknown[]) => number)(...args);
    if (fds.has(args[0])) total += n;
    return n;
  });
  const close = realFs.closeSync;
  const c = mock.method(realFs, 'closeSync', (fd: number) => {
    fds.delete(fd);
    close(fd);
  });
  try {
    fn();
  } finally {
    o.mock.restore();
    r.mock.restore();
    c.mock.restore();
  }
  return total;
}

describe('external data', () => {
  after(removeScratch);
  it('same folder: patched without reading the weights; the output references the same files and runs', async () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx');
    const data = path.join(dir, 'm.onnx.data');
    const dataSize = fs.statSync(data).size;
    assert.ok(dataSize > 300_000, `data file of ${dataSize} bytes`);
    const before = snapshot(dir);
    // Only the causal mask constant (1 KB, external at onnx's 1 KB threshold) is read, for mask detection.
    const read = bytesReadFrom([data], () => writeModel(path.join(dir, 'api.onnx'), patchModel(readModel(input), { trainLen: 8 }).model));
    assert.ok(read <= 4 * SPEC.tmax * SPEC.tmax, `read ${read} of ${dataSize} bytes of external data`);
    fs.rmSync(path.join(dir, 'api.onnx'));
    const r = cli([input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /external data in place: .*m\.onnx\.data/);
    assert.deepEqual(snapshot(dir).filter((f) => !f.startsWith('out.onnx')), before);
    assert.ok(fs.statSync(path.join(dir, 'out.onnx')).size < 50_000);
    assertSameOutputs(await runIds(path.join(dir, 'out.onnx'), IDS), await expected);
  });

  it('every tensor external, shape constants and mask included: detection reads the small ones it needs', async () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx', { threshold: 0 });
    const { model, report } = patchModel(readModel(input), { trainLen: 8 });
    assert.equal(report.sites.length, SPEC.layers);
    assert.ok(report.sites.every((s) => s.n === 'causal' && s.heads === SPEC.heads), JSON.stringify(report.sites));
    writeModel(path.join(dir, 'out.onnx'), model);
    // onnxruntime itself cannot infer shapes from external shape tensors: the output loads exactly when the input does.
    assert.equal(await ortLoadError(path.join(dir, 'out.onnx')) === null, await ortLoadError(input) === null);
  });

  it('another folder: hard links by default, copies or references on request; each output runs', async () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx');
    const data = path.join(dir, 'm.onnx.data');
    for (const [mode, how] of [[undefined, 'linked'], ['link', 'linked'], ['copy', 'copied'], ['reference', 'referenced']] as const) {
      const out = path.join(tmpdir(), 'sub', 'out.onnx');
      fs.mkdirSync(path.dirname(out));
      const r = cli([input, '--train-len', '8', '-o', out, ...(mode ? ['--external-data', mode] : [])]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, new RegExp(`external data ${how}: `));
      const placed = path.join(path.dirname(out), 'm.onnx.data');
      if (how === 'referenced') {
        assert.ok(!fs.existsSync(placed));
        const tensor = readModel(out).graph!.initializer.find((t) => t.name === 'wte')!;
        assert.equal(path.resolve(path.dirname(out), externalRef(tensor).location), data);
        continue;
      }
      assert.equal(fs.statSync(placed).ino === fs.statSync(data).ino, how === 'linked', `${mode}: ${how}`);
      assert.equal(sha(placed), sha(data));
      assertSameOutputs(await runIds(out, IDS), await expected);
    }
  });

  it('one data file per tensor: every file placed beside an output in another folder', async () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx', { perTensor: true });
    const files = fs.readdirSync(dir).filter((f) => f.endsWith('.bin'));
    assert.ok(files.length > 10);
    const outDir = tmpdir();
    const r = cli([input, '--train-len', '8', '-o', path.join(outDir, 'out.onnx'), '--external-data', 'copy']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(fs.readdirSync(outDir).filter((f) => f.endsWith('.bin')).sort(), files.sort());
    assertSameOutputs(await runIds(path.join(outDir, 'out.onnx'), IDS), await expected);
  });

  it('to another file system: the default falls back to a copy; --external-data link refuses in one line', async (t) => {
    const other = '/dev/shm';
    const dir = tmpdir();
    if (!fs.existsSync(other) || fs.statSync(other).dev === fs.statSync(dir).dev) {
      t.skip('no second file system at /dev/shm');
      return;
    }
    const input = writeExternal(embedded, dir, 'm.onnx');
    const outDir = fs.mkdtempSync(path.join(other, 'ssmax-'));
    try {
      assertOneLineError(cli([input, '--train-len', '8', '-o', path.join(outDir, 'a.onnx'), '--external-data', 'link']), 2, /another file system/);
      assert.deepEqual(fs.readdirSync(outDir), []);
      const r = cli([input, '--train-len', '8', '-o', path.join(outDir, 'b.onnx')]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /external data copied: /);
      assertSameOutputs(await runIds(path.join(outDir, 'b.onnx'), IDS), await expected);
    } finally {
      fs.rmSync(outDir, { recursive: true, force: true });
    }
  });

  it('--verify runs on a model with external data', () => {
    const dir = tmpdir();
    // Larger weights: attention peaked enough for SSMax to change the outputs beyond L (the liveness check).
    const input = writeExternal(Buffer.from(encodeModel(smallTransformer(SPEC, 3, 4))), dir, 'm.onnx');
    const r = cli([input, '--train-len', '8', '--n', 'keys', '--verify', '--lengths', '8,16', '-o', path.join(dir, 'out.onnx')]);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /verify: PASSED/);
  });

  it('an output over the protobuf limit goes to <output>.data, and runs the same', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'm.onnx'), embedded);
    const out = path.join(dir, 'out.onnx');
    const report = writeModel(out, patchModel(readModel(path.join(dir, 'm.onnx')), { trainLen: 8 }).model, { maxProtobufBytes: 64 * 1024 });
    assert.deepEqual(report.externalData.map((e) => [path.basename(e.file), e.how]), [['out.onnx.data', 'written']]);
    assert.ok(fs.statSync(out).size <= 64 * 1024);
    assertSameOutputs(await runIds(out, IDS), await expected);
  });

  it('a model over 2 GB is read, patched, and written with its weights in a data file', () => {
    // On tmpfs, reading the sparse file's holes costs no page cache; on a disk it takes seconds, but works.
    const dir = scratchdir('ssmax-big-');
    try {
      bigModelRoundTrip(dir);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** Patches a model with a 2 GB initializer and checks the output's data file holds its bytes where it says. */
function bigModelRoundTrip(dir: string): void {
  const input = path.join(dir, 'big.onnx');
  const { markers, rawBytes } = writeSparseModel(input, 2 ** 29 + 4096);
  const r = cli([input, '--train-len', '8', '-o', path.join(dir, 'out.onnx')]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /external data written: .*out\.onnx\.data/);
  const model = readModel(path.join(dir, 'out.onnx'));
  assert.ok(fs.statSync(path.join(dir, 'out.onnx')).size < 1 << 20);
  const table = model.graph!.initializer.find((t) => t.name === 'big_table')!;
  const ref = externalRef(table);
  assert.equal(ref.length, rawBytes);
  const fd = fs.openSync(path.join(dir, 'out.onnx.data'), 'r');
  const head = Buffer.alloc(markers.head.length);
  const tail = Buffer.alloc(markers.tail.length);
  fs.readSync(fd, head, 0, head.length, ref.offset);
  fs.readSync(fd, tail, 0, tail.length, ref.offset + ref.length - tail.length);
  fs.closeSync(fd);
  assert.ok(head.equals(markers.head) && tail.equals(markers.tail), 'weight bytes moved to the wrong place');
}

