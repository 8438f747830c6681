/**
 * The strict command line (issue 13): subcommands, nothing silently ignored, numbers parsed strictly, empty
 * values refused, every error one line with the prefix and a pointer to --help, one n vocabulary.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { TORCH } from './support/ref';
import { cli, CliResult, removeScratch, sha, tmpdir } from './support/io';

after(removeScratch);

function workdir(): string {
  const dir = tmpdir('ssmax-strict-');
  for (const m of ['gpt2_past', 'bert_encoder', 'llama_gqa']) fs.copyFileSync(path.join(TORCH, `${m}.onnx`), path.join(dir, `${m}.onnx`));
  return dir;
}

const listing = (dir: string): string[] => fs.readdirSync(dir).map((f) => `${f}:${sha(path.join(dir, f))}`).sort();

/** One line: the prefix, the message, the help pointer of the subcommand; exit 2. */
function assertUsageError(r: CliResult, command: string, pattern: RegExp): void {
  assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}${r.stdout}`);
  assert.equal(r.stdout, '');
  const lines = r.stderr.trim().split('\n');
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0], new RegExp(`^ssmax-patch: .* \\(see ssmax-patch ${command} --help\\)$`));
  assert.match(lines[0], pattern);
}

describe('strict arguments', () => {
  const bad: [string, string[], string, RegExp][] = [
    ['a second model path (was: written to <name>.ssmax.onnx, out.onnx ignored)', ['gpt2_past.onnx', 'out.onnx', '--s', '0.3'], 'patch', /unexpected argument 'out\.onnx': patch takes one model \(the output file is given with -o out\.onnx\)/],
    ['a third model for verify', ['verify', 'gpt2_past.onnx', 'bert_encoder.onnx', 'extra.onnx'], 'verify', /unexpected argument 'extra\.onnx': verify takes two models/],
    ['a second model for revert', ['revert', 'gpt2_past.onnx', 'x.onnx'], 'revert', /unexpected argument 'x\.onnx': revert takes one model/],
    ['--layers "" (was: layer 0)', ['gpt2_past.onnx', '--s', '0.3', '--layers', ''], 'patch', /--layers: empty value/],
    ['--layers with an empty item', ['gpt2_past.onnx', '--s', '0.3', '--layers', '0,,1'], 'patch', /--layers must be a comma-separated list/],
    ['--layers in hex', ['gpt2_past.onnx', '--s', '0.3', '--layers', '0x1'], 'patch', /--layers must be a comma-separated list/],
    ['--train-len in hex', ['gpt2_past.onnx', '--train-len', '0x40'], 'patch', /--train-len: expected an integer ≥ 2, got '0x40'/],
    ['--train-len in scientific notation', ['gpt2_past.onnx', '--train-len', '1e3'], 'patch', /--train-len: expected an integer ≥ 2, got '1e3'/],
    ['--train-len with blanks', ['gpt2_past.onnx', '--train-len', ' 64 '], 'patch', /--train-len: expected an integer ≥ 2, got ' 64 '/],
    ['--s "" (was: got 0)', ['gpt2_past.onnx', '--s', ''], 'patch', /--s: empty value/],
    ['--s in hex', ['gpt2_past.onnx', '--s', '0x1'], 'patch', /--s: expected a number, got '0x1'/],
    ['--atol that is not a number', ['gpt2_past.onnx', '--s', '0.3', '--verify', '--atol', '1e-4x'], 'patch', /--atol: expected a number/],
    ['--lengths with an empty item', ['verify', 'gpt2_past.onnx', 'bert_encoder.onnx', '--lengths', '16,,64'], 'verify', /--lengths: empty item/],
    ['an empty -o', ['gpt2_past.onnx', '--s', '0.3', '-o', ''], 'patch', /--output: empty value/],
    ['an unknown option', ['gpt2_past.onnx', '--frobnicate'], 'patch', /unknown option '--frobnicate'/],
    ['a misspelt option, with the suggestion on the same line (was: a literal \\n before it)', ['gpt2_past.onnx', '--trainlen', '64'], 'patch',
      /^ssmax-patch: unknown option '--trainlen' \(Did you mean --train-len\?\) \(see/],
    ['a missing model', ['patch', '--s', '0.3'], 'patch', /missing required argument 'model'/],
    ['--report without --verify', ['gpt2_past.onnx', '--s', '0.3', '--junit', 'j.xml', '--strict'], 'patch', /--strict and --junit need --verify/],
    ['--s with --s-file', ['gpt2_past.onnx', '--s', '0.3', '--s-file', 's.json'], 'patch', /--s and --s-file are exclusive/],
    ['--explain with an option it would ignore', ['gpt2_past.onnx', '--explain', '/lm/transformer/h.0/attn/Softmax', '--s', '0.3', '--quiet'], 'patch', /--explain prints the rules tried on a node and writes nothing: it takes no other option \(got --s, --quiet\)/],
    ['--n padding where no padding mask reaches the logits', ['llama_gqa.onnx', '--s', '0.3', '--n', 'padding'], 'patch', /--n padding needs a key-padding mask from a model input on the logits, and layer 0 has none \(its masks are causal\)/],
  ];
  for (const [what, args, command, pattern] of bad) {
    it(`rejects ${what}`, () => {
      const dir = workdir();
      const before = listing(dir);
      assertUsageError(cli(args, { cwd: dir }), command, pattern);
      assert.deepEqual(listing(dir), before, 'files in the folder changed');
    });
  }

  it('help, --help and help <command> print help and exit 0 (was: "help: no such file")', () => {
    const top = cli(['help']);
    assert.equal(top.code, 0, top.stderr);
    for (const c of ['patch', 'verify', 'revert']) assert.match(top.stdout, new RegExp(`^  ${c} `, 'm'));
    assert.equal(cli(['--help']).stdout, top.stdout);
    const patch = cli(['help', 'patch']);
    assert.equal(patch.code, 0);
    assert.match(patch.stdout, /--force-site <name>[\s\S]*a glob \(\* and \?\) or all/);
    assert.match(patch.stdout.replace(/\s+/g, ' '), /--n <mode> how n is computed: auto \| keys \| causal \| padding \| causal-padding \| mask/);
    assert.match(cli(['verify', '--help']).stdout, /--strict/);
  });

  it('model files named verify or revert are patched with the patch subcommand (or ./verify)', () => {
    const dir = workdir();
    fs.copyFileSync(path.join(dir, 'gpt2_past.onnx'), path.join(dir, 'verify'));
    fs.copyFileSync(path.join(dir, 'gpt2_past.onnx'), path.join(dir, 'revert'));
    assert.equal(cli(['patch', 'verify', '--s', '0.3'], { cwd: dir }).code, 0);
    assert.ok(fs.existsSync(path.join(dir, 'verify.ssmax.onnx')));
    assert.equal(cli(['./revert', '--s', '0.3', '-o', 'r.onnx'], { cwd: dir }).code, 0);
    assert.ok(fs.existsSync(path.join(dir, 'r.onnx')));
    // And the explicit subcommand is the same patch as the default one, byte for byte.
    assert.equal(cli(['patch', 'gpt2_past.onnx', '--s', '0.3', '-o', 'a.onnx'], { cwd: dir }).code, 0);
    assert.equal(cli(['gpt2_past.onnx', '--s', '0.3', '-o', 'b.onnx'], { cwd: dir }).code, 0);
    assert.equal(sha(path.join(dir, 'a.onnx')), sha(path.join(dir, 'b.onnx')));
  });

  it('--update-s with --n or --layers is an error: the existing factors keep theirs', () => {
    const dir = workdir();
    assert.equal(cli(['gpt2_past.onnx', '--s', '0.3', '-o', 'once.onnx'], { cwd: dir }).code, 0);
    const before = listing(dir);
    assertUsageError(cli(['once.onnx', '--s', '0.5', '--update-s', '--n', 'keys', '--layers', '1', '-o', 'twice.onnx'], { cwd: dir }), 'patch',
      /--update-s replaces s in place and keeps everything else of the patch: --layers, --n would be ignored/);
    assert.deepEqual(listing(dir), before);
    assert.equal(cli(['once.onnx', '--s', '0.5', '--update-s', '-o', 'twice.onnx'], { cwd: dir }).code, 0);
  });

  it('--dry-run says what would be patched and writes nothing', () => {
    const dir = workdir();
    const before = listing(dir);
    const r = cli(['gpt2_past.onnx', '--train-len', '64', '--dry-run'], { cwd: dir });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^would patch 2 attention site\(s\)/);
    assert.match(r.stdout, /nothing written \(--dry-run\)\n$/);
    assert.doesNotMatch(r.stdout, /^patched/m);
    assert.deepEqual(listing(dir), before);
  });
});

describe('one n vocabulary', () => {
  it('every n mode the report prints is accepted by --n, and means what auto means by it', () => {
    const dir = workdir();
    // auto picks padding on the BERT encoder and causal-padding on GPT-2 with its padding mask: forcing the same
    // mode must give the same model, byte for byte.
    for (const [model, mode] of [['bert_encoder', 'padding'], ['gpt2_past', 'causal-padding'], ['llama_gqa', 'causal']]) {
      const auto = cli([`${model}.onnx`, '--train-len', '64', '--json', '-o', `${model}.auto.onnx`], { cwd: dir });
      assert.equal(auto.code, 0, auto.stderr);
      const printed: string[] = JSON.parse(auto.stdout).sites.map((s: { n: string }) => s.n);
      assert.deepEqual([...new Set(printed)], [mode]);
      const forced = cli([`${model}.onnx`, '--train-len', '64', '--n', mode, '-o', `${model}.forced.onnx`], { cwd: dir });
      assert.equal(forced.code, 0, forced.stderr);
      assert.equal(forced.stderr, '', 'a mode that agrees with the masks warns about nothing');
      assert.equal(sha(path.join(dir, `${model}.auto.onnx`)), sha(path.join(dir, `${model}.forced.onnx`)), model);
    }
    const masked = cli(['bert_encoder.onnx', '--train-len', '64', '--n', 'mask', '--dry-run', '--json'], { cwd: dir });
    assert.deepEqual(JSON.parse(masked.stdout).sites.map((s: { n: string }) => s.n), ['mask', 'mask']);
  });

  it('--n padding and causal-padding are verified on onnxruntime where they agree with the masks', () => {
    const dir = workdir();
    for (const [model, mode] of [['bert_encoder', 'padding'], ['gpt2_past', 'causal-padding']]) {
      const r = cli([`${model}.onnx`, '--train-len', '64', '--n', mode, '--verify', '--checks', 'wiring,probe', '--dry-run'], { cwd: dir });
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.match(r.stdout, /PASSED {2}semantic probe: after = s·ln\(n\)·before at all 2 site\(s\)/);
    }
  });
});
