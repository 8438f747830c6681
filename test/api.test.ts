/**
 * The library API as a user of the package meets it: typed options that refuse what they cannot mean at compile
 * time, a precomputed detection reused by patchModel, and detection rules a caller extends. The examples of
 * docs/api.md and the README run in a fresh project that installed the packed package: test/install.test.ts.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import {
  detectAttention, findAttentionSoftmax, InputError, modelScopes, ModelProto, patchModel, readModel, Rule, RULES, serializeModel, SsmaxError,
} from '../src/index';
import { removeScratch } from './support/io';
import { TORCH } from './support/ref';

after(removeScratch);

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
