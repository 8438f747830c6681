/** Progress on stderr: shown for jobs over 100 MB on a terminal; hidden with --quiet and when stderr is not a TTY. */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { terminalProgress } from '../src/io/progress';
import { BIN, cli, scratchdir, writeSparseModel } from './support/io';

function fakeTTY(isTTY: boolean): { isTTY: boolean; text: string; write(s: string): boolean } {
  return { isTTY, text: '', write(s: string) { this.text += s; return true; } };
}

describe('progress', () => {
  it('draws percent and megabytes on a terminal, and ends the line', () => {
    const stream = fakeTTY(true);
    const p = terminalProgress({ stream, interval: 0 })!;
    p.start('writing out.onnx', 400 * 2 ** 20);
    p.advance(100 * 2 ** 20);
    p.advance(100 * 2 ** 20);
    p.end();
    assert.match(stream.text, /\rssmax-patch: writing out\.onnx 25% \(100 of 400 MB\)/);
    assert.match(stream.text, /50% \(200 of 400 MB\)\n$/);
  });

  it('stays silent below 100 MB, with --quiet, and when stderr is not a terminal', () => {
    const small = fakeTTY(true);
    const p = terminalProgress({ stream: small, interval: 0 })!;
    p.start('writing', 50 * 2 ** 20);
    p.advance(50 * 2 ** 20);
    p.end();
    assert.equal(small.text, '');
    assert.equal(terminalProgress({ stream: fakeTTY(true), quiet: true }), null);
    assert.equal(terminalProgress({ stream: fakeTTY(false) }), null);
  });

  it('the CLI shows progress for a 200 MB model on a terminal only, and never with --quiet', (t) => {
    if (spawnSync('script', ['--version']).status !== 0) {
      t.skip('no `script` to run the CLI on a pseudo-terminal');
      return;
    }
    const dir = scratchdir('ssmax-progress-');
    try {
      const input = path.join(dir, 'big.onnx');
      writeSparseModel(input, 50 * 2 ** 20);
      const onTTY = (extra: string): string => {
        const cmd = [process.execPath, BIN, input, '--train-len', '8', '-o', path.join(dir, 'out.onnx'), '--force', extra].join(' ');
        const r = spawnSync('script', ['-q', '-e', '-c', cmd, '/dev/null'], { encoding: 'utf8' });
        assert.equal(r.status, 0, r.stdout);
        return r.stdout;
      };
      assert.match(onTTY(''), /ssmax-patch: writing out\.onnx 100% \(200 of 200 MB\)/);
      assert.doesNotMatch(onTTY('--quiet'), /ssmax-patch: writing/);
      const piped = cli([input, '--train-len', '8', '-o', path.join(dir, 'out.onnx'), '--force']);
      assert.equal(piped.code, 0, piped.stderr);
      assert.equal(piped.stderr, '');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
