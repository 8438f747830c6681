/**
 * External data: models whose weights live in other files are patched without reading the weights, written
 * so their references resolve (same folder: the same files; another folder: copies of their own by default,
 * hard links or references on request), and a model whose protobuf would pass 2 GB is written with its weights
 * in a data file. Issue 25: no write through the output's data may change the original's, unless asked for.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it, mock } from 'node:test';
// The real module object (not the import wrapper), so the methods can be mocked where the tool calls them.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const realFs: typeof fs = require('node:fs');
import { smallTransformer } from '../bench/transformer';
import { encodeModel, readModel, writeModel } from '../src/io/model-file';

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

  it('another folder: copies by default (clones where the file system has them), links or references on request; each output runs', async () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx');
    const data = path.join(dir, 'm.onnx.data');
    const copied = clones(tmpdir()) ? 'cloned' : 'copied';
    for (const [mode, how] of [[undefined, copied], ['link', 'linked'], ['copy', copied], ['reference', 'referenced']] as const) {
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

  it("the default gives the output data of its own: saves through the output leave the original's data as it was", () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx');
    const data = path.join(dir, 'm.onnx.data');
    const before = { sha: sha(data), size: fs.statSync(data).size };
    const out = path.join(tmpdir(), 'out.onnx');
    const r = cli([input, '--train-len', '8', '-o', out]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, '', 'the default warns about nothing');
    const written = writeThroughOutput(out);
    assert.ok(written.size > before.size, `the output's data file did not grow (${written.size} bytes)`);
    assert.deepEqual({ sha: sha(data), size: fs.statSync(data).size }, before, "a write through the output changed the original's data");
  });

  it('--external-data link warns, in one line and in the report, of what a later write through the output does, and it does', () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx');
    const data = path.join(dir, 'm.onnx.data');
    const size = fs.statSync(data).size;
    const out = path.join(tmpdir(), 'out.onnx');
    const r = cli([input, '--train-len', '8', '-o', out, '--external-data', 'link', '--json']);
    assert.equal(r.code, 0, r.stderr);
    const warning = /^ssmax-patch: warning: --external-data link: m\.onnx\.data beside the output is a hard link to the input's data: a later write through the output .* changes the input's data too; without the option the output gets data of its own\n$/;
    assert.match(r.stderr, warning);
    assert.deepEqual(JSON.parse(r.stdout).warnings.map((w: { code: string }) => w.code), ['external-data-link']);
    writeThroughOutput(out);
    assert.ok(fs.statSync(data).size > size, 'the warning says what a write through the output does: it did not');
  });

  it('a hard link left by an earlier --external-data link is replaced by a copy; the original is never replaced', () => {
    const dir = tmpdir();
    const input = writeExternal(embedded, dir, 'm.onnx');
    const data = path.join(dir, 'm.onnx.data');
    const ino = fs.statSync(data).ino;
    const outDir = tmpdir();
    const out = path.join(outDir, 'out.onnx');
    assert.equal(cli([input, '--train-len', '8', '-o', out, '--external-data', 'link']).code, 0);
    assert.equal(fs.statSync(path.join(outDir, 'm.onnx.data')).ino, ino);
    const again = cli([input, '--train-len', '8', '-o', out, '--force']);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /external data (copied|cloned): /);
    assert.notEqual(fs.statSync(path.join(outDir, 'm.onnx.data')).ino, ino);
    // An output folder that is the input's folder under another name: the data is in place, not replaced by a copy.
    const alias = path.join(tmpdir(), 'alias');
    fs.symlinkSync(dir, alias);
    const inPlace = cli([input, '--train-len', '8', '-o', path.join(alias, 'out.onnx')]);
    assert.equal(inPlace.code, 0, inPlace.stderr);
    assert.match(inPlace.stdout, /external data in place: /);
    assert.equal(fs.statSync(data).ino, ino, "the input's data file was replaced");
    assert.equal(fs.statSync(data).nlink, 1);
  });

  it('on a file system with copy-on-write clones the copy is a clone, its own data all the same', (t) => {
    // SSMAX_TEST_CLONE_DIR: a folder on such a file system (XFS with reflink, Btrfs), when the temp folder is not.
    const where = [process.env.SSMAX_TEST_CLONE_DIR, tmpdir()].find((d) => d && clones(d));
    if (!where) {
      t.skip('no file system with copy-on-write clones here (set SSMAX_TEST_CLONE_DIR to a folder on one)');
      return;
    }
    const dir = fs.mkdtempSync(path.join(where, 'ssmax-clone-'));
    try {
      const input = writeExternal(embedded, dir, 'm.onnx');
      const data = path.join(dir, 'm.onnx.data');
      const before = sha(data);
      fs.mkdirSync(path.join(dir, 'out'));
      const r = cli([input, '--train-len', '8', '-o', path.join(dir, 'out', 'out.onnx')]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /external data cloned: /);
      writeThroughOutput(path.join(dir, 'out', 'out.onnx'));
      assert.equal(sha(data), before);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
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

/** Whether a copy-on-write clone can be made in `dir`. */
function clones(dir: string): boolean {
  const a = path.join(dir, '.clone-probe');
  fs.writeFileSync(a, 'probe');
  try {
    fs.copyFileSync(a, `${a}.clone`, fs.constants.COPYFILE_FICLONE_FORCE);
    return true;
  } catch {
    return false;
  } finally {
    fs.rmSync(a, { force: true });
    fs.rmSync(`${a}.clone`, { force: true });
  }
}

const PYTHON_ONNX = spawnSync('/usr/bin/python3', ['-c', 'import onnx'], { stdio: 'ignore' }).status === 0;

/**
 * What fine-tuning s does (issue 25): the model saved again with its data in the same file, which onnx.save_model
 * appends to. Where Debian's python3-onnx is missing, the same append done here. Returns the data file's status.
 */
function writeThroughOutput(out: string): fs.Stats {
  const data = path.join(path.dirname(out), 'm.onnx.data');
  if (PYTHON_ONNX) {
    const script = 'import onnx, sys\nm = onnx.load(sys.argv[1])\n'
      + "onnx.save_model(m, sys.argv[1], save_as_external_data=True, all_tensors_to_one_file=True, location='m.onnx.data', size_threshold=0)";
    const r = spawnSync('/usr/bin/python3', ['-c', script, out], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
  } else {
    fs.appendFileSync(data, Buffer.alloc(4096, 1));
  }
  return fs.statSync(data);
}

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

