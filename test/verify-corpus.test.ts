/**
 * Wiring parity and the semantic probe over every model of ../shared/corpus the patcher accepts (skipped when
 * the corpus is absent): each verifies with every site probed, or stops with one input error naming what to
 * give; none fails or crashes.
 */
import assert from 'node:assert/strict';
import { CORPUS } from './support/ref';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { readModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { readRecord } from '../src/rewrite/record';
import { verifyPatch } from '../src/verify/verify';

const files = fs.existsSync(CORPUS)
  ? fs.readdirSync(CORPUS, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.onnx')).sort() : [];

describe('verify over the corpus', { skip: files.length === 0 ? `${CORPUS} not present` : false }, () => {
  for (const file of files) {
    it(file, async () => {
      const original = readModel(path.join(CORPUS, file));
      let patched;
      try {
        patched = patchModel(original, { trainLen: 16 }).model;
      } catch {
        return; // refused with a reason: covered by corpus.test.ts
      }
      try {
        const r = await verifyPatch(original, patched, { checks: ['wiring', 'probe'] });
        assert.equal(r.passed, true, r.checks.map((c) => `${c.status} ${c.name}: ${c.summary}`).join('\n'));
        // Every site is probed: plain ops, fused kernels (their query), nested graphs, and operators the patch
        // expanded into their definition (their projected query, or their own capped logits) (issue 9).
        const probe = r.checks.find((c) => c.id === 'probe')!;
        const sites = readRecord(patched)!.sites;
        assert.equal(probe.status, 'PASSED', probe.summary);
        assert.deepEqual(probe.unchecked ?? [], []);
        assert.equal((probe.sites ?? []).length, sites.length);
      } catch (e) {
        assert.ok(e instanceof InputError, `crashed: ${(e as Error).stack}`);
        assert.match(e.cliMessage, /--input|--dim|external data/i, 'the error says which option to use, or names the external data');
        assert.doesNotMatch(e.message, /\n/);
      }
    });
  }
});
