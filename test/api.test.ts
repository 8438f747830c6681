/**
 * The library API as a user of the package meets it: typed options that refuse what they cannot mean at compile
 * time, a precomputed detection reused by patchModel, detection rules a caller extends, and the examples of
 * docs/api.md compiled and run against the built package from CommonJS and from an ES module.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import {
  detectAttention, findAttentionSoftmax, InputError, modelScopes, ModelProto, patchModel, readModel, Rule, RULES, serializeModel, SsmaxError,
} from '../src/index';
import { encodeModel } from '../src/io/model-file';
import { classifierOnly } from './support/build';
import { removeScratch, tmpdir } from './support/io';
import { TORCH } from './support/ref';

after(removeScratch);

const ROOT = path.resolve(__dirname, '../..');

/** Never called: the compiler holds these to the option types (an unused @ts-expect-error fails the build). */
export function optionTypes(m: ModelProto, e: SsmaxError): void {
  // @ts-expect-error an error code outside the list
  if (e.code === 'no-attentoin') return;
  // @ts-expect-error no such preset
  patchModel(m, { preset: 'bogus', trainLen: 64 });
  // @ts-expect-error no such n mode
  patchModel(m, { n: 'bogus', trainLen: 64 });
  // @ts-expect-error layers are numbers or { every }, not the command line's text
  patchModel(m, { layers: '3,7,11', trainLen: 64 });
  // @ts-expect-error s is a value, not a file
  patchModel(m, { sFile: 's.json' });
  // @ts-expect-error θ names are alpha, beta and mu
  patchModel(m, { prior: 'ggd', theta: { theta_alpha: 1 }, trainLen: 64 });
}

describe('a detection handed to patchModel', () => {
  const file = path.join(TORCH, 'gpt2_past.onnx');

  it('gives the same patch as detection inside patchModel', () => {
    const original = readModel(file);
    const detection = detectAttention(original, modelScopes(original));
    const given = patchModel(original, { trainLen: 64, detection });
    const own = patchModel(original, { trainLen: 64 });
    assert.ok(Buffer.from(serializeModel(given.model)).equals(Buffer.from(serializeModel(own.model))));
    assert.deepEqual(given.report, own.report);
  });

  it('of another model is refused', () => {
    const other = readModel(file);
    const detection = findAttentionSoftmax(other);
    assert.throws(() => patchModel(readModel(file), { trainLen: 64, detection }), (e) => e instanceof InputError && /names a node of another model/.test(e.message));
  });
});

describe('detection rules a caller adds', () => {
  it('a guard rule refuses the nodes of an op no built-in rule knows, in detection and in the patch', () => {
    const m = readModel(path.join(TORCH, 'gpt2_decoder.onnx'));
    const mine = m.graph!.node.find((n) => n.opType === 'Softmax')!;
    Object.assign(mine, { opType: 'MySoftmax', domain: 'my.domain' });
    m.opsetImport.push({ domain: 'my.domain', version: 1 });
    const guard: Rule = {
      name: 'guard/my-softmax',
      applies: (node) => node.opType === 'MySoftmax' && node.domain === 'my.domain',
      match: (_ctx, node) => ({ at: node, steps: 0, attention: true, reason: 'MySoftmax: patch the model before lowering' }),
    };
    assert.deepEqual(findAttentionSoftmax(m).skipped, [], 'without the rule the node is no candidate at all');
    const d = findAttentionSoftmax(m, { rules: [...RULES, guard] });
    assert.deepEqual(d.skipped.map((k) => [k.node, k.rule, k.reason, k.attention]), [[mine.name, 'guard/my-softmax', 'MySoftmax: patch the model before lowering', true]]);
    const { report } = patchModel(m, { trainLen: 64, rules: [...RULES, guard] });
    assert.deepEqual(report.sites.map((s) => s.layer), [1]);
    assert.equal(report.skipped.find((k) => k.node === mine.name)?.layer, 0);
  });
});

