/**
 * The corpus regression net (skipped when ../shared/corpus is absent): every real file's outcome, and every
 * fixtures/torchlib model's (torchvision/torchaudio exports), under every option set of test/support/corpus-net.ts
 * must equal the committed test/corpus-expected.json, and whatever the
 * expectations say, no outcome may break the tool's promises: no internal error, no cycle the tool made, every
 * written model runs on onnxruntime to finite outputs, passes onnx.checker wherever its input does, and reverts
 * to the original exactly.
 *
 * A changed outcome fails here until the expectations change in the same commit:
 *   npm run corpus:expect
 * and the commit message says why each changed outcome changed.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { before, describe, it } from 'node:test';
import { corpusFiles, corpusOutcomes, FileOutcome, inCorpus, onnxCheckerAvailable, Outcomes, readExpected } from './support/corpus-net';
import { docPages } from './support/readme';
import { corpusSkip } from './support/ref';

const files = corpusFiles();
const checker = onnxCheckerAvailable();
/** Without python3-onnx the checker's verdicts are left out of the comparison, only where apt cannot install it. */
const aptAvailable = spawnSync('sh', ['-c', 'command -v apt-get'], { encoding: 'utf8' }).status === 0;

const withoutChecker = (o: FileOutcome): FileOutcome => ({
  sets: Object.fromEntries(Object.entries(o.sets).map(([k, v]) => [k, v.output ? { ...v, output: { runs: v.output.runs, revert: v.output.revert } } : v])),
});

describe('the corpus regression net', { skip: files.some(inCorpus) ? false : corpusSkip('.') }, () => {
  let actual: Outcomes = {};
  const expected = readExpected();

  before(async () => {
    actual = await corpusOutcomes(files);
  });

  it('onnx.checker (python3-onnx) is installed where apt can install it', { skip: !checker && !aptAvailable ? 'no python3-onnx and no apt-get: checker verdicts are not compared' : false }, () => {
    assert.ok(checker, 'python3-onnx is missing: apt-get install -y python3-onnx (.ci/run installs it)');
  });

  it('the expectations list exactly the corpus files and the net\'s fixtures', () => assert.deepEqual(Object.keys(expected).sort(), [...files].sort()));

  for (const file of files) {
    it(file, () => {
      const got = checker ? actual[file] : withoutChecker(actual[file]);
      const want = expected[file] && (checker ? expected[file] : withoutChecker(expected[file]));
      assert.deepEqual(got, want, `${file}: the outcome changed. If the change is meant, run \`npm run build && node dist/test/support/corpus-net.js --update\` `
        + 'and say why in the commit message.');
    });
  }

  it('keeps its promises on every file, whatever the expectations say', () => {
    const broken: string[] = [];
    for (const file of files) {
      const o = actual[file];
      for (const [set, r] of Object.entries(o.sets)) {
        const where = `${file} [${set}]`;
        if (r.exit === 3 || r.exit < 0) broken.push(`${where}: exit ${r.exit}: ${r.error}`);
        if (/cycle/.test(r.error ?? '')) broken.push(`${where}: ${r.error}`);
        if (r.exit === 0 && !r.output) broken.push(`${where}: exit 0 but no model written`);
        if (!r.output) continue;
        // The patched model must run wherever the original does (both failing on inputs synthesis cannot know is not the patch's fault).
        if (/^NOT FINITE|^patched does not (load|run)/.test(r.output.runs)) broken.push(`${where}: ${r.output.runs}`);
        if (r.output.revert !== 'exact' && r.output.revert !== 'canonical') broken.push(`${where}: revert ${r.output.revert}`);
        if (checker && o.checker?.startsWith('ok') && !r.output.checker?.startsWith('ok')) broken.push(`${where}: onnx.checker passes the input, not the output: ${r.output.checker}`);
      }
    }
    assert.deepEqual(broken, []);
  });
});

describe('the docs\' corpus tally is the net\'s', () => {
  it('patched, attention refused, without attention, refused otherwise (train-len 64)', () => {
    const sets = Object.entries(readExpected()).filter(([f]) => inCorpus(f)).map(([, o]) => o.sets['train-len 64']);
    const failed = sets.filter((s) => s.exit !== 0);
    const by = (code: string): number => failed.filter((s) => s.code === code).length;
    const count = [sets.length - failed.length, by('attention-refused'), by('no-attention'), failed.length - by('attention-refused') - by('no-attention')];
    const docs = [...docPages().values()].join('\n').replace(/\s+/g, ' ');
    const m = /corpus has \*\*(\d+) patched\*\*, \*\*(\d+) with attention refused[^*]*\*\*[^*]*\*\*(\d+) without attention\*\*[^*]*\*\*(\d+) refused as a patch that can change nothing\*\*/.exec(docs);
    assert.ok(m, 'the docs have no corpus tally line');
    assert.deepEqual(m!.slice(1, 5).map(Number), count);
  });
});
