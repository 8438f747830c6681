/**
 * `ssmax-patch verify` and `--verify` as CI meets them: exit codes 0 / 1 / 2, one line per check, the JSON
 * report and the SVG plot written (also when a check fails), one-line errors with nothing written.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { readModel, writeModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { TORCH } from './support/ref';
import { assertOneLineError, cli, removeScratch, sha, tmpdir } from './support/io';
import { reverseHeadsOfS } from './support/tamper';

after(removeScratch);


const listing = (dir: string): string[] => fs.readdirSync(dir).map((f) => `${f}:${sha(path.join(dir, f))}`).sort();

/** A folder with the llama fixture, a correct patch of it, and one with per-head s reversed in the graph. */
function workdir(): { dir: string; original: string; patched: string; broken: string } {
  const dir = tmpdir('ssmax-verify-cli-');
  const original = path.join(dir, 'llama.onnx');
  fs.copyFileSync(path.join(TORCH, 'llama_gqa.onnx'), original);
  const model = readModel(original);
  const patched = path.join(dir, 'llama.ssmax.onnx');
  writeModel(patched, patchModel(model, { trainLen: 64 }).model);
  const broken = patchModel(model, { s: [0.2, 0.25, 0.3, 0.35] }).model;
  // The graph applies each layer's s reversed along heads (the initializers hold them in order).
  for (const layer of [0, 1]) reverseHeadsOfS(broken, layer);
  writeModel(path.join(dir, 'broken.onnx'), broken);
  return { dir, original, patched, broken: path.join(dir, 'broken.onnx') };
}


describe('ssmax-patch verify', () => {
  it('exits 0 on a correct patch, one line per check, and writes the report and the plot', () => {
    const w = workdir();
    const report = path.join(w.dir, 'report.json'), plot = path.join(w.dir, 'plot.svg');
    const before = sha(w.original);
    const r = cli(['verify', w.original, w.patched, '--report', report, '--plot', plot]);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    const checkLines = r.stdout.split('\n').filter((l) => /^\s+(PASSED|FAILED|SKIPPED) /.test(l));
    // Retrofit parity now runs for causal n without a cache: per site, at the rows with n = L (issue 9).
    assert.deepEqual(checkLines.map((l) => l.trim().split(/\s+/)[0]), ['PASSED', 'PASSED', 'PASSED', 'PASSED', 'PASSED']);
    assert.match(r.stdout, /verify: PASSED \(5 passed\)/);
    assert.equal(sha(w.original), before);
    const json = JSON.parse(fs.readFileSync(report, 'utf8'));
    assert.equal(json.passed, true);
    assert.equal(json.trainLen, 64);
    assert.deepEqual(json.sweep, [16, 32, 64, 128, 256, 512, 1024]);
    assert.deepEqual(json.sharpness.points.map((p: { length: number }) => p.length), json.sweep);
    assert.ok(json.sharpness.points.every((p: { originalLayers: number[] }) => p.originalLayers.length === 2));
    const svg = fs.readFileSync(plot, 'utf8');
    assert.match(svg, /^<\?xml[^>]*>\n<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
    assert.equal((svg.match(/<path /g) ?? []).length, 2, 'two curves');
    assert.equal((svg.match(/<circle /g) ?? []).length, 7 + 1, 'seven original points and the legend marker');
    for (const label of ['original (softmax)', 'patched (SSMax)', 'context length n (tokens, log scale)', 'L = 64 (factor 1)', '>1024<']) assert.ok(svg.includes(label), label);
  });

  it('exits 1 when a check fails, says what is wrong in one line, and still writes the report', () => {
    const w = workdir();
    const report = path.join(w.dir, 'report.json');
    const r = cli(['verify', w.original, w.broken, '--report', report, '--checks', 'wiring,probe']);
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stdout, /^\s+FAILED\s+semantic probe: layer 0 head \d row \d+ .*: ratio [\d.]+ expected [\d.]+ \(s=0\.\d+, n=\d+\); matches per-head s in reverse order/m);
    assert.match(r.stdout, /^\s+PASSED\s+wiring parity/m);
    assert.match(r.stdout, /verify: FAILED \(1 passed, 1 failed, 3 skipped\)/);
    assert.equal(r.stderr, '');
    const json = JSON.parse(fs.readFileSync(report, 'utf8'));
    assert.equal(json.passed, false);
    assert.deepEqual(json.checks.find((c: { id: string }) => c.id === 'probe').sites[0].matches, ['per-head s in reverse order']);
  });

  it('--json prints the whole report on stdout', () => {
    const w = workdir();
    const r = cli(['verify', w.original, w.patched, '--json', '--checks', 'probe', '--lengths', '16,128']);
    assert.equal(r.code, 0, r.stderr);
    const json = JSON.parse(r.stdout);
    assert.equal(json.checks.length, 5);
    assert.deepEqual(json.checks.map((c: { status: string }) => c.status), ['SKIPPED', 'PASSED', 'SKIPPED', 'SKIPPED', 'SKIPPED']);
  });

  const bad: [string, (w: ReturnType<typeof workdir>) => string[], RegExp][] = [
    ['an unknown check', (w) => ['verify', w.original, w.patched, '--checks', 'wiring,speed'], /--checks: unknown check 'speed' \(checks: wiring, probe, retrofit, liveness, sharpness\)/],
    ['a malformed --dim', (w) => ['verify', w.original, w.patched, '--dim', 'seq'], /--dim seq: expected name=size/],
    ['a bad --max-len', (w) => ['verify', w.original, w.patched, '--max-len', '1.5'], /--max-len: expected an integer ≥ 2/],
    ['a missing patched model', (w) => ['verify', w.original, path.join(w.dir, 'nope.onnx')], /nope\.onnx: no such file/],
    ['a patched model without a patch record', (w) => ['verify', w.original, w.original], /no ssmax-patch record/],
    ['the two models swapped', (w) => ['verify', w.patched, w.original], /no ssmax-patch record .*but the original has one: the two models are likely swapped/],
    ['a report path in a missing folder', (w) => ['verify', w.original, w.patched, '--report', path.join(w.dir, 'no', 'r.json')], /cannot write/],
    ['a report path equal to an input model', (w) => ['verify', w.original, w.patched, '--report', w.patched], /refusing to overwrite an input model/],
    ['an input for a name the model lacks', (w) => ['verify', w.original, w.patched, '--input', `pixel_values=${w.original}`], /the model has no input 'pixel_values'/],
    ['a missing argument', (w) => ['verify', w.original], /missing required argument 'patched'/],
  ];
  for (const [what, args, pattern] of bad) {
    it(`rejects ${what} with one line, exit 2, and nothing written`, () => {
      const w = workdir();
      const before = listing(w.dir);
      assertOneLineError(cli(args(w)), 2, pattern);
      assert.deepEqual(listing(w.dir), before, 'files in the folder changed');
    });
  }
});

