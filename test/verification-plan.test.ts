/**
 * The verification plan is what verification runs: `verify --dry-run` prints the runs verifyPatch then executes
 * (the same ids, in the same order, each read by the same checks), runs nothing, and names the graphs lifted out of
 * an operator as subjects of their own.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { readModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { planVerification } from '../src/verify/verification-plan';
import { verifyPatch } from '../src/verify/verify';
import { cli, removeScratch, tmpdir } from './support/io';
import { CORPUS, TORCH } from './support/ref';

describe('the verification plan', () => {
  after(removeScratch);
  const original = readModel(path.join(TORCH, 'gpt2_past.onnx'));
  const { model: patched } = patchModel(original, { trainLen: 64 });

  it('lists exactly the runs verifyPatch executes, in its order', async () => {
    const plan = planVerification(original, patched, { trainLen: 64 });
    assert.equal(plan.subjects.length, 1);
    const [main] = plan.subjects;
    const report = await verifyPatch(original, patched, { trainLen: 64 });
    assert.deepEqual(main.runs.map((r) => r.id), report.runs.map((r) => r.id));
    assert.deepEqual(main.sweep, report.sweep);
    // Sharpness reads the original and the patched model on every sweep run, and on nothing else.
    for (const r of main.runs) {
      const sharp = r.reads.filter((x) => x.checks.includes('sharpness')).map((x) => x.session);
      assert.deepEqual(sharp, r.kind === 'sweep' ? ['original', 'patched'] : [], r.id);
    }
    // The retrofit run at n = L = 64 is planned, with its 64 keys.
    assert.ok(main.runs.some((r) => r.kind === 'retrofit' && r.keys === 64), JSON.stringify(main.runs.map((r) => [r.id, r.keys])));
  });

  it('checks not selected read nothing', () => {
    const plan = planVerification(original, patched, { trainLen: 64, checks: ['wiring'] });
    const read = new Set(plan.subjects[0].runs.flatMap((r) => r.reads.flatMap((x) => x.checks)));
    assert.deepEqual([...read], ['wiring']);
  });

  const beam = path.join(CORPUS, 'ort_tiny_gpt2_beamsearch.onnx');
  it('a BeamSearch decoder is a subject of its own', { skip: fs.existsSync(beam) ? false : `${beam} not present` }, () => {
    const m = readModel(beam);
    const plan = planVerification(m, patchModel(m, { trainLen: 64 }).model, { trainLen: 64 });
    assert.equal(plan.subjects.length, 2);
    assert.match(plan.subjects[1].subject, /graph of BeamSearch .*run on its own/);
    assert.ok(plan.subjects[1].runs.length > 0);
  });

  it('verify --dry-run prints the plan, runs nothing, and takes no option that writes', () => {
    const dir = tmpdir('ssmax-plan-');
    const input = path.join(TORCH, 'gpt2_past.onnx');
    const out = path.join(dir, 'p.onnx');
    assert.equal(cli([input, '--train-len', '64', '-o', out]).code, 0);
    const r = cli(['verify', input, out, '--dry-run', '--json']);
    assert.equal(r.code, 0, r.stderr);
    const doc = JSON.parse(r.stdout) as { plan: { subjects: { runs: unknown[] }[] }; checks?: unknown };
    assert.equal(doc.checks, undefined, 'no check ran');
    assert.equal(doc.plan.subjects[0].runs.length, planVerification(original, readModel(out), {}).subjects[0].runs.length);
    const text = cli(['verify', input, out, '--dry-run']);
    assert.match(text.stdout, /^verify --dry-run: nothing is run\nthe main pair: L = 64 /);
    const bad = cli(['verify', input, out, '--dry-run', '--strict']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--dry-run runs nothing, so it takes no --strict/);
  });
});
