/**
 * Mutates model files thousands of times (deterministic seed, bounded count and time) and runs each through
 * read → patch → write, as the CLI does. Asserts: every failure is an InputError with a one-line message (no
 * crash, no hang), nothing is written on error, the input is never modified, and every model written loads
 * in onnxruntime — or, when it does not, the mutated input does not load either (the damage came in with it).
 *
 * SSMAX_FUZZ_SEED and SSMAX_FUZZ_COUNT run other or longer sequences.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { smallTransformer } from '../bench/transformer';
import { InputError } from '../src/errors';
import { encodeModel, readModel, writeModel } from '../src/io/model-file';

import { patchModel } from '../src/rewrite/patch';
import { rng } from '../src/verify/inputs';
import { revertModel } from '../src/rewrite/revert';
import { ortLoadError, removeScratch, sha, tmpdir } from './support/io';
import { TORCH } from './support/ref';

const SEED = Number(process.env.SSMAX_FUZZ_SEED ?? 20250129);
const COUNT = Number(process.env.SSMAX_FUZZ_COUNT ?? 3000);
/** The run stops early after this long, so CI time stays bounded on a slow machine. */
const BUDGET_MS = Number(process.env.SSMAX_FUZZ_BUDGET_MS ?? 50_000);
const MIN_COUNT = Math.min(COUNT, 1000);

type Mutation = (b: Buffer, r: () => number, other: Buffer) => Buffer;
const at = (b: Buffer, r: () => number): number => Math.floor(r() * b.length);

const mutations: [string, Mutation][] = [
  ['flip bits', (b, r) => {
    const c = Buffer.from(b);
    for (let k = 1 + Math.floor(r() * 3); k > 0; k--) { const i = at(c, r); c[i] ^= 1 << Math.floor(r() * 8); }
    return c;
  }],
  ['flip a bit in the first 2 KB', (b, r) => {
    const c = Buffer.from(b);
    const i = Math.floor(r() * Math.min(2048, c.length));
    c[i] ^= 1 << Math.floor(r() * 8);
    return c;
  }],
  ['set a byte', (b, r) => {
    const c = Buffer.from(b);
    c[at(c, r)] = [0, 0xff, 0x80, 0x7f, 0x08, 0x0a, 0x12][Math.floor(r() * 7)];
    return c;
  }],
  ['truncate', (b, r) => b.subarray(0, at(b, r))],
  ['delete a range', (b, r) => { const i = at(b, r); return Buffer.concat([b.subarray(0, i), b.subarray(i + 1 + Math.floor(r() * 16))]); }],
  ['insert bytes', (b, r) => {
    const i = at(b, r);
    const extra = Buffer.from(Array.from({ length: 1 + Math.floor(r() * 8) }, () => Math.floor(r() * 256)));
    return Buffer.concat([b.subarray(0, i), extra, b.subarray(i)]);
  }],
  ['huge varint', (b, r) => { const c = Buffer.from(b); c.set([0xff, 0xff, 0xff, 0xff, 0x0f], Math.max(0, at(c, r) - 5)); return c; }],
  ['duplicate a range', (b, r) => { const i = at(b, r); const j = Math.min(b.length, i + 1 + Math.floor(r() * 64)); return Buffer.concat([b.subarray(0, j), b.subarray(i, j), b.subarray(j)]); }],
  ['splice two models', (b, r, other) => Buffer.concat([b.subarray(0, at(b, r)), other.subarray(at(other, r))])],
];

function bases(): Buffer[] {
  const tiny = Buffer.from(encodeModel(smallTransformer({ layers: 1, d: 8, heads: 2, ff: 8, vocab: 10, tmax: 8 })));
  const small = Buffer.from(encodeModel(smallTransformer({ layers: 2, d: 16, heads: 4, ff: 16, vocab: 20, tmax: 16 })));
  const torch = ['bert_encoder', 'gpt2_past'].map((n) => fs.readFileSync(path.join(TORCH, `${n}.onnx`)));
  return [tiny, tiny, small, small, ...torch];
}

describe('fuzz: mutated models through read → patch → write', () => {
  after(removeScratch);
  it(`${COUNT} mutations from seed ${SEED}: no crash, no hang, no output on error, every output loads`, { timeout: Math.max(150_000, BUDGET_MS + 60_000) }, async () => {
    const r = rng(SEED);
    const models = bases();
    const dir = tmpdir('ssmax-fuzz-');
    const input = path.join(dir, 'in.onnx');
    const output = path.join(dir, 'out.onnx');
    const tally = { written: 0, refused: 0, inheritedLoadFailures: 0, reverted: 0 };
    const started = Date.now();
    let i = 0;
    for (; i < COUNT && (i < MIN_COUNT || Date.now() - started < BUDGET_MS); i++) {
      const base = models[Math.floor(r() * models.length)];
      const [what, mutate] = mutations[Math.floor(r() * mutations.length)];
      const bytes = mutate(base, r, models[Math.floor(r() * models.length)]);
      fs.writeFileSync(input, bytes);
      const before = sha(input);
      const where = `iteration ${i} (seed ${SEED}, ${what})`;
      const t0 = Date.now();
      let wrote = false;
      try {
        const { model } = patchModel(readModel(input), { trainLen: 16 });
        writeModel(output, model, { protect: [input] });
        wrote = true;
      } catch (e) {
        assert.ok(e instanceof InputError, `${where}: not an InputError: ${(e as Error)?.stack ?? e}`);
        assert.doesNotMatch(e.message, /\n/, `${where}: message of more than one line`);
        tally.refused++;
      }
      assert.ok(Date.now() - t0 < 10_000, `${where}: took ${Date.now() - t0} ms`);
      assert.equal(sha(input), before, `${where}: input modified`);
      assert.deepEqual(fs.readdirSync(dir).sort(), wrote ? ['in.onnx', 'out.onnx'] : ['in.onnx'], `${where}: stray files`);
      if (!wrote) continue;
      tally.written++;
      const error = await ortLoadError(output);
      if (error) {
        const inputError = await ortLoadError(input);
        assert.ok(inputError !== null, `${where}: the output does not load (${error}) but the mutated input does`);
        tally.inheritedLoadFailures++;
      } else if (tally.written % 10 === 0) {
        // Every tenth good output is reverted and must load too.
        const reverted = path.join(dir, 'reverted.onnx');
        writeModel(reverted, revertModel(readModel(output)).model);
        assert.equal(await ortLoadError(reverted), null, `${where}: the reverted output does not load`);
        fs.rmSync(reverted);
        tally.reverted++;
      }
      fs.rmSync(output);
    }
    process.stdout.write(`# fuzz: ${i} mutations in ${Date.now() - started} ms: ${tally.written} written (${tally.inheritedLoadFailures} do not load, like their inputs; ${tally.reverted} reverted), ${tally.refused} refused\n`);
    assert.ok(i >= MIN_COUNT);
    assert.ok(tally.written > 0 && tally.refused > 0);
  });
});
