/**
 * CI-native output (issue 13): the JSON report on success and on refusal, checked against its committed JSON
 * Schema; JUnit XML with one test case per check (per site for the probe) and per refused attention node, its
 * counts matching the verdict; --strict failing on skips and refusals.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import Ajv2020 from 'ajv/dist/2020';
import { XMLParser, XMLValidator } from 'fast-xml-parser';
import { makeTensor } from '../src/graph/tensor';
import { encodeModel, readModel, writeModel } from '../src/io/model-file';
import { DataType } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { model, node, value } from './support/build';
import { TORCH } from './support/ref';
import { cli, removeScratch, tmpdir } from './support/io';
import { reverseHeadsOfS } from './support/tamper';

after(removeScratch);

const REPO = path.resolve(__dirname, '../..');
const schema = JSON.parse(fs.readFileSync(path.join(REPO, 'docs/report.schema.json'), 'utf8'));
const ajv = new Ajv2020({ allErrors: true, strictTypes: false });
const validate = ajv.compile(schema);

function assertValid(doc: unknown, what: string): void {
  assert.ok(validate(doc), `${what}: ${ajv.errorsText(validate.errors)}`);
}

/** The llama fixture, a correct patch and one whose per-head s is reversed in the graph (the probe fails). */
function workdir(): { dir: string; original: string; patched: string; broken: string } {
  const dir = tmpdir('ssmax-report-');
  const original = path.join(dir, 'llama.onnx');
  fs.copyFileSync(path.join(TORCH, 'llama_gqa.onnx'), original);
  const m = readModel(original);
  const patched = path.join(dir, 'llama.ssmax.onnx');
  writeModel(patched, patchModel(m, { trainLen: 64 }).model);
  // Wrong: s reaches each layer's factor reversed along the heads (the initializers themselves unchanged).
  const broken = patchModel(m, { s: [0.2, 0.25, 0.3, 0.35] }).model;
  reverseHeadsOfS(broken, 0);
  reverseHeadsOfS(broken, 1);
  writeModel(path.join(dir, 'broken.onnx'), broken);
  return { dir, original, patched, broken: path.join(dir, 'broken.onnx') };
}

/**
 * Two attention blocks: one refused (its Softmax normalises axis 2 of the 4-D logits, not the key axis), one
 * patched; the refused one's name needs XML escaping.
 */
function refusedModel(dir: string): string {
  const block = (softmax: string, axis: number, y: string) => [node('MatMul', ['Q', 'K'], [`${y}_qk`], {}, `${y}_mm`),
    node('Softmax', [`${y}_qk`], [`${y}_p`], { axis }, softmax), node('MatMul', [`${y}_p`, 'V'], [y], {}, `${y}_pv`)];
  const m = model({
    nodes: [...block('cap<&>"1', 2, 'Y1'), ...block('plain', -1, 'Y2')],
    inputs: [value('Q', DataType.FLOAT, [1, 2, 'S', 8]), value('K', DataType.FLOAT, [1, 2, 8, 'S']), value('V', DataType.FLOAT, [1, 2, 'S', 8])],
    outputs: ['Y1', 'Y2'].map((n) => value(n, DataType.FLOAT, [])), opset: 17,
  });
  const file = path.join(dir, 'refused.onnx');
  fs.writeFileSync(file, encodeModel(m));
  return file;
}

interface Junit { tests: number; failures: number; skipped: number; cases: { classname: string; name: string; outcome: string; message?: string }[] }

/** Parses JUnit XML after checking it is well-formed; the counts are read from the attributes. */
function readJunit(file: string): Junit {
  const xml = fs.readFileSync(file, 'utf8');
  assert.equal(XMLValidator.validate(xml), true, 'JUnit XML is not well-formed');
  const doc = new XMLParser({ ignoreAttributes: false, attributeNamePrefix: '', isArray: (name) => name === 'testcase' || name === 'testsuite' }).parse(xml);
  const top = doc.testsuites;
  const suite = top.testsuite[0];
  for (const key of ['tests', 'failures', 'skipped', 'errors']) assert.equal(top[key], suite[key], `testsuites/${key} differs from testsuite/${key}`);
  const cases = suite.testcase.map((c: Record<string, unknown>) => ({
    classname: c.classname as string, name: c.name as string,
    outcome: c.failure !== undefined ? 'failed' : c.skipped !== undefined ? 'skipped' : 'passed',
    message: ((c.failure ?? c.skipped) as { message?: string } | undefined)?.message,
  }));
  return { tests: Number(suite.tests), failures: Number(suite.failures), skipped: Number(suite.skipped), cases };
}

