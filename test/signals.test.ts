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
import { encodeModel, parseModel, writeModel } from '../src/io/model-file';

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

  /**
   * The relaunch with a stand-in for the verifying child: it makes a file in its temporary folder, says so, and
   * then holds its thread as an onnxruntime run does (its own SIGINT handler cannot run), or lets the handler run.
   * Saying so is the moment to send the signal: the test knows the child is inside what it holds.
   */
  async function interruptStandIn(holds: boolean): Promise<{ code: number | null; stderr: string; took: number; tmp: string }> {
    const standIn = path.join(dir, `stand-in-${holds ? 'holds' : 'yields'}.js`);
    fs.writeFileSync(standIn, [
      "const fs = require('node:fs'), os = require('node:os'), path = require('node:path');",
      "process.on('SIGINT', () => { process.stderr.write('stand-in: handled SIGINT\\n'); process.exit(130); });",
      "fs.writeFileSync(path.join(os.tmpdir(), 'session-file'), 'x');",
      "process.stderr.write('stand-in: ready\\n');",
      holds ? 'const end = Date.now() + 60000; while (Date.now() < end);' : 'setTimeout(() => process.exit(0), 60000);',
    ].join('\n'));
    const driver = path.join(dir, 'driver.js');
    fs.writeFileSync(driver, `require(${JSON.stringify(path.resolve(__dirname, '../src/cli/relaunch.js'))})
      .relaunchForVerify(process.argv[2], ['--verify', '--dry-run', 'model.onnx']).then((c) => process.exit(c ?? 99));`);
    const tmp = fs.mkdtempSync(path.join(dir, 'tmp-'));
    const child = spawn(process.execPath, [driver, standIn], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, TMPDIR: tmp } });
    let stderr = '';
    let sent = 0;
    child.stderr.on('data', (b: Buffer) => {
      stderr += b.toString();
      if (!sent && stderr.includes('stand-in: ready\n')) { sent = Date.now(); child.kill('SIGINT'); }
    });
    const code = await new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
    return { code, stderr, took: Date.now() - sent, tmp };
  }

  it('a child holding its thread: "stopping ..." at once, killed after the grace time, exit 130, its temporary folder removed', async () => {
    const r = await interruptStandIn(true);
    assert.equal(r.code, 130, r.stderr);
    assert.ok(r.took >= 450 && r.took < 1500, `stopped ${r.took} ms after the signal (the grace time is 500 ms)`);
    assert.equal(r.stderr, 'stand-in: ready\nssmax-patch: stopping ...\nssmax-patch: interrupted by SIGINT: onnxruntime stopped mid-run, its temporary files removed\n');
    assert.deepEqual(fs.readdirSync(r.tmp), [], 'temporary folders left');
  });

  it('a child whose handler runs: it stops by itself, its own exit code and words pass through, no kill', async () => {
    const r = await interruptStandIn(false);
    assert.equal(r.code, 130, r.stderr);
    assert.ok(r.took < 450, `stopped ${r.took} ms after the signal: killed rather than stopped by itself`);
    // Two processes write to one pipe: the child's line may come before or after the parent's.
    assert.deepEqual(r.stderr.split('\n').sort(), ['', 'ssmax-patch: stopping ...', 'stand-in: handled SIGINT', 'stand-in: ready']);
    assert.deepEqual(fs.readdirSync(r.tmp), [], 'temporary folders left');
  });

  /**
   * The race of issue 33: the signal comes after the child has written its output. A stand-in child runs the real
   * signal handling (dist's signals.js) and the real write, says so on stderr (the moment the test sends SIGINT),
   * then does what `tail` says: lets its handler run and finishes (`finish`), holds its thread until the test
   * creates a file (`hold`: past the parent's grace time only if the parent kills it), or has already settled its
   * exit code and removed its handlers (`exiting`: the signal then ends it by default).
   */
  async function interruptAfterWrite(tail: 'finish' | 'hold' | 'exiting'): Promise<{ code: number | null; stderr: string; out: string }> {
    const model = path.join(dir, 'small.onnx');
    if (!fs.existsSync(model)) writeModel(model, parseModel(encodeModel(smallTransformer({ layers: 1, d: 16, heads: 2, ff: 16, vocab: 20, tmax: 8 })), 'small.onnx'));
    const out = path.join(fs.mkdtempSync(path.join(dir, `after-${tail}-`)), 'out.onnx');
    const go = `${out}.go`;
    const dist = (m: string): string => JSON.stringify(path.resolve(__dirname, '../src', m));
    const standIn = path.join(dir, `stand-in-after-${tail}.js`);
    fs.writeFileSync(standIn, [
      `const fs = require('node:fs'); const stop = require(${dist('cli/signals.js')}).cleanUpOnSignals();`,
      `const m = require(${dist('io/model-file.js')}); m.writeModel(${JSON.stringify(out)}, m.readModel(${JSON.stringify(model)}));`,
      tail === 'exiting' ? 'stop(0);' : '',
      "process.stderr.write('stand-in: wrote\\n');",
      {
        // The timer keeps it alive until the signal, as the command's remaining work would.
        finish: "const t = setTimeout(() => process.exit(5), 60000); process.on('SIGINT', () => setImmediate(() => { clearTimeout(t); stop(0); process.exit(0); }));",
        hold: `while (!fs.existsSync(${JSON.stringify(go)})); stop(0); process.exit(0);`,
        exiting: 'const end = Date.now() + 60000; while (Date.now() < end);',
      }[tail],
    ].join('\n'));
    const driver = path.join(dir, 'driver.js');
    fs.writeFileSync(driver, `require(${dist('cli/relaunch.js')})
      .relaunchForVerify(process.argv[2], ['--verify', '--dry-run', 'model.onnx']).then((c) => process.exit(c ?? 99));`);
    const child = spawn(process.execPath, [driver, standIn], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (b: Buffer) => {
      const had = stderr;
      stderr += b.toString();
      if (!had.includes('stand-in: wrote\n') && stderr.includes('stand-in: wrote\n')) child.kill('SIGINT');
      if (/finishing with its own outcome/.test(stderr)) fs.writeFileSync(go, '');
    });
    const code = await new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
    return { code, stderr, out };
  }

  it('SIGINT after the output is written: the handler lets the command finish, its own exit code (0), not 130', async () => {
    const r = await interruptAfterWrite('finish');
    assert.equal(r.code, 0, r.stderr);
    assert.ok(fs.existsSync(r.out));
    assert.match(r.stderr, new RegExp(`^ssmax-patch: SIGINT after ${r.out.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} was written: finishing with its own outcome$`, 'm'));
    assert.doesNotMatch(r.stderr, /interrupted by/);
  });

  it('SIGINT after the output is written, the child busy past the grace time: not killed, its own exit code', async () => {
    const r = await interruptAfterWrite('hold');
    assert.equal(r.code, 0, r.stderr);
    assert.ok(fs.existsSync(r.out));
    assert.doesNotMatch(r.stderr, /stopping \.\.\.|interrupted by/);
  });

  it('SIGINT as a child that wrote its output exits (its handlers gone): the exit code it settled, not 130', async () => {
    const r = await interruptAfterWrite('exiting');
    assert.equal(r.code, 0, r.stderr);
    assert.ok(fs.existsSync(r.out));
  });

  it('a real verification: SIGINT stops it within a second, exit 130, no temporary folder left, nothing written', async () => {
    const input = path.join(dir, 'decoder.onnx');
    // One 4096-token run of 8 layers takes seconds here (the whole verification 17 s): the signal, sent 2.5 s after
    // the child starts, arrives during a run or between two; either way the user sees the same stop.
    writeModel(input, parseModel(encodeModel(smallTransformer({ layers: 8, d: 64, heads: 4, ff: 64, vocab: 50, tmax: 4096 })), 'decoder.onnx'));
    const tmp = fs.mkdtempSync(path.join(dir, 'tmp-'));
    const out = path.join(dir, 'out.onnx');
    const child = spawn(process.execPath, [BIN, input, '--train-len', '64', '--verify', '--lengths', '4096', '--max-len', '4096', '-o', out],
      { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, TMPDIR: tmp } });
    let stderr = '';
    child.stderr.on('data', (b: Buffer) => { stderr += b.toString(); });
    const closed = new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
    // The parent makes its folder for the child just before starting it.
    await new Promise<void>((resolve) => {
      const poll = setInterval(() => { if (fs.readdirSync(tmp).length || child.exitCode !== null) { clearInterval(poll); resolve(); } }, 5);
    });
    await new Promise((resolve) => setTimeout(resolve, 2500));
    assert.equal(child.exitCode, null, `the verification ended before it could be interrupted: ${stderr}`);
    const sent = Date.now();
    child.kill('SIGINT');
    const code = await closed;
    const took = Date.now() - sent;
    assert.equal(code, 130, stderr);
    assert.ok(took < 1000, `stopped ${took} ms after the signal`);
    // Stopped mid-run, the parent says so after its first line; stopped between runs, the child's line (which may
    // come first: two processes, one pipe) says what it removed.
    assert.deepEqual(stderr.split('\n').filter((l) => l.startsWith('ssmax-patch: stopping')), ['ssmax-patch: stopping ...'], stderr);
    assert.match(stderr, /^ssmax-patch: interrupted by SIGINT: (onnxruntime stopped mid-run, its temporary files removed|no temporary file left.*)$/m);
    assert.deepEqual(fs.readdirSync(tmp), [], 'temporary folders left');
    assert.ok(!fs.existsSync(out));
  });
});
