/**
 * patch → revert over every model the tool patches (fixtures and ../shared/corpus when present): replaying the
 * journal gives back the original model in every scope — nodes, initializers, inputs, outputs, value_info,
 * functions and metadata — byte for byte against the input as read (sorted first where the file needs it).
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { parseModel, readModel, serializeModel } from '../src/io/model-file';
import { patchModel, prepareGraph } from '../src/rewrite/patch';
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
          patched = patchModel(readModel(file), { trainLen: 64, sortNodes: true }).model;
        } catch (e) {
          assert.ok(e instanceof InputError, `crashed: ${(e as Error).stack}`);
          return; // refused: nothing to revert
        }
        // Through bytes, as a user's file would go: the journal lives in the written record.
        const bytes = serializeModel(patched);
        const { model, report } = revertModel(parseModel(bytes, 'patched'));
        assert.equal(report.method, 'journal', report.note);
        assert.equal(readRecord(model), null);
        const original = readModel(file);
        const canonical = serializeModel(original);
        prepareGraph(original.graph!, true);
        const back = Buffer.from(serializeModel(model));
        assert.ok(back.equals(Buffer.from(serializeModel(original))), 'the reverted model differs from the original');
        if (Buffer.from(canonical).equals(fs.readFileSync(file)) && !sorted(file)) assert.ok(back.equals(fs.readFileSync(file)), 'differs from the file');
        reverted++;
      });
    }
    it('reverted at least one model', () => assert.ok(reverted > 0));
  });
}

/** True when the file's graph needed sorting (then the reverted model is the sorted original). */
function sorted(file: string): boolean {
  const m = readModel(file);
  const before = m.graph!.node.map((n) => n.output.join());
  prepareGraph(m.graph!, true);
  return before.join('|') !== m.graph!.node.map((n) => n.output.join()).join('|');
}