/** The counts a JUnit file must have for a verification, computed from the JSON report independently. */
type Counts = { tests: number; failures: number; skipped: number };

function expectedCounts(checks: { status: string; skip?: string; sites?: { passed: boolean }[] }[], refused: number, strict: boolean): Counts {
  let tests = refused, failures = 0, skipped = 0;
  for (const c of checks) {
    const cases = c.sites?.length ? c.sites.map((s) => (s.passed ? 'PASSED' : 'FAILED')) : [c.status];
    const strictFails = strict && c.skip === 'not checked';
    tests += cases.length;
    failures += cases.filter((s) => s === 'FAILED' || (strictFails && s === 'SKIPPED')).length;
    skipped += cases.filter((s) => s === 'SKIPPED' && !strictFails).length;
  }
  return { tests, failures: failures + (strict ? refused : 0), skipped: skipped + (strict ? 0 : refused) };
}

describe('JSON report and its schema', () => {
  const w = workdir();
  const fast = ['--lengths', '16,128'];

  it('patch --verify: the report is valid, lists every site and the verification; --report writes the same document', () => {
    const out = path.join(w.dir, 'p.onnx'), report = path.join(w.dir, 'p.json');
    const r = cli([w.original, '--train-len', '64', '--verify', '--json', '-o', out, '--report', report, ...fast]);
    assert.equal(r.code, 0, r.stderr);
    const doc = JSON.parse(r.stdout);
    assertValid(doc, 'patch --verify');
    assert.equal(doc.schemaVersion, 2);
    assert.deepEqual([doc.command, doc.status, doc.exitCode, doc.output, doc.target], ['patch', 'ok', 0, out, out]);
    assert.equal(doc.sites.length, 2);
    assert.equal(doc.verification.checks.length, 5);
    assert.deepEqual(JSON.parse(fs.readFileSync(report, 'utf8')), doc);
  });

  it('a model without attention still prints a report: the error, its code and every skipped node with its reason (exit 4, nothing written)', () => {
    fs.copyFileSync(path.join(TORCH, 'classifier.onnx'), path.join(w.dir, 'cls.onnx'));
    const cls = path.join(w.dir, 'cls-only.onnx');
    const m = model({
      nodes: [node('MatMul', ['x', 'w'], ['logits']), node('Softmax', ['logits'], ['p'], { axis: -1 }, 'head')],
      inputs: [value('x', DataType.FLOAT, ['batch', 16])], outputs: [value('p', DataType.FLOAT, ['batch', 5])],
      initializers: [makeTensor('w', DataType.FLOAT, [16, 5], Array.from({ length: 80 }, (_, i) => i / 80))],
    });
    fs.writeFileSync(cls, encodeModel(m));
    const r = cli([cls, '--s', '0.3', '--json']);
    assert.equal(r.code, 4);
    const doc = JSON.parse(r.stdout);
    assertValid(doc, 'refusal');
    assert.deepEqual([doc.status, doc.exitCode, doc.output, doc.sites.length, doc.error.code], ['error', 4, null, 0, 'no-attention']);
    assert.match(doc.error.message, /no attention Softmax found/);
    assert.deepEqual(doc.skipped, [{
      node: 'head', reason: 'logits come from a MatMul with a constant weight (a projection, not query·key)', rule: 'softmax/matmul-qk', stoppedAt: 'MatMul_logits',
    }]);
    assert.equal(r.stderr, `ssmax-patch: ${doc.error.message}\n`, 'stderr carries the same one line');
    assert.ok(!fs.existsSync(path.join(w.dir, 'cls-only.ssmax.onnx')));
  });

  it('usage and input errors print a report too, for every command', () => {
    const cases: [string[], string, string, RegExp][] = [
      [[w.original, '--s', '0.3', '--n', 'rows', '--json'], 'patch', 'usage', /--n must be one of/],
      [['patch', '--json'], 'patch', 'usage', /missing required argument 'model'/],
      [['verify', w.original, path.join(w.dir, 'nope.onnx'), '--json'], 'verify', 'io', /nope\.onnx: no such file/],
      [['revert', w.original, '--json', '-o', path.join(w.dir, 'r.onnx')], 'revert', 'not-patched', /no SSMax patch|not patched/],
    ];
    for (const [args, command, code, pattern] of cases) {
      const r = cli(args);
      assert.equal(r.code, 2, r.stderr);
      const doc = JSON.parse(r.stdout);
      assertValid(doc, args.join(' '));
      assert.deepEqual([doc.command, doc.status, doc.exitCode, doc.error.code], [command, 'error', 2, code]);
      assert.match(doc.error.message, pattern);
    }
  });

  it('verify and revert reports are valid; so is the committed example report', () => {
    const v = cli(['verify', w.original, w.patched, '--json', ...fast]);
    assert.equal(v.code, 0, v.stderr);
    const doc = JSON.parse(v.stdout);
    assertValid(doc, 'verify');
    assert.deepEqual([doc.command, doc.original, doc.patched, doc.passed, doc.refused], ['verify', w.original, w.patched, true, []]);
    const r = cli(['revert', w.patched, '--json', '-o', path.join(w.dir, 'reverted.onnx')]);
    assert.equal(r.code, 0, r.stderr);
    assertValid(JSON.parse(r.stdout), 'revert');
    assertValid(JSON.parse(fs.readFileSync(path.join(REPO, 'docs/verify-llama_gqa.json'), 'utf8')), 'docs/verify-llama_gqa.json');
  });

  it('reports with a positional prior, alone (--preset none: n none, s null) or beside the factor, are valid', () => {
    for (const args of [['--preset', 'none', '--prior', 'ggd'], ['--s', '0.3', '--prior', 'alibi']]) {
      const r = cli([path.join(TORCH, 'gpt2_past.onnx'), ...args, '--dry-run', '--json']);
      assert.equal(r.code, 0, r.stderr);
      const doc = JSON.parse(r.stdout);
      assertValid(doc, args.join(' '));
      assert.ok(doc.sites.every((s: { prior?: object }) => s.prior), 'no prior in the report');
    }
  });

  it('the schema rejects what the tool must never print', () => {
    const v = JSON.parse(cli(['verify', w.original, w.patched, '--json', '--checks', 'wiring']).stdout);
    const p = JSON.parse(cli([w.original, '--s', '0.3', '--json', '--dry-run']).stdout);
    assertValid(p, 'dry run');
    const bad: [string, unknown][] = [
      ['status ok with exit code 1', { ...p, exitCode: 1 }],
      ['an error status without the error', { ...p, status: 'error', exitCode: 2 }],
      ['an unknown field', { ...p, extra: true }],
      ['an n mode outside the vocabulary', { ...p, sites: [{ ...p.sites[0], n: 'rows' }] }],
      ['another schema version', { ...p, schemaVersion: 1 }],
      ['an error as schema version 1 wrote it, a string', { ...p, status: 'error', exitCode: 2, error: 'bad' }],
      ['an error without its code', { ...p, status: 'error', exitCode: 2, error: { message: 'bad' } }],
      ['an error code outside the list', { ...p, status: 'error', exitCode: 2, error: { code: 'bad', message: 'bad' } }],
      ['a verify report without its checks', { ...v, checks: undefined }],
      ['a check with an unknown status', { ...v, checks: [{ ...v.checks[0], status: 'MAYBE' }] }],
    ];
    for (const [what, doc] of bad) assert.equal(validate(JSON.parse(JSON.stringify(doc))), false, `accepted ${what}`);
  });
});

