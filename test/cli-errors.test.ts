/**
 * The command line refuses what it would ignore, and every error says what kind it is (issue 25): a single-value
 * option given twice, an option that only matters with --verify or with another preset, a number float32 cannot
 * hold; a stable code on every error (JSON error.code, SsmaxError.code) that sets the exit code, 4 for a model
 * without attention; help that neither leaks the parser nor suggests overwriting a second model.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { inspect } from 'node:util';
import { after, describe, it } from 'node:test';
import Ajv2020 from 'ajv/dist/2020';
import { ERROR_CODES, ErrorCode, SsmaxError } from '../src/errors';
import { makeTensor } from '../src/graph/tensor';
import { encodeModel, readModel, writeModel, writeModelAsync } from '../src/io/model-file';
import { DataType, ModelProto } from '../src/io/onnx';
import { patchModel } from '../src/rewrite/patch';
import { classifierOnly, i64, model, node, value } from './support/build';
import { cli, CliResult, removeScratch, sha, snapshot, tmpdir, writeExternal } from './support/io';
import { blocks, runShell, section } from './support/readme';
import { TORCH } from './support/ref';
import { reverseHeadsOfS } from './support/tamper';

after(removeScratch);

const REPO = path.resolve(__dirname, '../..');
const ajv = new Ajv2020({ allErrors: true, strictTypes: false });
const validate = ajv.compile(JSON.parse(fs.readFileSync(path.join(REPO, 'docs/report.schema.json'), 'utf8')));

function assertValid(doc: unknown): void {
  assert.ok(validate(doc), ajv.errorsText(validate.errors));
}

function workdir(): string {
  const dir = tmpdir('ssmax-errors-');
  for (const m of ['gpt2_past', 'llama_gqa']) fs.copyFileSync(path.join(TORCH, `${m}.onnx`), path.join(dir, `${m}.onnx`));
  return dir;
}

/** One line on stderr, no stack trace, nothing on stdout, exit 2, the folder as it was. */
function assertRefused(dir: string, args: string[], pattern: RegExp): CliResult {
  const before = snapshot(dir);
  const r = cli(args, { cwd: dir });
  assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}${r.stdout}`);
  assert.equal(r.stdout, '');
  const lines = r.stderr.trim().split('\n');
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(r.stderr, /\n\s+at /);
  assert.deepEqual(snapshot(dir), before, 'files in the folder changed');
  return r;
}

describe('options that would be ignored are errors', () => {
  const dir = workdir();
  fs.writeFileSync(path.join(dir, 'huge-s.json'), JSON.stringify({ s: [0.3, 0.3, 1e39, 0.3] }));
  fs.writeFileSync(path.join(dir, 'tiny-theta.json'), JSON.stringify({ theta_alpha: 1e-40 }));
  const gpt2 = ['gpt2_past.onnx', '--train-len', '64'];
  const cases: [string, string[], RegExp][] = [
    ['--s twice (was: the last one, silently)', ['gpt2_past.onnx', '--s', '0.3', '--s', '0.4'], /--s: given twice \('0\.3', then '0\.4'\); it takes one value/],
    ['--train-len twice', ['gpt2_past.onnx', '--train-len', '64', '--train-len', '128'], /--train-len: given twice \('64', then '128'\)/],
    ['-o twice', [...gpt2, '-o', 'a.onnx', '--output', 'b.onnx'], /--output: given twice \('a\.onnx', then 'b\.onnx'\)/],
    ['--s=0.3 and --s 0.4', ['gpt2_past.onnx', '--s=0.3', '--s', '0.4'], /--s: given twice/],
    ['verify --train-len twice', ['verify', 'gpt2_past.onnx', 'llama_gqa.onnx', '--train-len', '64', '--train-len', '64'], /--train-len: given twice/],
    ['revert -o twice', ['revert', 'gpt2_past.onnx', '-o', 'a.onnx', '-o', 'b.onnx'], /--output: given twice/],
    ['--floor-scale without --preset llama4 (was: ignored)', [...gpt2, '--floor-scale', '4096'], /--floor-scale applies to --preset llama4 only/],
    ['--attn-scale with qwen-logn', [...gpt2, '--preset', 'qwen-logn', '--attn-scale', '0.2'], /--attn-scale applies to --preset llama4 only/],
    ['--b with llama4', ['gpt2_past.onnx', '--preset', 'llama4', '--b', '0.1'], /--b applies to --preset ssmax only/],
    ['--n with --preset none (was: ignored, and warned about as if it counted)', ['gpt2_past.onnx', '--preset', 'none', '--prior', 'ggd', '--n', 'keys'], /--preset none has no factor, so no n: --n keys would be ignored/],
    ['--s 1e300 (was: written as float32 Infinity)', ['gpt2_past.onnx', '--s', '1e300'], /--s: 1e\+300 overflows float32 .*it would be stored as Infinity/],
    ['--s 1e-300 (was: written as 0)', ['gpt2_past.onnx', '--s', '1e-300'], /--s: 1e-300 underflows float32 .*it would be stored as 0\b/],
    ['--s 1e-40, a float32 subnormal', ['gpt2_past.onnx', '--s', '1e-40'], /--s: 1e-40 underflows float32 \(smallest normal 1\.1754944e-38\): it would be stored as 9\.99994/],
    ['--b 1e39', [...gpt2, '--b', '1e39'], /--b: 1e\+39 overflows float32/],
    ['--b -1e39', [...gpt2, '--b', '-1e39'], /--b: -1e\+39 overflows float32 .*stored as -Infinity/],
    ['--floor-scale 1e39', ['gpt2_past.onnx', '--preset', 'llama4', '--floor-scale', '1e39'], /--floor-scale: 1e\+39 overflows float32/],
    ['--attn-scale 1e-39', ['gpt2_past.onnx', '--preset', 'llama4', '--attn-scale', '1e-39'], /--attn-scale: 1e-39 underflows float32/],
    ['an s file with a head s float32 cannot hold', ['gpt2_past.onnx', '--s-file', 'huge-s.json'], /--s-file huge-s\.json: 1e\+39 overflows float32/],
    ['a prior file with a θ float32 cannot hold', [...gpt2, '--prior', 'ggd', '--prior-file', 'tiny-theta.json'], /θalpha: 1e-40 underflows float32/],
  ];
  for (const [what, args, pattern] of cases) it(`refuses ${what}`, () => void assertRefused(dir, args, pattern));

  // Each option addVerifyOptions adds, on patch without --verify (were: exit 0 and ignored).
  const verifyOnly: string[][] = [['--lengths', '16,32'], ['--max-len', '64'], ['--batch', '1'], ['--checks', 'wiring'], ['--atol', '1e-3'],
    ['--rtol', '1e-3'], ['--dim', 'seq=8'], ['--input', 'input_ids=ids.npy'], ['--strict'], ['--report', 'r.json'], ['--plot', 'p.svg'], ['--junit', 'j.xml']];
  for (const option of verifyOnly) {
    it(`refuses ${option[0]} on patch without --verify`, () => void assertRefused(dir, [...gpt2, ...option], new RegExp(`^ssmax-patch: ${option[0]} needs --verify`)));
  }
  it('names every such option at once', () => {
    void assertRefused(dir, [...gpt2, '--max-len', '64', '--dim', 'seq=8', '--atol', '1e-3'], /--max-len, --atol and --dim need --verify/);
  });
});

describe('what stays allowed', () => {
  const dir = workdir();

  it('repeatable options repeat; a flag given twice is the flag', () => {
    const r = cli(['gpt2_past.onnx', '--train-len', '64', '--verify', '--checks', 'wiring', '--dim', 'batch=1', '--dim', 'sequence=5', '--quiet', '--quiet', '--dry-run', '--json'], { cwd: dir });
    assert.equal(r.code, 0, r.stderr);
    const runs = JSON.parse(r.stdout).verification.runs as { batch: number; seq: number }[];
    assert.ok(runs.length > 0 && runs.every((x) => x.batch === 1 && x.seq === 5), JSON.stringify(runs));
  });

  it('a normal float32 just above the smallest is taken', () => {
    const r = cli(['gpt2_past.onnx', '--s', '1.2e-38', '--dry-run', '--json'], { cwd: dir });
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout).sites.map((s: { s: number }) => s.s), [1.2e-38, 1.2e-38]);
  });

  it('--update-s of a llama4 patch takes --attn-scale without naming the preset again (was: refused, the preset defaulting to ssmax)', () => {
    assert.equal(cli(['llama_gqa.onnx', '--preset', 'llama4', '-o', 'l4.onnx'], { cwd: dir }).code, 0);
    const r = cli(['l4.onnx', '--attn-scale', '0.2', '--update-s', '-o', 'l4b.onnx', '--json'], { cwd: dir });
    assert.equal(r.code, 0, r.stderr);
    const doc = JSON.parse(r.stdout);
    assert.deepEqual([doc.updated, doc.preset, doc.sites.map((s: { s: number }) => s.s)], [true, 'llama4', [0.2, 0.2]]);
  });
});

/** A model whose attention is refused: its Softmax normalises axis 2 of the 4-D logits, not the key axis. */
function attentionModel(softmaxAxis: number, query = 'Q', extra: ReturnType<typeof node>[] = [], initializers: ReturnType<typeof i64>[] = []): ModelProto {
  return model({
    nodes: [...extra, node('MatMul', [query, 'K'], ['qk'], {}, 'mm'), node('Softmax', ['qk'], ['p'], { axis: softmaxAxis }, 'sm'), node('MatMul', ['p', 'V'], ['Y'], {}, 'pv')],
    inputs: [value('Q', DataType.FLOAT, [1, 2, 'S', 8]), value('K', DataType.FLOAT, [1, 2, 8, 'S']), value('V', DataType.FLOAT, [1, 2, 'S', 8])],
    outputs: [value('Y', DataType.FLOAT, [])], initializers,
  });
}

/** Attention on 3-D [B, S, d] tensors: nothing in the graph tells the head count. */
const flatAttention = (): ModelProto => model({
  nodes: [node('MatMul', ['Q', 'K'], ['qk'], {}, 'mm'), node('Softmax', ['qk'], ['p'], { axis: -1 }, 'sm'), node('MatMul', ['p', 'V'], ['Y'], {}, 'pv')],
  inputs: [value('Q', DataType.FLOAT, ['B', 'S', 8]), value('K', DataType.FLOAT, ['B', 8, 'S']), value('V', DataType.FLOAT, ['B', 'S', 8])],
  outputs: [value('Y', DataType.FLOAT, [])],
});

describe('every error has a code, which sets the exit code', () => {
  const dir = workdir();
  const save = (name: string, m: ModelProto): void => fs.writeFileSync(path.join(dir, name), encodeModel(m));
  save('refused.onnx', attentionModel(2));
  save('flat.onnx', flatAttention());
  // The query reshaped to a fixed length: the original runs at no length but 7, and verification tries others.
  save('fixed.onnx', attentionModel(-1, 'Qr', [node('Reshape', ['Q', 'shape'], ['Qr'])], [i64('shape', [1, 2, 7, 8])]));
  save('cls.onnx', classifierOnly());
  fs.writeFileSync(path.join(dir, 'per-head.json'), JSON.stringify({ s: [0.3, 0.4] }));
  fs.mkdirSync(path.join(dir, 'ext'));
  writeExternal(fs.readFileSync(path.join(dir, 'gpt2_past.onnx')), path.join(dir, 'ext'), 'm.onnx');
  fs.rmSync(path.join(dir, 'ext', 'm.onnx.data'));
  const llama = readModel(path.join(dir, 'llama_gqa.onnx'));
  writeModel(path.join(dir, 'llama.ssmax.onnx'), patchModel(llama, { trainLen: 64 }).model);
  // Wrong: each layer's s reaches its factor reversed along the heads.
  const broken = patchModel(llama, { s: [0.2, 0.25, 0.3, 0.35] }).model;
  reverseHeadsOfS(broken, 0);
  reverseHeadsOfS(broken, 1);
  writeModel(path.join(dir, 'broken.onnx'), broken);
  fs.writeFileSync(path.join(dir, 'exists.onnx'), 'mine');

  const cases: [ErrorCode, string[], RegExp][] = [
    ['output-exists', ['gpt2_past.onnx', '--s', '0.3', '-o', 'exists.onnx'], /exists\.onnx: already exists \(--force overwrites it\)/],
    ['bad-external-data', ['ext/m.onnx', '--s', '0.3', '-o', 'out.onnx'], /external data file 'm\.onnx\.data' not found/],
    ['no-attention', ['cls.onnx', '--s', '0.3'], /no attention Softmax found \(1 Softmax skipped/],
    ['attention-refused', ['refused.onnx', '--s', '0.3'], /Softmax over axis 2 of a rank-4 tensor.*--force-site sm patches a refused site anyway/],
    ['cannot-patch', ['flat.onnx', '--s-file', 'per-head.json'], /layer 0: per-head s given, but the head count is unknown/],
    ['already-patched', ['llama.ssmax.onnx', '--s', '0.3', '-o', 'twice.onnx'], /model is already patched .*--update-s/],
    ['not-patched', ['revert', 'gpt2_past.onnx', '-o', 'back.onnx'], /no SSMax patch in this model/],
    ['wrong-original', ['verify', 'gpt2_past.onnx', 'llama.ssmax.onnx'], /the patched model is not a patch of this original/],
    ['cannot-verify', ['fixed.onnx', '--s', '0.3', '--verify', '--checks', 'wiring'], /the original model fails on the synthesised inputs/],
    ['usage', ['gpt2_past.onnx', '--s', '0.3', '--verify'], /SSMAX_PATCH_RUNTIME must be node or web, got 'bogus'/],
    ['verify-failed', ['verify', 'llama_gqa.onnx', 'broken.onnx', '--checks', 'wiring,probe'], /verification FAILED/],
    ['strict-failed', ['verify', 'llama_gqa.onnx', 'llama.ssmax.onnx', '--strict', '--lengths', '16,32'], /--strict: liveness: no run longer than L = 64/],
  ];
  for (const [code, args, pattern] of cases) {
    it(`${code}: exit ${ERROR_CODES[code]}, the code in the JSON report, its message the one line on stderr, nothing written`, () => {
      const before = snapshot(dir);
      const env = code === 'usage' ? { ...process.env, SSMAX_PATCH_RUNTIME: 'bogus' } : process.env;
      const r = cli([...args, '--json'], { cwd: dir, env });
      assert.equal(r.code, ERROR_CODES[code], r.stderr);
      const doc = JSON.parse(r.stdout);
      assertValid(doc);
      assert.deepEqual([doc.exitCode, doc.status, doc.error.code], [ERROR_CODES[code], ERROR_CODES[code] === 1 ? 'failed' : 'error', code]);
      assert.match(doc.error.message, pattern);
      // verify prints FAILED in its own lines: its stderr has no error line (the JSON on stdout has it).
      if (args[0] !== 'verify' || ERROR_CODES[code] !== 1) assert.equal(r.stderr, `ssmax-patch: ${doc.error.message}\n`);
      assert.deepEqual(snapshot(dir), before, 'files in the folder changed');
    });
  }

  it("the README's loop over a folder skips the models without attention (exit 4) and stops on any other error", () => {
    const [loop] = blocks(section('Exit codes'), 'sh');
    const folder = tmpdir('ssmax-loop-');
    fs.mkdirSync(path.join(folder, 'models'));
    for (const f of ['gpt2_past.onnx', 'cls.onnx']) fs.copyFileSync(path.join(dir, f), path.join(folder, 'models', f));
    const r = runShell(loop, folder);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(fs.readdirSync(path.join(folder, 'patched')), ['gpt2_past.onnx']);
    assert.match(r.stderr, /^ssmax-patch: no attention Softmax found/m);
    fs.rmSync(path.join(folder, 'patched'), { recursive: true });
    fs.copyFileSync(path.join(dir, 'refused.onnx'), path.join(folder, 'models', 'refused.onnx'));
    const refused = runShell(loop, folder);
    assert.equal(refused.code, 2, 'refused attention is not skipped');
    assert.match(refused.stderr, /Softmax over axis 2 of a rank-4 tensor/);
  });
});

describe('the library\'s errors carry the same codes', () => {
  it('SsmaxError.code and exitCode, from the table the CLI uses', () => {
    const thrown = (fn: () => unknown): SsmaxError => {
      try {
        fn();
      } catch (e) {
        assert.ok(e instanceof SsmaxError, String(e));
        return e;
      }
      assert.fail('nothing thrown');
    };
    const none = thrown(() => patchModel(classifierOnly(), { s: 0.3 }));
    assert.deepEqual([none.code, none.exitCode], ['no-attention', 4]);
    const overflow = thrown(() => patchModel(readModel(path.join(TORCH, 'gpt2_past.onnx')), { s: 1e300 }));
    assert.deepEqual([overflow.code, overflow.exitCode], ['usage', 2]);
    assert.match(overflow.message, /option s: 1e\+300 overflows float32/);
    const large = thrown(() => writeModel(path.join(tmpdir(), 'big.onnx'), classifierOnly(), { maxProtobufBytes: 100 }));
    assert.equal(large.code, 'too-large');
    const theta = thrown(() => patchModel(readModel(path.join(TORCH, 'gpt2_past.onnx')), { trainLen: 64, prior: 'alibi', theta: { beta: 1e39 } }));
    assert.match(theta.message, /θbeta: 1e\+39 overflows float32/);
  });

  it('an error, printed or inspected as user code would, holds no invisible character (was: raw with U+2060 marks)', () => {
    const dir = tmpdir();
    const out = path.join(dir, 'model.ssmax.onnx');
    fs.writeFileSync(out, 'exists');
    let error: unknown;
    try {
      writeModel(out, classifierOnly());
    } catch (e) {
      error = e;
    }
    assert.ok(error instanceof SsmaxError);
    assert.equal(error.message, `${out}: already exists (option force overwrites it)`);
    assert.equal(error.cliMessage, `${out}: already exists (--force overwrites it)`);
    const shown = [inspect(error), JSON.stringify(error), String(error), ...Object.keys(error)].join('\n');
    assert.doesNotMatch(shown, /[\u2060\u2061]/);
    assert.doesNotMatch(shown, /\braw\b/);
  });

  it('an input cut short while it is copied is an io error, not an internal one (was: exit 3)', async () => {
    const dir = tmpdir();
    const input = path.join(dir, 'in.onnx');
    const m = classifierOnly();
    // Large enough to be copied in several chunks, between which the event loop runs.
    m.graph!.initializer.push(makeTensor('table', DataType.FLOAT, [1 << 20], new Array<number>(1 << 20).fill(0.5)));
    fs.writeFileSync(input, encodeModel(m));
    const writing = writeModelAsync(path.join(dir, 'out.onnx'), readModel(input));
    await new Promise((resolve) => setImmediate(resolve));
    fs.truncateSync(input, 1000);
    await assert.rejects(writing, (e: unknown) => e instanceof SsmaxError && e.code === 'io' && /in\.onnx: changed while being read/.test(e.message));
    assert.deepEqual(fs.readdirSync(dir), ['in.onnx'], 'a temporary file was left');
  });
});

describe('help', () => {
  it('bare: the help on stderr, exit 2 (an empty $MODEL in a script must not pass)', () => {
    const r = cli([]);
    assert.equal(r.code, 2);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /^Usage: ssmax-patch \[options\] \[command\]/);
    assert.match(r.stderr, /Exit codes: 0 done; 1 .*\n.*; 4 no attention to patch/);
    assert.equal(r.stderr, cli(['--help']).stdout, 'the same help as --help');
  });

  it('help bogus: one line, unknown command, no "(outputHelp)" (was: the whole help, then the leak)', () => {
    const r = cli(['help', 'bogus']);
    assert.equal(r.code, 2);
    assert.equal(r.stdout, '');
    assert.equal(r.stderr, "ssmax-patch: unknown command 'bogus' (commands: patch, verify, revert, calibrate) (see ssmax-patch --help)\n");
  });

  it('help help and help verify: the help asked for, exit 0', () => {
    const top = cli(['help', 'help']);
    assert.equal(top.code, 0, top.stderr);
    assert.equal(top.stdout, cli(['--help']).stdout);
    const verify = cli(['help', 'verify']);
    assert.equal(verify.code, 0, verify.stderr);
    assert.match(verify.stdout, /^Usage: ssmax-patch verify \[options\] <original> <patched>/);
  });

  it('a second model that exists is not suggested as -o (it would be overwritten); a new name is', () => {
    const dir = workdir();
    const before = sha(path.join(dir, 'llama_gqa.onnx'));
    const r = assertRefused(dir, ['gpt2_past.onnx', 'llama_gqa.onnx', '--s', '0.3'], /unexpected argument 'llama_gqa\.onnx': patch takes one model/);
    assert.doesNotMatch(r.stderr, /-o llama_gqa\.onnx/);
    assert.match(r.stderr, /llama_gqa\.onnx exists, so it is not taken for the output: patch one model per command; -o names a new output file/);
    assert.equal(sha(path.join(dir, 'llama_gqa.onnx')), before);
    assertRefused(dir, ['gpt2_past.onnx', 'new.onnx', '--s', '0.3'], /\(the output file is given with -o new\.onnx\)/);
    const revert = assertRefused(dir, ['revert', 'gpt2_past.onnx', 'llama_gqa.onnx'], /revert takes one model \(llama_gqa\.onnx exists/);
    assert.doesNotMatch(revert.stderr, /-o llama_gqa\.onnx/);
    const calibrate = assertRefused(dir, ['calibrate', 'gpt2_past.onnx', 'llama_gqa.onnx', '--train-len', '64'], /calibrate takes one model \(llama_gqa\.onnx exists/);
    assert.doesNotMatch(calibrate.stderr, /-o llama_gqa\.onnx/);
  });
});

describe('the docs list the codes', () => {
  it("the README's exit-code table has every code, with the exit it gives", () => {
    const text = section('Exit codes');
    const listed = new Map<string, number>();
    for (const row of text.split('\n').filter((l) => /^\| \d/.test(l))) {
      const exit = Number(/^\| (\d+)/.exec(row)![1]);
      for (const m of row.matchAll(/`([a-z-]+)`/g)) if (m[1] in ERROR_CODES) listed.set(m[1], exit);
    }
    assert.deepEqual(Object.fromEntries([...listed].sort()), Object.fromEntries(Object.entries(ERROR_CODES).sort()));
  });

  it('the report schema lists every code, and accepts each only with its exit code', () => {
    const schema = JSON.parse(fs.readFileSync(path.join(REPO, 'docs/report.schema.json'), 'utf8'));
    assert.deepEqual(schema.$defs.error.properties.code.enum, Object.keys(ERROR_CODES));
    const base = { schemaVersion: 2, tool: 'ssmax-patch', version: '0', command: 'revert', warnings: [], input: null, output: null, sites: [] };
    for (const [code, exit] of Object.entries(ERROR_CODES)) {
      for (const other of [1, 2, 3, 4]) {
        const doc = { ...base, status: other === 1 ? 'failed' : 'error', exitCode: other, error: { code, message: 'x' } };
        assert.equal(validate(doc), other === exit, `${code} with exit ${other}`);
      }
    }
  });
});
