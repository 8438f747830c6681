/**
 * Ctrl-C and SIGTERM during a write (issue 13): the temporary file is removed, no output appears, the input is
 * untouched, and the exit code is the shell's 128 + signal (130, 143). The child is killed while it is
 * demonstrably mid-write: its temporary file exists. SIGKILL leaves it, for the next run to remove (issue 25).
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { parseModel, writeModel } from '../src/io/model-file';
import { encodeModel } from '../src/io/onnx';
import { tempPath } from '../src/io/sink';
import { BIN, removeScratch, scratchdir, writeSparseModel } from './support/io';

const dirs: string[] = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
  removeScratch();
});

interface Killed { code: number | null; signal: NodeJS.Signals | null; stderr: string; sawTemp: boolean }

/** Starts a patch of `input` into `outDir`, waits until its temporary file exists, sends `signal`. */
function killMidWrite(input: string, outDir: string, signal: NodeJS.Signals): Promise<Killed> {
  const child = spawn(process.execPath, [BIN, input, '--train-len', '8', '-o', path.join(outDir, 'out.onnx')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (b: Buffer) => { stderr += b.toString(); });
  let sawTemp = false;
  const poll = setInterval(() => {
    if (!sawTemp && fs.readdirSync(outDir).some((f) => f.endsWith('.tmp'))) {
      sawTemp = true;
      child.kill(signal);
    }
  }, 1);
  return new Promise((resolve) => child.on('close', (code, sig) => {
    clearInterval(poll);
    resolve({ code, signal: sig, stderr, sawTemp });
  }));
}

describe('signals during a write', () => {
  const dir = scratchdir('ssmax-signals-');
  dirs.push(dir);
  const input = path.join(dir, 'big.onnx');
  // 2 GB of float zeros in a sparse file: no disk, and a write long enough to be caught in the middle.
  writeSparseModel(input, 512 * 2 ** 20);
  const stamp = (): string => { const st = fs.statSync(input); return `${st.size} ${st.mtimeMs} ${st.ino}`; };
  const before = stamp();

  for (const [signal, code] of [['SIGTERM', 143], ['SIGINT', 130]] as const) {
    it(`${signal}: temporary file removed, nothing written, exit ${code}`, async () => {
      const outDir = fs.mkdtempSync(path.join(dir, 'out-'));
      const r = await killMidWrite(input, outDir, signal);
      assert.ok(r.sawTemp, 'the write finished before a temporary file was seen');
      assert.equal(r.signal, null, `killed by ${r.signal} before the handler ran`);
      assert.equal(r.code, code, r.stderr);
      assert.deepEqual(fs.readdirSync(outDir), [], 'files left in the output folder');
      assert.match(r.stderr, new RegExp(`^ssmax-patch: interrupted by ${signal}: removed 1 temporary file\\(s\\)\\n$`));
    });
  }

  it('the input is untouched (size, modification time, inode)', () => assert.equal(stamp(), before));
});

/**
 * kill -9 (a CI timeout, the OOM killer) cannot be handled (issue 25): the temporary file stays, named after the
 * killed process. The next write into that folder removes it and says so; it leaves alone the temporary file of a
 * process still running, one named for another host, and every file that is not one of ours.
 */
describe('SIGKILL during a write, then another run', () => {
  const dir = scratchdir('ssmax-sigkill-');
  dirs.push(dir);
  const input = path.join(dir, 'big.onnx');
  writeSparseModel(input, 512 * 2 ** 20);

  it('the next run into the folder removes the killed run\'s temporary file, says so in one note line, and nothing else', async () => {
    const outDir = fs.mkdtempSync(path.join(dir, 'out-'));
    const killed = await killMidWrite(input, outDir, 'SIGKILL');
    assert.ok(killed.sawTemp, 'the write finished before a temporary file was seen');
    assert.equal(killed.signal, 'SIGKILL');
    const [stray] = fs.readdirSync(outDir);
    const named = /^\.out\.onnx\.data\.ssmax-patch\.(\d+)@[A-Za-z0-9-]+\.[0-9a-f]{8}\.tmp$/.exec(stray ?? '');
    assert.ok(named, `left behind: ${fs.readdirSync(outDir).join(', ')}`);
    const host = stray.split('@')[1].split('.')[0];
    // The test runner's own pid is a process still running: its file must stay, as must a killed process's of
    // another host (a shared folder), an older name without the tool's mark, and files that are not temporary.
    const keep = [`.out.onnx.ssmax-patch.${process.pid}@${host}.0badcafe.tmp`, `.out.onnx.ssmax-patch.${named[1]}@other-host.0badcafe.tmp`,
      `.out.onnx.${named[1]}.0badcafe.tmp`, 'notes.txt', '.out.onnx.tmp'];
    for (const f of keep) fs.writeFileSync(path.join(outDir, f), 'not to be removed');
    const again = spawnSync(process.execPath, [BIN, input, '--train-len', '8', '-o', path.join(outDir, 'out.onnx'), '--json'], { encoding: 'utf8' });
    assert.equal(again.status, 0, again.stderr);
    const report = JSON.parse(again.stdout);
    assert.deepEqual(report.removedTemporaryFiles.map((s: { file: string; pid: number }) => [path.basename(s.file), s.pid]), [[stray, Number(named[1])]]);
    assert.deepEqual(fs.readdirSync(outDir).sort(), [...keep, 'out.onnx', 'out.onnx.data'].sort());
    const text = spawnSync(process.execPath, [BIN, input, '--train-len', '8', '-o', path.join(outDir, 'out.onnx'), '--force'], { encoding: 'utf8' });
    assert.equal(text.status, 0, text.stderr);
    assert.doesNotMatch(text.stdout, /note: removed/, 'nothing left to remove the second time');
    fs.writeFileSync(path.join(outDir, stray), Buffer.alloc(3 << 20));
    const noted = spawnSync(process.execPath, [BIN, input, '--train-len', '8', '-o', path.join(outDir, 'out.onnx'), '--force'], { encoding: 'utf8' });
    assert.equal(noted.status, 0, noted.stderr);
    const notes = noted.stdout.split('\n').filter((l) => l.startsWith('note:'));
    assert.deepEqual(notes, [`note: removed 1 temporary file (3 MB) left by an interrupted run (process ${named[1]}, no longer running): ${path.join(outDir, stray)}`]);
  });

  it('a temporary file named for this very process, but of no write in progress, is an earlier process\'s with the same pid', () => {
    // Containers start their processes with the same few pids: a killed run's pid may be the next run's own.
    const out = fs.mkdtempSync(path.join(dir, 'own-'));
    const stray = tempPath(path.join(out, 'out.onnx'));
    fs.writeFileSync(stray, 'left by a killed process that had this pid');
    const model = parseModel(encodeModel(smallTransformer({ layers: 1, d: 16, heads: 2, ff: 16, vocab: 20, tmax: 8 })), 'm.onnx');
    const report = writeModel(path.join(out, 'out.onnx'), model);
    assert.deepEqual(report.removedTemporaryFiles.map((s) => [s.file, s.pid]), [[stray, process.pid]]);
    assert.deepEqual(fs.readdirSync(out), ['out.onnx']);
  });
});

/**
 * Ctrl-C during a verification (issue 24): onnxruntime-node runs a session on the JavaScript thread, so the
 * verifying process cannot handle the signal until the run ends. The relaunching parent says it is stopping at
 * once and ends the child within half a second; the child's temporary folders (in a folder of the parent's) go.
 */
describe('signals during a verification', () => {
  const dir = scratchdir('ssmax-signals-verify-');
  dirs.push(dir);
  const input = path.join(dir, 'decoder.onnx');
  // One 4096-token run of 8 layers takes seconds on this machine (the whole verification about 10 s): the signal
  // arrives while onnxruntime holds the thread.
  writeModel(input, parseModel(encodeModel(smallTransformer({ layers: 8, d: 64, heads: 4, ff: 64, vocab: 50, tmax: 4096 })), 'decoder.onnx'));

  it('SIGINT: "stopping ..." at once, exit 130 within a second, no temporary folder left, nothing written', async () => {
    const tmp = fs.mkdtempSync(path.join(dir, 'tmp-'));
    const out = path.join(dir, 'out.onnx');
    const child = spawn(process.execPath, [BIN, input, '--train-len', '64', '--verify', '--lengths', '4096', '--max-len', '4096', '-o', out],
      { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, TMPDIR: tmp } });
    let stderr = '';
    child.stderr.on('data', (b: Buffer) => { stderr += b.toString(); });
    // Listened for from the start: a child that ends before the signal must fail the test, not leave it waiting.
    const closed = new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
    // Something of the child's appears in the parent's folder once onnxruntime has started (its sessions' files,
    // or onnxruntime's own): a second later the child is inside a run of 4096 tokens, which takes seconds.
    const started = await new Promise<boolean>((resolve) => {
      const poll = setInterval(() => {
        // A folder can go between the two listings (a child that ends): it then holds nothing.
        const inside = fs.readdirSync(tmp).flatMap((d) => { try { return fs.readdirSync(path.join(tmp, d)); } catch { return []; } });
        if (inside.length || child.exitCode !== null) { clearInterval(poll); setTimeout(() => resolve(inside.length > 0 && child.exitCode === null), 1500); }
      }, 5);
    });
    const sent = Date.now();
    child.kill('SIGINT');
    const code = await closed;
    const took = Date.now() - sent;
    assert.ok(started, `the verification ended before it could be interrupted: ${stderr}`);
    assert.equal(code, 130, stderr);
    assert.ok(took < 1000, `stopped ${took} ms after the signal`);
    assert.match(stderr, /^ssmax-patch: stopping \.\.\.\n/);
    assert.match(stderr, /interrupted by SIGINT: onnxruntime stopped mid-run/);
    assert.deepEqual(fs.readdirSync(tmp), [], 'temporary folders left');
    assert.ok(!fs.existsSync(out));
  });
});
