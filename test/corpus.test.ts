/**
 * Runs the patcher over every ONNX file in fixtures/: it never crashes, answers either with a patch or with one
 * clear reason, and every model it writes loads in onnxruntime. The real files of ../shared/corpus go through the
 * regression net instead (corpus-net.test.ts), which pins each one's outcome.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import * as ort from 'onnxruntime-node';
import { InputError } from '../src/errors';
import { readModel, writeModel } from '../src/io/model-file';
import { findAttentionSoftmax } from '../src/detect/find-attention';
import { patchModel } from '../src/rewrite/patch';
import { FIXTURES, onnxFiles } from './support/ref';
import { removeScratch, tmpdir } from './support/io';

after(removeScratch);

async function loads(file: string): Promise<string | null> {
  try {
    const s = await ort.InferenceSession.create(file, { logSeverityLevel: 4 });
    await s.release();
    return null;
  } catch (e) {
    return String((e as Error).message).split('\n')[0];
  }
}

/** Writes the patched model to a new folder; its external data files, if any, are copied beside it. */
function writeBesideData(model: Parameters<typeof writeModel>[1]): string {
  const out = path.join(tmpdir('ssmax-corpus-'), 'patched.onnx');
  writeModel(out, model);
  return out;
}

for (const [label, dir] of [['fixtures', FIXTURES]] as const) {
  const files = onnxFiles(dir);
  describe(`every model in ${label}`, { skip: files.length === 0 ? `${dir} not present` : false }, () => {
    const tally = { patched: 0, refused: 0, none: 0 };
    for (const file of files) {
      it(path.relative(dir, file), async () => {
        let result;
        try {
          // Some real files list nodes out of topological order (onnxruntime accepts them): sort those.
          result = patchModel(readModel(file), { trainLen: 64 });
        } catch (e) {
          assert.ok(e instanceof InputError, `crashed: ${(e as Error).stack}`);
          assert.doesNotMatch(e.message, /\n/);
          const attention = findAttentionSoftmax(readModel(file)).skipped.some((k) => k.attention);
          if (attention) tally.refused++;
          else tally.none++;
          return;
        }
        tally.patched++;
        assert.ok(result.report.sites.length > 0);
        const originalError = await loads(file);
        if (originalError) return; // onnxruntime cannot run the original either (e.g. preview ops)
        const error = await loads(writeBesideData(result.model));
        assert.equal(error, null, `onnxruntime refused the patched model: ${error}`);
      });
    }
    it('tally', () => {
      process.stdout.write(`# ${label}: ${files.length} models, ${tally.patched} patched, ${tally.refused} with attention refused `
        + `with a reason, ${tally.none} without attention\n`);
      assert.equal(tally.patched + tally.refused + tally.none, files.length);
    });
  });
}