describe('JUnit XML and --strict', () => {
  const w = workdir();
  const fast = ['--lengths', '16,128'];
  // No run longer than L = 64: liveness is skipped for lack of evidence, which --strict fails.
  const short = ['--lengths', '16,32'];

  it('verify: one test case per check and per probed site; a skipped check is <skipped>, and a failure under --strict', () => {
    const plain = path.join(w.dir, 'plain.xml'), strict = path.join(w.dir, 'strict.xml');
    const r = cli(['verify', w.original, w.patched, '--junit', plain, '--json', ...short]);
    assert.equal(r.code, 0, r.stderr);
    const doc = JSON.parse(r.stdout);
    const j = readJunit(plain);
    assert.deepEqual({ tests: j.tests, failures: j.failures, skipped: j.skipped }, expectedCounts(doc.checks, 0, false));
    assert.equal(j.cases.length, j.tests);
    assert.deepEqual(j.cases.filter((c) => c.classname === 'ssmax-patch.probe').map((c) => c.name),
      ['semantic probe: layer 0 (site 1 of 2, n causal)', 'semantic probe: layer 1 (site 2 of 2, n causal)']);
    assert.deepEqual(j.cases.filter((c) => c.outcome === 'skipped').map((c) => c.classname), ['ssmax-patch.liveness', 'ssmax-patch.sharpness']);
    const plot = path.join(w.dir, 'no-curve.svg');
    const s = cli(['verify', w.original, w.patched, '--junit', strict, '--strict', '--json', '--plot', plot, ...short]);
    assert.equal(s.code, 1, s.stderr);
    assert.match(fs.readFileSync(plot, 'utf8'), /<svg[^]*<path/, 'the curves that ran are drawn though no length passed L');
    const none = cli(['verify', w.original, w.patched, '--checks', 'wiring', '--plot', plot, ...short]);
    assert.equal(none.code, 0, none.stderr);
    assert.match(fs.readFileSync(plot, 'utf8'), /<svg[^]*no sharpness curve: not selected/, 'a CI job uploading the plot gets the reason, not a missing file');
    const sdoc = JSON.parse(s.stdout);
    assertValid(sdoc, 'verify --strict');
    assert.equal(sdoc.status, 'failed');
    assert.equal(sdoc.passed, false, 'with --strict, passed also needs nothing left unverified');
    assert.ok(sdoc.checks.every((c: { status: string }) => c.status !== 'FAILED'), 'no check failed');
    assert.deepEqual(sdoc.strict.passed, false);
    assert.match(sdoc.strict.failures[0], /^liveness: no run longer than L = 64/);
    const js = readJunit(strict);
    assert.deepEqual({ tests: js.tests, failures: js.failures, skipped: js.skipped }, expectedCounts(sdoc.checks, 0, true));
    assert.equal(js.failures, 2, 'liveness and sharpness had no run beyond L');
  });

  it('a failing probe fails its sites in JUnit, one test case each (exit 1)', () => {
    const file = path.join(w.dir, 'broken.xml');
    const r = cli(['verify', w.original, w.broken, '--junit', file, '--checks', 'wiring,probe', '--json']);
    assert.equal(r.code, 1, r.stderr);
    const j = readJunit(file);
    assert.deepEqual({ tests: j.tests, failures: j.failures, skipped: j.skipped }, expectedCounts(JSON.parse(r.stdout).checks, 0, false));
    const probe = j.cases.filter((c) => c.classname === 'ssmax-patch.probe');
    assert.deepEqual(probe.map((c) => c.outcome), ['failed', 'failed']);
    assert.match(probe[0].message!, /ratio .* expected/);
    assert.equal(j.skipped, 3, 'retrofit, liveness and sharpness were not selected');
  });

  it('patch --verify --strict: a refused attention node fails the run and is a test case; nothing is written', () => {
    const input = refusedModel(w.dir);
    const out = path.join(w.dir, 'refused.ssmax.onnx'), file = path.join(w.dir, 'refused.xml');
    const r = cli([input, '--train-len', '64', '--verify', '--strict', '--junit', file, '--json', '-o', out, ...fast]);
    assert.equal(r.code, 1, r.stderr);
    const doc = JSON.parse(r.stdout);
    assertValid(doc, 'patch --strict with a refusal');
    assert.equal(doc.output, null);
    assert.ok(!fs.existsSync(out));
    assert.ok(doc.strict.failures.some((f: string) => /^refused attention cap<&>"1: Softmax over axis 2 of a rank-4 tensor/.test(f)), doc.strict.failures.join('\n'));
    assert.match(r.stderr, /^ssmax-patch: --strict: .*: output not written\n$/);
    const j = readJunit(file);
    assert.deepEqual({ tests: j.tests, failures: j.failures, skipped: j.skipped }, expectedCounts(doc.verification.checks, 1, true));
    assert.deepEqual(j.cases.filter((c) => c.classname === 'ssmax-patch.sites').map((c) => [c.name, c.outcome]), [['attention layer 0 cap<&>"1', 'failed']]);
    // Without --strict the same refusal is a skipped test case and the model is written.
    const lenient = cli([input, '--train-len', '64', '--verify', '--junit', file, '-o', out, ...fast]);
    assert.equal(lenient.code, 0, lenient.stderr);
    assert.deepEqual(readJunit(file).cases.filter((c) => c.classname === 'ssmax-patch.sites').map((c) => c.outcome), ['skipped']);
    assert.ok(fs.existsSync(out));
  });
});
