/** The command line as a user meets it: exit codes, one-line errors, output files, the input left alone. */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { ERROR_CODES, ErrorCode } from '../src/errors';
import { encodeModel } from '../src/io/model-file';
import { f32, model, node, randoms, value } from './support/build';
import { TORCH } from './support/ref';
import { assertOneLineError, cli, removeScratch, sha, tmpdir } from './support/io';

after(removeScratch);


function workdir(): string {
  const dir = tmpdir('ssmax-cli-');
  fs.copyFileSync(path.join(TORCH, 'bert_encoder.onnx'), path.join(dir, 'bert.onnx'));
  fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'gpt2.onnx'));
  return dir;
}



describe('ssmax-patch CLI', () => {
  it('writes <name>.ssmax.onnx beside the input, leaves the input unchanged, refuses to overwrite without --force', () => {
    const dir = workdir();
    const input = path.join(dir, 'bert.onnx');
    const before = sha(input);
    const r = cli([input, '--train-len', '64']);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(fs.existsSync(path.join(dir, 'bert.ssmax.onnx')));
    assert.equal(sha(input), before);
    assertOneLineError(cli([input, '--train-len', '64']), 2, /already exists.*--force/);
    assert.equal(cli([input, '--train-len', '64', '--force']).code, 0);
    assert.equal(sha(input), before);
  });

  it('--json reports each patched site and each skipped Softmax', () => {
    const dir = workdir();
    fs.copyFileSync(path.join(TORCH, 'classifier.onnx'), path.join(dir, 'cls.onnx'));
    const r = cli([path.join(dir, 'cls.onnx'), '--s', '0.3', '--json', '--dry-run']);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout);
    assert.equal(report.output, null);
    assert.equal(report.sites.length, 1);
    assert.deepEqual(Object.keys(report.sites[0]).filter((k) => ['node', 'layer', 'n', 'heads', 's'].includes(k)).sort(), ['heads', 'layer', 'n', 'node', 's']);
    assert.equal(report.sites[0].heads, 4);
    assert.equal(report.skipped.length, 1);
    assert.equal(report.skipped[0].node, '/Softmax');
    assert.ok(!fs.existsSync(path.join(dir, 'cls.ssmax.onnx')), '--dry-run wrote a file');
  });

  it('--verify passes on a causal KV-cache decoder and prints PASSED per check', () => {
    const dir = workdir();
    const r = cli([path.join(dir, 'gpt2.onnx'), '--train-len', '64', '--verify', '-o', path.join(dir, 'out.onnx')]);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /PASSED\s+wiring parity/);
    assert.match(r.stdout, /PASSED\s+retrofit parity/);
    assert.match(r.stdout, /PASSED\s+liveness/);
    assert.match(r.stdout, /PASSED\s+semantic probe/);
    assert.match(r.stdout, /verify: PASSED/);
    assert.ok(fs.existsSync(path.join(dir, 'out.onnx')));
  });

  it('patching the output again is refused; --update-s changes s', () => {
    const dir = workdir();
    const out = path.join(dir, 'once.onnx');
    assert.equal(cli([path.join(dir, 'bert.onnx'), '--s', '0.3', '-o', out]).code, 0);
    assertOneLineError(cli([out, '--s', '0.3', '-o', path.join(dir, 'twice.onnx')]), 2, /already patched.*--update-s/);
    assert.ok(!fs.existsSync(path.join(dir, 'twice.onnx')));
    const r = cli([out, '--s', '0.5', '--update-s', '-o', path.join(dir, 'twice.onnx'), '--json']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(JSON.parse(r.stdout).updated, true);
  });

  const bad: [string, (dir: string) => string[], RegExp, ErrorCode][] = [
    ['a missing file', (d) => [path.join(d, 'nope.onnx'), '--s', '0.3'], /no such file/, 'io'],
    ['a truncated file', (d) => {
      fs.writeFileSync(path.join(d, 'cut.onnx'), fs.readFileSync(path.join(d, 'bert.onnx')).subarray(0, 5000));
      return [path.join(d, 'cut.onnx'), '--s', '0.3'];
    }, /not (a readable|an) ONNX model/, 'bad-model'],
    ['a file that is not ONNX', (d) => {
      fs.writeFileSync(path.join(d, 'x.onnx'), '{"hello": "world"}\n');
      return [path.join(d, 'x.onnx'), '--s', '0.3'];
    }, /not (a readable|an) ONNX model/, 'bad-model'],
    ['a model with no attention Softmax', (d) => [path.join(d, 'cls-head.onnx'), '--s', '0.3'], /no (attention )?Softmax/, 'no-attention'],
    ['an unknown option', (d) => [path.join(d, 'bert.onnx'), '--frobnicate'], /unknown option/, 'usage'],
    ['no s given', (d) => [path.join(d, 'bert.onnx')], /give --s or --s-file or --train-len/, 'usage'],
    ['a non-positive s', (d) => [path.join(d, 'bert.onnx'), '--s', '-1'], /positive/, 'usage'],
    ['an s-file with the wrong head count', (d) => {
      fs.writeFileSync(path.join(d, 's.json'), JSON.stringify({ s: [0.1, 0.2, 0.3] }));
      return [path.join(d, 'bert.onnx'), '--s-file', path.join(d, 's.json')];
    }, /3 heads for layer 0, the model has 4/, 'usage'],
    ['an s-file with the wrong layer count', (d) => {
      fs.writeFileSync(path.join(d, 's.json'), JSON.stringify({ s: [[0.1, 0.2, 0.3, 0.4]] }));
      return [path.join(d, 'bert.onnx'), '--s-file', path.join(d, 's.json')];
    }, /1 layers, the model has 2 attention layers/, 'usage'],
    ['an s-file with a zero s', (d) => {
      fs.writeFileSync(path.join(d, 's.json'), JSON.stringify({ s: [0.1, 0, 0.3, 0.4] }));
      return [path.join(d, 'bert.onnx'), '--s-file', path.join(d, 's.json')];
    }, /positive/, 'usage'],
    ['an s-file that is not JSON', (d) => {
      fs.writeFileSync(path.join(d, 's.json'), 's = 0.3');
      return [path.join(d, 'bert.onnx'), '--s-file', path.join(d, 's.json')];
    }, /not valid JSON/, 'usage'],
    ['the output path equal to the input', (d) => [path.join(d, 'bert.onnx'), '--s', '0.3', '-o', path.join(d, 'bert.onnx'), '--force'], /refusing to overwrite the input/, 'usage'],
    ['a bad --n', (d) => [path.join(d, 'bert.onnx'), '--s', '0.3', '--n', 'rows'], /--n must be one of auto, keys, causal, padding, causal-padding, mask; got 'rows'/, 'usage'],
  ];
  for (const [what, args, pattern, code] of bad) {
    it(`rejects ${what} with one line, exit ${ERROR_CODES[code]}, error code ${code}, and no output file`, () => {
      const dir = workdir();
      writeClassifierOnly(dir);
      const argv = args(dir);
      const before = fs.readdirSync(dir).map((f) => `${f}:${sha(path.join(dir, f))}`).sort();
      const r = cli(argv);
      assertOneLineError(r, ERROR_CODES[code], pattern);
      const json = cli([...argv, '--json']);
      assert.equal(json.code, ERROR_CODES[code]);
      assert.equal(JSON.parse(json.stdout).error.code, code);
      const after = fs.readdirSync(dir).map((f) => `${f}:${sha(path.join(dir, f))}`).sort();
      assert.deepEqual(after, before, 'files in the folder changed');
    });
  }
});

/** A model whose only Softmax is a classifier head, written as a file for the CLI. */
function writeClassifierOnly(dir: string): void {
  const m = model({
    nodes: [node('MatMul', ['x', 'w'], ['logits']), node('Softmax', ['logits'], ['p'], { axis: -1 })],
    inputs: [value('x', 1, ['batch', 16])], outputs: [value('p', 1, ['batch', 5])],
    initializers: [f32('w', [16, 5], randoms(80, 3))],
  });
  fs.writeFileSync(path.join(dir, 'cls-head.onnx'), encodeModel(m));
}
