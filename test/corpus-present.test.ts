/**
 * Whether the corpus tests ran (issue 35). Without the corpus (test/support/ref.ts: $SSMAX_CORPUS, else
 * ../shared/corpus beside the repository) every corpus test skips; this file says so in one line, and under CI=true
 * fails instead, so that a CI job cannot pass without its regression net.
 */
import assert from 'node:assert/strict';
import { it } from 'node:test';
import { CORPUS, CORPUS_HINT, onnxFiles } from './support/ref';

const models = onnxFiles(CORPUS).length;
const present = models > 0;
const ci = process.env.CI === 'true';
const absent = `no corpus (no .onnx file) at ${CORPUS}: the regression net and the other corpus tests were skipped (${CORPUS_HINT})`;

if (present || ci) {
  it(`the corpus is present at ${CORPUS} (${models} models)${ci ? '; CI=true requires it' : ''}`, () => {
    assert.ok(present, `CI=true: ${absent}`);
  });
} else {
  it('the corpus tests', { skip: absent }, () => {});
}