describe('docs/api.md examples, against the built package', () => {
  const doc = fs.readFileSync(path.join(ROOT, 'docs/api.md'), 'utf8');
  const block = (heading: string, lang: string): string => {
    const part = doc.slice(doc.indexOf(heading));
    const m = new RegExp('```' + lang + '\\n([\\s\\S]*?)```').exec(part);
    assert.ok(m, `docs/api.md: no ${lang} block under '${heading}'`);
    return m![1];
  };

  function project(): string {
    const dir = tmpdir('ssmax-api-');
    fs.mkdirSync(path.join(dir, 'node_modules'));
    fs.symlinkSync(ROOT, path.join(dir, 'node_modules', 'ssmax-patch'), 'dir');
    fs.symlinkSync(path.join(ROOT, 'node_modules', '@types'), path.join(dir, 'node_modules', '@types'), 'dir');
    return dir;
  }

  /** The TypeScript block under `heading` compiled under strict TypeScript as CommonJS: its folder, with example.js. */
  function compiled(heading: string): string {
    const dir = project();
    fs.writeFileSync(path.join(dir, 'example.ts'), block(heading, 'ts'));
    fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions: { module: 'commonjs', target: 'ES2022', strict: true, types: ['node'] }, files: ['example.ts'] }));
    const tsc = spawnSync(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', dir], { encoding: 'utf8' });
    assert.equal(tsc.status, 0, tsc.stdout + tsc.stderr);
    return dir;
  }

  it('the CommonJS example compiles under strict TypeScript and runs', () => {
    const dir = compiled('## Example (TypeScript or JavaScript, CommonJS)');
    const r = spawnSync(process.execPath, [path.join(dir, 'example.js')], { cwd: ROOT, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^2 Softmax sites, 0 fused operators\nlayer 0: n=causal-padding on query\nlayer 1: n=causal-padding on query\n$/);
  });

  it('the error example skips a model without attention by its code and stops on any other error', () => {
    const dir = compiled('## Example: errors a pipeline branches on');
    const gpt2 = path.join(dir, 'gpt2.onnx');
    const cls = path.join(dir, 'cls.onnx');
    const bad = path.join(dir, 'bad.onnx');
    fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), gpt2);
    fs.writeFileSync(cls, encodeModel(classifierOnly()));
    fs.writeFileSync(bad, 'not a model');
    const run = (...files: string[]) => spawnSync(process.execPath, [path.join(dir, 'example.js'), ...files], { cwd: ROOT, encoding: 'utf8' });
    const r = run(gpt2, cls);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, `${gpt2}: 2 sites patched\n${cls}: skipped (no-attention; the command line exits 4)\n`);
    assert.ok(fs.existsSync(path.join(dir, 'gpt2.ssmax.onnx')) && !fs.existsSync(path.join(dir, 'cls.ssmax.onnx')));
    const stopped = run(bad, gpt2);
    assert.notEqual(stopped.status, 0);
    assert.match(stopped.stderr, /bad\.onnx: not (a readable|an) ONNX model/);
    assert.equal(stopped.stdout, '', 'the loop stopped at the bad model');
  });

  it('the calibration example finds s on the quality model and its patch passes strict verification', () => {
    const dir = compiled('## Example: calibrate s, then verify');
    const r = spawnSync(process.execPath, [path.join(dir, 'example.js')], { cwd: ROOT, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^all: s = 0\.(49|50)\d, found in 4 runs\nstrict: PASSED\n$/);
  });

  it('the ES module example imports the named exports and runs', () => {
    const dir = project();
    fs.writeFileSync(path.join(dir, 'example.mjs'), block('## Example (ES module)', 'js'));
    const r = spawnSync(process.execPath, [path.join(dir, 'example.mjs')], { cwd: ROOT, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /s=\[0\.25,0\.3,0\.35,0\.4\]\nreverted exactly\n$/);
  });
});