describe('ssmax-patch --verify', () => {
  it('writes the model, the report and the plot when every check passes', () => {
    const w = workdir();
    const out = path.join(w.dir, 'out.onnx'), report = path.join(w.dir, 'r.json'), plot = path.join(w.dir, 'p.svg');
    const r = cli([w.original, '--train-len', '64', '--verify', '-o', out, '--report', report, '--plot', plot, '--lengths', '16,64,256']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.ok(fs.existsSync(out) && fs.existsSync(report) && fs.existsSync(plot));
    assert.match(r.stdout, /PASSED\s+attention sharpness: mean max attention probability 16 → 256/);
  });

  it('refuses an output it could not write before verifying: as fast as without --verify', () => {
    const w = workdir();
    const exists = path.join(w.dir, 'exists.onnx');
    fs.writeFileSync(exists, 'taken');
    // A plan whose runs take seconds: the refusal must come before any of them.
    const long = ['--verify', '--lengths', '1024,2048,4096', '--max-len', '4096'];
    for (const [out, pattern] of [[exists, /exists\.onnx: already exists \(--force overwrites it\)/], [path.join(w.dir, 'no', 'x.onnx'), /folder .* does not exist/]] as const) {
      const started = Date.now();
      const r = cli([w.original, '--train-len', '64', '-o', out, ...long, '--json']);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, pattern);
      assert.equal(JSON.parse(r.stdout).verification, undefined, 'a verification ran');
      assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms`);
    }
    assert.equal(fs.readFileSync(exists, 'utf8'), 'taken');
  });

  it('--strict with a failed check says FAILED on the strict line too, never PASSED', () => {
    const w = workdir();
    const r = cli(['verify', w.original, w.broken, '--strict', '--checks', 'wiring,probe', '--json']);
    assert.equal(r.code, 1, r.stderr);
    const doc = JSON.parse(r.stdout);
    assert.equal(doc.strict.passed, false);
    assert.match(doc.strict.failures[0], /^semantic probe FAILED: layer 0 head/);
    const lines = cli(['verify', w.original, w.broken, '--strict', '--checks', 'wiring,probe']);
    assert.match(lines.stdout, /verify: FAILED \(1 passed, 1 failed, 3 skipped; nothing left unverified\)/);
    assert.match(lines.stdout, /^strict: FAILED \(semantic probe FAILED: /m);
    assert.doesNotMatch(lines.stdout, /strict: PASSED/);
  });

  it('--report without --verify is a usage error', () => {
    const w = workdir();
    assertOneLineError(cli([w.original, '--train-len', '64', '--report', path.join(w.dir, 'r.json')]), 2, /--report needs --verify/);
    assert.ok(!fs.existsSync(path.join(w.dir, 'llama.ssmax.onnx.tmp')));
  });
});
