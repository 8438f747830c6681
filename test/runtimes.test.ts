/**
 * The two onnxruntime packages verification runs on (issue 25): onnxruntime-node where the project installed it,
 * else onnxruntime-web's WebAssembly backend, picked with SSMAX_PATCH_RUNTIME here. On models of each kind (plain-op
 * attention, com.microsoft Attention with a past, ONNX Attention with softcap, weights in a data file, and a patch
 * broken on purpose) both give the same verdict for every check, and every report names the one that ran.
 * `npm run bench -- runtimes` compares them over every fixture and the corpus.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { readModel, writeModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { assertOneLineError, cli, CliResult, removeScratch, tmpdir } from './support/io';
import { FIXTURES, TORCH } from './support/ref';
import { reverseHeadsOfS } from './support/tamper';

after(removeScratch);

const on = (runtime: string): NodeJS.ProcessEnv => ({ ...process.env, SSMAX_PATCH_RUNTIME: runtime });

interface Verdict { exit: number; checks: Record<string, string>; runtime: { name: string; version: string; reason?: string } }

function verdict(r: CliResult): Verdict {
  const doc = JSON.parse(r.stdout);
  // verify prints the verification at the top level, patch --verify under `verification`.
  const report = doc.verification ?? doc;
  const checks = Object.fromEntries(report.checks.map((c: { id: string; status: string }) => [c.id, c.status]));
  return { exit: r.code, checks, runtime: report.runtime };
}

/** A folder with the llama fixture, its patch in a data file of its own, and a patch whose per-head s the graph applies reversed. */
function models(): { original: string; external: string; patched: string; broken: string } {
  const dir = tmpdir('ssmax-runtimes-');
  const model = readModel(path.join(TORCH, 'llama_gqa.onnx'));
  const external = path.join(dir, 'external.onnx');
  writeModel(external, patchModel(model, { trainLen: 16 }).model, { maxProtobufBytes: 120 * 1024 });
  assert.ok(fs.existsSync(`${external}.data`), 'written with external data');
  const patched = path.join(dir, 'patched.onnx');
  writeModel(patched, patchModel(model, { s: [0.2, 0.25, 0.3, 0.35] }).model);
  const broken = patchModel(model, { s: [0.2, 0.25, 0.3, 0.35] }).model;
  for (const layer of [0, 1]) reverseHeadsOfS(broken, layer);
  writeModel(path.join(dir, 'broken.onnx'), broken);
  return { original: path.join(TORCH, 'llama_gqa.onnx'), external, patched, broken: path.join(dir, 'broken.onnx') };
}

describe('onnxruntime-node and onnxruntime-web', () => {
  const m = models();
  // Short sweeps: the WebAssembly backend takes about four times as long as the native one.
  const lengths = ['--lengths', '16,64,128'];
  const cases: [string, string[]][] = [
    ['plain-op attention with a KV cache (gpt2_past)', [path.join(TORCH, 'gpt2_past.onnx'), '--train-len', '64', '--verify', '--dry-run', ...lengths]],
    ['com.microsoft Attention with a past', [path.join(FIXTURES, 'ms_attention/gpt2_causal_past.onnx'), '--train-len', '64', '--verify', '--dry-run', ...lengths]],
    ['ONNX Attention expanded for its qk output', [path.join(FIXTURES, 'onnx_attention/qk_output_mode0.onnx'), '--train-len', '64', '--verify', '--dry-run', ...lengths]],
    ['weights in a data file, loaded from files', ['verify', m.original, m.external, '--lengths', '4,16,64']],
    ['a patch whose s the graph applies to the wrong heads', ['verify', m.original, m.broken, ...lengths]],
  ];
  for (const [label, args] of cases) {
    it(`${label}: the same verdict for every check`, () => {
      const node = verdict(cli([...args, '--json'], { env: on('node') }));
      const web = verdict(cli([...args, '--json'], { env: on('web') }));
      assert.deepEqual(node.runtime, { name: 'onnxruntime-node', version: '1.30.0' });
      assert.deepEqual(web.runtime, { name: 'onnxruntime-web', version: '1.30.0', reason: 'SSMAX_PATCH_RUNTIME=web' });
      assert.deepEqual({ exit: web.exit, checks: web.checks }, { exit: node.exit, checks: node.checks });
      if (label.startsWith('a patch whose')) assert.equal(web.checks.probe, 'FAILED', 'the broken patch must fail on both');
      else assert.ok(Object.values(web.checks).includes('PASSED'), JSON.stringify(web.checks));
    });
  }

  it('the same patch applied right: the same lines but the last, which names the runtime, as the JUnit file does', () => {
    const dir = tmpdir('ssmax-runtimes-out-');
    const args = ['verify', m.original, m.patched, ...lengths];
    const web = cli([...args, '--junit', path.join(dir, 'web.xml')], { env: on('web') });
    const node = cli([...args, '--junit', path.join(dir, 'node.xml')]);
    assert.equal(web.code, 0, web.stderr);
    assert.equal(node.code, 0, node.stderr);
    const last = /\nverify: PASSED \(4 passed, 1 skipped\) in \d+\.\d s on (.*)\n/;
    assert.equal(last.exec(web.stdout)?.[1], 'onnxruntime-web 1.30.0 (WebAssembly; SSMAX_PATCH_RUNTIME=web)', web.stdout);
    assert.equal(last.exec(node.stdout)?.[1], 'onnxruntime-node 1.30.0', node.stdout);
    // Each check's line names its verdict; the probe's worst relative error may differ in the last digit.
    const verdicts = (out: string): string[] => out.split('\n').filter((l) => l.startsWith('  ')).map((l) => l.replace(/\d\.\de-\d+/g, '#'));
    assert.deepEqual(verdicts(web.stdout), verdicts(node.stdout));
    assert.match(fs.readFileSync(path.join(dir, 'web.xml'), 'utf8'), /<property name="runtime" value="onnxruntime-web 1\.30\.0 \(WebAssembly; SSMAX_PATCH_RUNTIME=web\)"\/>/);
    assert.match(fs.readFileSync(path.join(dir, 'node.xml'), 'utf8'), /<property name="runtime" value="onnxruntime-node 1\.30\.0"\/>/);
  });

  it('an unknown SSMAX_PATCH_RUNTIME is a one-line error before any model is read', () => {
    assertOneLineError(cli(['verify', m.original, m.patched], { env: on('gpu') }), 2, /^ssmax-patch: SSMAX_PATCH_RUNTIME must be node or web, got 'gpu'/);
  });
});
