/**
 * A verifying command runs once more as a child with MALLOC_MMAP_THRESHOLD_ set (glibc returns freed buffers over
 * 8 MB, which keeps a verification's peak at its largest run, and maps them in huge pages); other commands, or a user's own setting, run as they are.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { relaunchForVerify } from '../src/cli/relaunch';
import { removeScratch, tmpdir } from './support/io';

after(removeScratch);

describe('relaunch for verification', { skip: process.platform !== 'linux' ? 'glibc only' : false }, () => {
  const dir = tmpdir('ssmax-relaunch-');
  const bin = path.join(dir, 'bin.js');
  const seen = path.join(dir, 'seen.json');
  fs.writeFileSync(bin, `require('fs').writeFileSync(${JSON.stringify(seen)}, JSON.stringify({ t: process.env.MALLOC_MMAP_THRESHOLD_, g: process.env.GLIBC_TUNABLES, args: process.argv.slice(2) })); process.exit(7);\n`);

  it('verify and patch --verify run in a child with the threshold set; its exit code comes back', async () => {
    for (const args of [['verify', 'a.onnx', 'b.onnx'], ['m.onnx', '--train-len', '8', '--verify']]) {
      fs.rmSync(seen, { force: true });
      assert.equal(await relaunchForVerify(bin, args, {}), 7);
      assert.deepEqual(JSON.parse(fs.readFileSync(seen, 'utf8')), { t: '8388608', g: 'glibc.malloc.hugetlb=1', args });
    }
    // calibrate's threshold is lower (its short lengths' caches, 4–8 MB an input).
    await relaunchForVerify(bin, ['calibrate', 'm.onnx', '--train-len', '8'], {});
    assert.equal(JSON.parse(fs.readFileSync(seen, 'utf8')).t, '4194304');
    // The user's own tunables are kept, and so is their own hugetlb choice.
    for (const [given, expected] of [['glibc.malloc.arena_max=2', 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'], ['glibc.malloc.hugetlb=0', 'glibc.malloc.hugetlb=0']]) {
      await relaunchForVerify(bin, ['verify', 'a', 'b'], { GLIBC_TUNABLES: given });
      assert.equal(JSON.parse(fs.readFileSync(seen, 'utf8')).g, expected);
    }
  });

  it('other commands, a threshold the user set, and SSMAX_PATCH_NO_RELAUNCH run in this process', async () => {
    fs.rmSync(seen, { force: true });
    assert.equal(await relaunchForVerify(bin, ['m.onnx', '--train-len', '8'], {}), null);
    assert.equal(await relaunchForVerify(bin, ['revert', 'm.onnx'], {}), null);
    assert.equal(await relaunchForVerify(bin, ['verify', 'a', 'b'], { MALLOC_MMAP_THRESHOLD_: '65536' }), null);
    assert.equal(await relaunchForVerify(bin, ['verify', 'a', 'b'], { SSMAX_PATCH_NO_RELAUNCH: '1' }), null);
    assert.ok(!fs.existsSync(seen), 'no child ran');
  });
});
