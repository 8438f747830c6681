/**
 * Commands return results (issue 31): a command's outcome is a plain value, and present() alone maps it to the JSON
 * document, the text lines and the exit code. The CLI's printed document is present()'s, and the failure's
 * document is made from what the command had established (Run.known) by the same mapping.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { documentOf, judge, present, PatchOutcome } from '../src/cli/outcome';
import { patchCommand } from '../src/cli/patch-command';
import { Run } from '../src/cli/run';
import type { VerifyReport } from '../src/verify/verify';
import { encodeModel, readModel, writeModel } from '../src/io/model-file';
import { analyseModel } from '../src/analysis/analyse';
import { patchModel } from '../src/rewrite/patch';
import { recordedLabel, recordedNode } from '../src/rewrite/record';
import { classifierOnly } from './support/build';
import { cli, removeScratch, tmpdir } from './support/io';
import { TORCH } from './support/ref';

after(removeScratch);

/** Only the fields judge() reads: the checks' statuses and the strict gate's inputs. */
function report(statuses: string[], o: { strictMode: boolean; unverified?: string[] }): VerifyReport {
  const checks = statuses.map((status, i) => ({ id: 'parity', name: `check ${i}`, status, summary: `summary ${i}` }));
  const unverified = o.unverified ?? [];
  const passed = statuses.every((s) => s !== 'FAILED') && (!o.strictMode || unverified.length === 0);
  return { checks, strictMode: o.strictMode, unverified, passed } as unknown as VerifyReport;
}

describe('judge: a verification\'s verdict as a value', () => {
  it('a failed check fails it, with --strict\'s record listing the failure first', () => {
    const v = judge(report(['PASSED', 'FAILED'], { strictMode: true, unverified: ['probe: L0 not looked at'] }), ': output not written');
    assert.deepEqual(v.failure, { code: 'verify-failed', message: 'verification FAILED: output not written' });
    assert.deepEqual(v.strict, { passed: false, failures: ['check 1 FAILED: summary 1', 'probe: L0 not looked at'] });
  });

  it('--strict fails on what was left unverified, naming the first and counting the rest', () => {
    const v = judge(report(['PASSED', 'SKIPPED'], { strictMode: true, unverified: ['a skipped', 'b refused'] }), '');
    assert.deepEqual(v.failure, { code: 'strict-failed', message: '--strict: a skipped and 1 more' });
  });

  it('without --strict a skip passes and no strict record is made', () => {
    const v = judge(report(['PASSED', 'SKIPPED'], { strictMode: false, unverified: ['a skipped'] }), '');
    assert.deepEqual(v, { strict: undefined });
    const shown = documentOf({ command: 'verify', original: 'a', patched: 'b', verdict: v });
    assert.equal(shown.exitCode, 0);
    assert.equal(shown.status, 'ok');
  });

  it('a failure sets the document\'s status and exit code (1)', () => {
    const v = judge(report(['FAILED'], { strictMode: false }), '');
    const doc = documentOf({ command: 'verify', original: 'a', patched: 'b', verdict: v });
    assert.equal(doc.exitCode, 1);
    assert.equal(doc.status, 'failed');
    assert.equal(doc.error?.code, 'verify-failed');
  });
});

describe('patch: the command returns its outcome, the CLI prints present()\'s document', () => {
  const dir = tmpdir('ssmax-outcome-');
  const model = path.join(dir, 'llama.onnx');
  fs.copyFileSync(path.join(TORCH, 'llama_gqa.onnx'), model);

  it('returns sites, warnings and no write for --dry-run, printing nothing itself', async () => {
    const run = new Run('patch', true);
    const write = process.stdout.write;
    let printed = '';
    process.stdout.write = ((s: string) => { printed += s; return true; }) as typeof process.stdout.write;
    let outcome: PatchOutcome | null;
    try {
      outcome = await patchCommand([model], { n: 'auto', trainLen: '64', dryRun: true, quiet: true }, run);
    } finally {
      process.stdout.write = write;
    }
    assert.equal(printed, '');
    assert.ok(outcome);
    assert.equal(outcome.written, null);
    assert.ok(outcome.patch.sites.length >= 2, `sites: ${outcome.patch.sites.length}`);
    const shown = present(outcome);
    assert.equal(shown.exitCode, 0);
    assert.ok(shown.lines.includes('nothing written (--dry-run)'), shown.lines.join('\n'));
    // The same document the CLI prints, once the paths it holds are the same.
    const r = cli([model, '--train-len', '64', '--dry-run', '--json', '--quiet']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), JSON.parse(JSON.stringify(shown.doc)));
  });

  it('a refusal part-way reports what was known: input, target and the skipped nodes', async () => {
    const classifier = path.join(dir, 'cls.onnx');
    writeModel(classifier, classifierOnly());
    const r = cli([classifier, '--train-len', '64', '--json']);
    assert.equal(r.code, 4, r.stderr);
    const doc = JSON.parse(r.stdout);
    assert.equal(doc.input, classifier);
    assert.equal(doc.target, path.join(dir, 'cls.ssmax.onnx'));
    assert.equal(doc.error.code, 'no-attention');
    assert.ok(doc.skipped.length >= 1, 'the classifier\'s Softmax is listed with its reason');
    assert.equal(fs.existsSync(doc.target), false);
  });
});

describe('the patch record keys a site by node, never by its display label', () => {
  it('a site inside a function records its call apart; a record written before is read the same', () => {
    const base = { layer: 0, n: 'causal' };
    assert.deepEqual(recordedNode({ ...base, softmax: 'Softmax_3', call: 'block_0' }), { call: 'block_0', node: 'Softmax_3' });
    assert.deepEqual(recordedNode({ ...base, softmax: 'block_0 → Softmax_3' }), { call: 'block_0', node: 'Softmax_3' });
    assert.deepEqual(recordedNode({ ...base, softmax: '/attn/Softmax' }), { node: '/attn/Softmax' });
    assert.equal(recordedLabel({ ...base, softmax: 'Softmax_3', call: 'block_0' }), 'block_0 → Softmax_3');
  });
});

describe('a given analysis patches as its own would (every call of a function shares one patched body)', () => {
  it('attn_functions: the same model bytes with and without a given analysis, and the CLI writes it', () => {
    const file = path.join(TORCH, 'attn_functions.onnx');
    const m = readModel(file);
    const own = encodeModel(patchModel(m, { trainLen: 64 }).model);
    const given = encodeModel(patchModel(m, { trainLen: 64, analysis: analyseModel(m) }).model);
    assert.ok(Buffer.from(own).equals(Buffer.from(given)), 'the patch with a given analysis differs (a body patched once per call)');
    const out = path.join(tmpdir('ssmax-fn-'), 'fn.ssmax.onnx');
    const r = cli([file, '--train-len', '64', '-o', out]);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(fs.existsSync(out));
  });
});
