/**
 * patch → revert over every model the tool patches (fixtures and ../shared/corpus when present): replaying the
 * journal gives back the original model in every scope — nodes (in their original order, also where the file
 * listed them out of topological order), initializers, inputs, outputs, value_info, functions, opset imports and
 * metadata — byte for byte against the input as read, and against the file itself when it is canonically encoded.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { parseModel, readModel, serializeModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { CORPUS, FIXTURES, onnxFiles } from './support/ref';

for (const [label, dir] of [['fixtures', FIXTURES], ['corpus', CORPUS]] as const) {
  const files = onnxFiles(dir);
  describe(`patch then revert, every model in ${label}`, { skip: files.length === 0 ? `${dir} not present` : false }, () => {
    let reverted = 0;
    for (const file of files) {
      it(path.relative(dir, file), () => {
        let patched;
        try {
          patched = patchModel(readModel(file), { trainLen: 64 }).model;
        } catch (e) {
          assert.ok(e instanceof InputError, `crashed: ${(e as Error).stack}`);
          return; // refused: nothing to revert
        }
        // Through bytes, as a user's file would go: the journal lives in the written record.
        const bytes = serializeModel(patched);
        const { model, report } = revertModel(parseModel(bytes, 'patched'));
        assert.equal(report.method, 'journal', report.note);
        assert.equal(readRecord(model), null);
        const canonical = Buffer.from(serializeModel(readModel(file)));
        const back = Buffer.from(serializeModel(model));
        assert.ok(back.equals(canonical), 'the reverted model differs from the original');
        if (canonical.equals(fs.readFileSync(file))) assert.ok(back.equals(fs.readFileSync(file)), 'differs from the file');
        reverted++;
      });
    }
    it('reverted at least one model', () => assert.ok(reverted > 0));
  });
}
