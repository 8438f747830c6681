/**
 * Suspicious choices get a warning on stderr and in the JSON report (issue 13): an explicit n mode that the
 * masks contradict, s far from 1/ln L for a stated training length, external data referenced from outside the
 * output's folder (onnxruntime refuses the model: checked). And --force-site globs and `all`.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { DataType } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { model, node, value } from './support/build';
import { CORPUS, corpusSkip, TORCH } from './support/ref';
import { cli, ortLoadError, removeScratch, tmpdir, writeExternal } from './support/io';

after(removeScratch);

interface Report { warnings: { code: string; message: string; sites?: string[] }[]; sites: { node: string; n: string }[] }

function patchJson(args: string[]): { report: Report; stderr: string } {
  const r = cli([...args, '--json', '--dry-run']);
  assert.equal(r.code, 0, r.stderr);
  return { report: JSON.parse(r.stdout), stderr: r.stderr };
}

/** Each warning is one stderr line with the prefix, the same text as in the report. */
function assertWarned(stderr: string, report: Report, codes: string[]): void {
  assert.deepEqual(report.warnings.map((w) => w.code), codes);
  assert.deepEqual(stderr.trim().split('\n').filter(Boolean), report.warnings.map((w) => `ssmax-patch: warning: ${w.message}`));
}

describe('warnings', () => {
  const bert = path.join(TORCH, 'bert_encoder.onnx');
  const gpt2 = path.join(TORCH, 'gpt2_past.onnx');

  it('--n causal on a bidirectional encoder, --n keys on a causal decoder; not when the mode agrees or is auto', () => {
    const onEncoder = patchJson([bert, '--train-len', '64', '--n', 'causal']);
    assertWarned(onEncoder.stderr, onEncoder.report, ['n-causal-on-bidirectional']);
    assert.deepEqual(onEncoder.report.warnings[0].sites, onEncoder.report.sites.map((s) => s.node));
    assert.match(onEncoder.report.warnings[0].message, /^--n causal on 2 attention sites whose masks are not causal \(e\.g\. \/encoder\/layer\.0\/attention\/self\/Softmax: /);
    const onDecoder = patchJson([gpt2, '--train-len', '64', '--n', 'keys']);
    assertWarned(onDecoder.stderr, onDecoder.report, ['n-keys-on-causal']);
    assert.match(onDecoder.report.warnings[0].message, /every row gets n = Tk/);
    const padding = patchJson([gpt2, '--train-len', '64', '--n', 'padding']);
    assertWarned(padding.stderr, padding.report, ['n-keys-on-causal']);
    for (const args of [[bert, '--n', 'keys'], [gpt2, '--n', 'causal'], [bert], [gpt2], [bert, '--n', 'mask']]) {
      const quiet = patchJson([...args, '--train-len', '64']);
      assertWarned(quiet.stderr, quiet.report, []);
    }
  });

  it('s·ln L outside 0.8–1.25 for the stated --train-len, per head from an s file too', () => {
    const far = patchJson([bert, '--train-len', '64', '--s', '0.5']);
    assertWarned(far.stderr, far.report, ['s-far-from-train-len']);
    assert.match(far.report.warnings[0].message, /^s·ln 64 is 2\.08 for 2 of 2 s values \(outside 0\.8–1\.25\)/);
    // 0.25·ln 64 = 1.04: close enough, no warning; --train-len alone gives exactly 1.
    const close = patchJson([bert, '--train-len', '64', '--s', '0.25']);
    assertWarned(close.stderr, close.report, []);
    const dir = tmpdir('ssmax-warn-');
    const sFile = path.join(dir, 's.json');
    fs.writeFileSync(sFile, JSON.stringify({ s: [[0.24, 0.24, 0.24, 0.1], [0.24, 0.24, 0.24, 0.24]] }));
    const perHead = patchJson([bert, '--train-len', '64', '--s-file', sFile]);
    assertWarned(perHead.stderr, perHead.report, ['s-far-from-train-len']);
    assert.match(perHead.report.warnings[0].message, /^s·ln 64 is 0\.416 for 1 of 8 s values/);
    assert.deepEqual(perHead.report.warnings[0].sites, ['/encoder/layer.0/attention/self/Softmax']);
  });

  it('verify --train-len far from the patch\'s s warns as well', () => {
    const dir = tmpdir('ssmax-warn-');
    const out = path.join(dir, 'p.onnx');
    assert.equal(cli([bert, '--s', '0.5', '-o', out]).code, 0);
    const r = cli(['verify', bert, out, '--train-len', '64', '--checks', 'wiring', '--json']);
    assert.equal(r.code, 0, r.stderr);
    assertWarned(r.stderr, JSON.parse(r.stdout), ['s-far-from-train-len']);
  });

  it('--external-data reference outside the output folder: a warning, and onnxruntime indeed refuses that output', async () => {
    const dir = tmpdir('ssmax-warn-');
    const input = writeExternal(Buffer.from(encodeModel(smallTransformer({ layers: 1, d: 16, heads: 2, ff: 16, vocab: 50, tmax: 16 }))), dir, 'm.onnx');
    const outDir = path.join(tmpdir('ssmax-warn-out-'), 'sub');
    fs.mkdirSync(outDir);
    const out = path.join(outDir, 'out.onnx');
    const r = cli([input, '--train-len', '8', '-o', out, '--external-data', 'reference', '--json']);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout);
    assertWarned(r.stderr, report, ['external-data-reference']);
    assert.match(report.warnings[0].message, /refers to \.\.\/.*m\.onnx\.data, outside its folder; onnxruntime 1\.30 refuses/);
    assert.match(String(await ortLoadError(out)), /.+/, 'onnxruntime loaded a model the warning says it refuses');
    const copied = cli([input, '--train-len', '8', '-o', path.join(outDir, 'copied.onnx')]);
    assert.equal(copied.code, 0, copied.stderr);
    assert.equal(copied.stderr, '', 'the default (copy) warns about nothing');
    assert.equal(await ortLoadError(path.join(outDir, 'copied.onnx')), null);
  });
});

