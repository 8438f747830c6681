/**
 * docs/recipes.md's recipes (issue 13), each run as written on a model of its kind (test/support/recipes.ts), with
 * this checkout's CLI: it runs without the npm registry, where test/install.test.ts runs them from the packed
 * package. Also the README's command for a clone, run twice.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { corpusSkip } from './support/ref';
import { removeScratch, tmpdir } from './support/io';
import { blocks, REPO, runShell, section } from './support/readme';
import { assertRecipeOutput, RECIPES } from './support/recipes';

after(removeScratch);

describe('docs/recipes.md, with this checkout\'s CLI', () => {
  for (const [heading, recipe] of Object.entries(RECIPES)) {
    it(`${heading}: prints the lines the recipe shows and writes what it says`, { skip: corpusSkip(...recipe.corpus) }, async () => {
      const dir = tmpdir('ssmax-recipe-');
      recipe.setup(dir);
      assertRecipeOutput(heading, runShell(blocks(section(heading), 'sh')[0], dir));
      await recipe.check(dir);
    });
  }

  it("the README's command for a clone can be run twice", () => {
    const [sh] = blocks(section('From a clone of this repository'), 'sh');
    const command = sh.split('\n')[0].replace(/^npm ci && npm run build && /, '');
    assert.match(command, /^npx ssmax-patch fixtures\/torch\/gpt2_past\.onnx .* --force$/);
    const dir = tmpdir('ssmax-first-');
    // The same command with its output in a scratch folder instead of /tmp.
    const local = command.replace('/tmp/gpt2_past.ssmax.onnx', path.join(dir, 'gpt2_past.ssmax.onnx'));
    for (const run of [1, 2]) {
      const r = runShell(local, REPO);
      assert.equal(r.code, 0, `run ${run}: ${r.stderr}`);
      assert.match(r.stdout, /verify: PASSED/);
    }
  });
});
