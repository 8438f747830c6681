/**
 * Ctrl-C and SIGTERM during a write (issue 13): the temporary file is removed, no output appears, the input is
 * untouched, and the exit code is the shell's 128 + signal (130, 143). The child is killed while it is
 * demonstrably mid-write: its temporary file exists.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
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
