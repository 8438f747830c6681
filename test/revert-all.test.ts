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
import { readExpected } from './support/corpus-net';
import { CORPUS, corpusSkip, FIXTURES, onnxFiles } from './support/ref';

/**
 * The models that are refused, with the reason: every other model must patch and revert. The fixtures' list is
 * here; the corpus's is its regression net's (test/corpus-expected.json, option set `train-len 64`).
 */
const FIXTURE_REFUSALS: Record<string, RegExp> = {};

function expectedRefusals(label: 'fixtures' | 'corpus'): Record<string, RegExp> {
  if (label === 'fixtures') return FIXTURE_REFUSALS;
  const out: Record<string, RegExp> = {};
  for (const [file, o] of Object.entries(readExpected())) {
    const set = o.sets['train-len 64'];
    if (set.exit !== 0) out[file] = new RegExp(escape(set.error!.replace(/ \(see ssmax-patch patch --help\)$/, '')));
  }
  return out;
}

const escape = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

for (const [label, dir] of [['fixtures', FIXTURES], ['corpus', CORPUS]] as const) {
  const files = onnxFiles(dir);
  describe(`patch then revert, every model in ${label}`, { skip: files.length === 0 ? (label === 'corpus' ? corpusSkip('.') : `${dir} not present`) : false }, () => {
    const expected = expectedRefusals(label);
    const refused = new Map<string, string>();
    for (const file of files) {
      const name = path.relative(dir, file);
      it(name, () => {
        let patched;
        try {
          patched = patchModel(readModel(file), { trainLen: 64 }).model;
        } catch (e) {
          assert.ok(e instanceof InputError, `crashed: ${(e as Error).stack}`);
          refused.set(name, e.message);
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
      });
    }
    it('refuses exactly the expected models, each for its reason', () => {
      assert.deepEqual([...refused.keys()].sort(), Object.keys(expected).sort());
      for (const [name, reason] of refused) assert.match(reason, expected[name], name);
    });
  });
}
