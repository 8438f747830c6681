/**
 * One analysis per model: `patch --verify` checks the graph once, runs detection once over each graph of the
 * original and builds the original's scopes once; verify and calibrate alone do the same. The calls are counted where the tool
 * makes them (the modules' own exports, spied on, the real functions still run).
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, it, mock } from 'node:test';
import { main } from '../src/cli/main';
import * as rules from '../src/detect/rules';
import * as scopes from '../src/graph/scopes';
import * as validate from '../src/graph/validate';
import { readModel } from '../src/io/model-file';
import type { ModelProto } from '../src/io/onnx';
import { TORCH } from './support/ref';
import { qualityModel } from '../bench/quality';
import { TASK } from '../bench/quality-data';

interface Counts { validations: unknown[]; scopeBuilds: ModelProto[]; ruleRuns: Map<string, number> }

/** Runs the CLI in this process with the three functions spied on; the counts of that run. */
async function counted(argv: string[]): Promise<{ code: number; counts: Counts }> {
  const counts: Counts = { validations: [], scopeBuilds: [], ruleRuns: new Map() };
  const [validateGraph, modelScopes, runRules] = [validate.validateGraph, scopes.modelScopes, rules.runRules];
  const v = mock.method(validate, 'validateGraph', (g: Parameters<typeof validateGraph>[0]) => {
    counts.validations.push(g);
    return validateGraph(g);
  });
  const s = mock.method(scopes, 'modelScopes', (m: ModelProto) => {
    counts.scopeBuilds.push(m);
    return modelScopes(m);
  });
  const r = mock.method(rules, 'runRules', (...args: Parameters<typeof runRules>) => {
    const [, ctx, node] = args;
    const key = `${ctx.scope.path}\u0000${node.name}\u0000${node.output[0]}`;
    counts.ruleRuns.set(key, (counts.ruleRuns.get(key) ?? 0) + 1);
    return runRules(...args);
  });
  // The CLI writes strings; the test runner's child reports its events as serialised buffers, which must pass.
  const realWrite = process.stdout.write.bind(process.stdout);
  const write = mock.method(process.stdout, 'write', (chunk: unknown, ...rest: never[]) => (typeof chunk === 'string' ? true : realWrite(chunk as Uint8Array, ...rest)));
  try {
    return { code: await main(argv), counts };
  } finally {
    write.mock.restore();
    v.mock.restore();
    s.mock.restore();
    r.mock.restore();
  }
}

describe('one analysis per model', () => {
  let dir = '';
  const input = path.join(TORCH, 'gpt2_past.onnx');
  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-analysis-'));
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('patch --verify: the graph checked once, each candidate node detected once, the original\'s scopes built once', async () => {
    const out = path.join(dir, 'p.onnx');
    const { code, counts } = await counted(['patch', input, '--train-len', '64', '--verify', '--checks', 'wiring,probe', '-o', out, '--quiet', '--json']);
    assert.equal(code, 0);
    assert.equal(counts.validations.length, 1, 'validateGraph calls');
    assert.ok(counts.ruleRuns.size >= 2, 'the two attention Softmax nodes at least are candidates');
    assert.deepEqual([...counts.ruleRuns].filter(([, n]) => n !== 1), [], 'candidates detected more than once');
    // The original is the model read from the file: the first model whose scopes are built.
    const original = counts.scopeBuilds[0];
    assert.equal(counts.scopeBuilds.filter((m) => m === original).length, 1, 'scopes of the original built once');
  });

  it('verify: the original analysed once', async () => {
    const out = path.join(dir, 'v.onnx');
    // Through counted for its stdout: the JSON document would otherwise land in the test runner's TAP stream.
    assert.equal((await counted(['patch', input, '--train-len', '64', '-o', out, '--quiet', '--json'])).code, 0);
    const { code, counts } = await counted(['verify', input, out, '--checks', 'wiring,probe', '--json']);
    assert.equal(code, 0);
    assert.equal(counts.validations.length, 1, 'validateGraph calls');
    assert.deepEqual([...counts.ruleRuns].filter(([, n]) => n !== 1), [], 'candidates detected more than once');
    assert.equal(counts.scopeBuilds.filter((m) => m === counts.scopeBuilds[0]).length, 1, 'scopes of the original built once');
  });

  it('calibrate: the original analysed once (its two patches and verification\'s setup reuse the analysis)', async () => {
    const rope = qualityModel('rope-s0');
    const out = path.join(dir, 'c.onnx');
    const { code, counts } = await counted(['calibrate', rope, '--train-len', String(TASK.trainLen), '--max-runs', '2', '-o', out, '--json', '--quiet']);
    assert.equal(code, 0);
    assert.equal(counts.validations.length, 1, 'validateGraph calls');
    assert.ok(counts.ruleRuns.size >= 2, 'the attention Softmax nodes at least are candidates');
    assert.deepEqual([...counts.ruleRuns].filter(([, n]) => n !== 1), [], 'candidates detected more than once');
    assert.equal(counts.scopeBuilds.filter((m) => m === counts.scopeBuilds[0]).length, 1, 'scopes of the original built once');
  });

  it('a library caller\'s analysis of another model is refused, not silently reused', async () => {
    const { analyseModel } = await import('../src/analysis/analyse');
    const { patchModel } = await import('../src/rewrite/patch');
    const model = readModel(input);
    assert.throws(() => patchModel(model, { trainLen: 64, analysis: analyseModel(readModel(input)) }), /analysis given to patchModel is of another model/);
    assert.equal(patchModel(model, { trainLen: 64, analysis: analyseModel(model) }).report.sites.length, 2);
  });
});
