/**
 * One analysis per model: `patch --verify` checks the graph once, runs detection once over each graph of the
 * original and builds the original's scopes once; verify alone does the same. The calls are counted where the tool
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
  const write = mock.method(process.stdout, 'write', () => true);
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
    assert.equal(await main(['patch', input, '--train-len', '64', '-o', out, '--quiet', '--json']), 0);
    const { code, counts } = await counted(['verify', input, out, '--checks', 'wiring,probe', '--json']);
    assert.equal(code, 0);
    assert.equal(counts.validations.length, 1, 'validateGraph calls');
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