describe('--force-site patterns', () => {
  /** Three refused com.microsoft GroupQueryAttention nodes (softcap) and one plain one. */
  function refusedModel(dir: string): string {
    const attn = (name: string, y: string, attrs: Record<string, number>) => ({
      ...node('GroupQueryAttention', ['Q', 'K', 'V', '', '', 'seqlens_k', 'total'], [y], { num_heads: 2, kv_num_heads: 2, ...attrs }, name), domain: 'com.microsoft',
    });
    const m = model({
      nodes: [attn('enc/cap_0', 'Y0', { softcap: 30.5 }), attn('enc/cap_1', 'Y1', { softcap: 30.5 }), attn('dec/cap_0', 'Y2', { softcap: 30.5 }), attn('plain', 'Y3', {})],
      inputs: [...['Q', 'K', 'V'].map((n) => value(n, DataType.FLOAT, [1, 'S', 16])), value('seqlens_k', DataType.INT32, [1]), value('total', DataType.INT32, [])],
      outputs: ['Y0', 'Y1', 'Y2', 'Y3'].map((n) => value(n, DataType.FLOAT, [])),
    });
    m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
    const file = path.join(dir, 'refused.onnx');
    fs.writeFileSync(file, encodeModel(m));
    return file;
  }
  const dir = tmpdir('ssmax-force-glob-');
  const input = refusedModel(dir);
  const forced = (...patterns: string[]): string[] =>
    patchJson([input, '--s', '0.3', ...patterns.flatMap((p) => ['--force-site', p])]).report.sites.map((s) => s.node);

  it('a glob forces the refused nodes it matches; all forces every one; names still work', () => {
    assert.deepEqual(forced('enc/*'), ['enc/cap_0', 'enc/cap_1', 'plain']);
    assert.deepEqual(forced('*/cap_?'), ['enc/cap_0', 'enc/cap_1', 'dec/cap_0', 'plain']);
    assert.deepEqual(forced('all'), ['enc/cap_0', 'enc/cap_1', 'dec/cap_0', 'plain']);
    assert.deepEqual(forced('dec/cap_0', 'enc/cap_1'), ['enc/cap_1', 'dec/cap_0', 'plain']);
  });

  it('a glob that matches nothing is a usage error naming the refused nodes; all with nothing refused warns', () => {
    const r = cli([input, '--s', '0.3', '--dry-run', '--force-site', 'cap*']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /^ssmax-patch: --force-site cap\*: matches no refused attention node \(refused: enc\/cap_0, enc\/cap_1, dec\/cap_0\) \(see ssmax-patch patch --help\)\n$/);
    const none = patchJson([path.join(TORCH, 'bert_encoder.onnx'), '--s', '0.3', '--force-site', 'all']);
    assertWarned(none.stderr, none.report, ['force-site-none']);
  });

  const greedy = path.join(CORPUS, 'ort_tiny_gpt2_greedysearch_with_init_decoder.onnx');
  it('GreedySearch (corpus): its 10 causal Attention nodes need no forcing now (expanded); all warns that nothing was refused', { skip: corpusSkip(path.basename(greedy)) }, () => {
    const sites = patchJson([greedy, '--s', '0.4']).report.sites;
    assert.equal(sites.length, 10);
    const all = patchJson([greedy, '--s', '0.4', '--force-site', 'all']);
    assert.deepEqual(all.report.sites, sites);
    assertWarned(all.stderr, all.report, ['force-site-none']);
  });
});
