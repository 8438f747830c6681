/**
 * The self-test matrix of issue 9: a verdict a CI can gate on.
 *
 * No false failures: every torch fixture × every preset (ssmax, bias, qwen-logn, llama4) × every n mode the
 * patch accepts, scalar / per-head / per-layer s, a --layers subset and an --update-s, plus the fused-operator
 * and subgraph models (test/support/verify-models.ts) and a sample of the corpus: strict verification passes.
 * A combination the patch refuses (--n mask without a mask, a prior where the head count is unknown) does not
 * apply; the refusals are exactly the ones listed in EXPECTED_REFUSALS, so a refusal cannot hide a broken patch.
 *
 * No false passes: wrong patches made from right ones (test/support/tamper.ts): every one fails, and a failing
 * check names the site.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { Graph } from '../src/graph/graph';
import { modelScopes } from '../src/graph/scopes';
import { makeTensor } from '../src/graph/tensor';
import { topoSort } from '../src/graph/toposort';
import { readModel } from '../src/io/model-file';
import { DataType, ModelProto, toNumber } from '../src/io/onnx';
import { nodeKey } from '../src/rewrite/journal';
import { cloneModel, patchModel, PatchOptions } from '../src/rewrite/patch';
import { readRecord, writeRecord } from '../src/rewrite/record';
import { revertModel } from '../src/rewrite/revert';
import { verifyPatch, VerifyOptions, VerifyReport } from '../src/verify/verify';
import { CORPUS, corpusSkip, TORCH } from './support/ref';
import * as models from './support/verify-models';
import { doubleN, moveFactorToLogits, nPlusOne, reverseHeadsOfS } from './support/tamper';

const L = 16;
const STRICT: VerifyOptions = { strict: true, lengths: [4, L, 4 * L] };
const fixtures = fs.readdirSync(TORCH).filter((f) => f.endsWith('.onnx')).sort();
const tally = { cases: 0, passed: 0, notApplicable: 0, mutations: 0, caught: 0, refused: [] as string[] };

/** Every combination the patch refuses, by `<model> <options>`, with its reason: nothing else may be refused. */
const EXPECTED_REFUSALS: Record<string, RegExp> = {
  'attn_functions.onnx {"trainLen":16,"layers":[0]}': /selects layer 0 but not layer\(s\) 1, which call the same function 'FnAttention'/,
  'classifier.onnx {"trainLen":16,"n":"mask"}': /layer 0: option n \(mask\) needs a mask on the logits/,
  'attn_functions.onnx {"trainLen":16,"n":"mask"}': /layer 0: option n \(mask\) needs a mask on the logits/,
  'loopModel {"trainLen":16,"prior":"ggd","theta":{"alpha":-0.4,"beta":0.8,"mu":0.3}}': /main\/Loop.body: a positional prior needs the head count/,
  'loopModel {"preset":"none","prior":"alibi"}': /main\/Loop.body: a positional prior needs the head count/,
  'loopModel per-head s': /head count is unknown/,
  'scanModel {"trainLen":16,"prior":"ggd","theta":{"alpha":-0.4,"beta":0.8,"mu":0.3}}': /main\/Scan.body: a positional prior needs the head count/,
  'scanModel {"preset":"none","prior":"alibi"}': /main\/Scan.body: a positional prior needs the head count/,
  'scanModel per-head s': /head count is unknown/,
};
/** The sliding windows the matrix patches with: with SSMax (n through the window), and alone (W + S below its longest run). */
const WINDOWS: PatchOptions[] = [{ trainLen: 16, window: 6, sinks: 1 }, { preset: 'none', window: 8, sinks: 2 }];
/** Fixtures with a site that attends to every key (or every unpadded key): a causal window is refused there. */
const NOT_CAUSAL: Record<string, RegExp> = {
  'attn_functions.onnx': /layer 0 of function .*: option window is a causal sliding window, and this site attends to every key \(/,
  'classifier.onnx': /layer 0: option window is a causal sliding window, and this site attends to every key \(/,
  'torch_decoder.onnx': /layer 1: .* attends to every key its padding leaves/,
  ...Object.fromEntries(['bert_encoder', 'einsum_encoder', 'encoder_3d', 'fairseq_encoder', 'torch_encoder'].map((f) => [`${f}.onnx`, /layer 0: .* attends to every key its padding leaves/])),
};
for (const [file, why] of Object.entries(NOT_CAUSAL)) for (const o of WINDOWS) EXPECTED_REFUSALS[`${file} ${JSON.stringify(o)}`] = why;
const refusals = new Map<string, string>();

function refuse(label: string, reason: string): void {
  tally.notApplicable++;
  tally.refused.push(`${label}: ${reason}`);
  refusals.set(label, reason);
}

after(() => {
  process.stdout.write(`# matrix: ${tally.cases} strict verifications of correct patches, ${tally.passed} passed, `
    + `${tally.notApplicable} combinations the patch refuses (${tally.refused.join('; ')}); ${tally.mutations} wrong patches, ${tally.caught} failed\n`);
});

const explain = (r: VerifyReport): string => [...r.checks.map((c) => `${c.status} ${c.name}: ${c.summary}`), ...r.unverified.map((u) => `unverified: ${u}`)].join('\n');

/** Patches and verifies strictly; a patch the tool refuses does not apply (returns false). */
async function strictPasses(model: string, original: ModelProto, options: PatchOptions, update?: PatchOptions): Promise<boolean> {
  let patched: ModelProto;
  try {
    patched = patchModel(original, options).model;
    if (update) patched = patchModel(patched, { ...update, updateS: true }).model;
  } catch (e) {
    if (!(e instanceof InputError)) throw e;
    refuse(`${model} ${JSON.stringify(options)}`, e.message);
    return false;
  }
  tally.cases++;
  // An update is verified against its input without the earlier patch, as --update-s --verify does.
  const baseline = update ? revertModel(patchModel(original, options).model).model : original;
  const r = await verifyPatch(baseline, patched, STRICT);
  assert.equal(r.passed, true, explain(r));
  tally.passed++;
  return true;
}

/** s per head of every site of the main graph, from the patch report of a scalar patch. */
function headCounts(m: ModelProto): number[] {
  return patchModel(m, { trainLen: L }).report.sites.map((s) => s.heads ?? 0);
}

/** θ of a prior away from neutral (the same at every head, so it fits every head count). */
const THETA = { alpha: -0.4, beta: 0.8, mu: 0.3 };

const PRESETS: [string, PatchOptions][] = [
  ['ssmax', { trainLen: L }], ['bias', { trainLen: L, b: 0.2 }], ['qwen-logn', { preset: 'qwen-logn', trainLen: L }], ['llama4', { preset: 'llama4', floorScale: 8 }],
  ['ssmax + ggd prior', { trainLen: L, prior: 'ggd', theta: THETA }], ['none + alibi prior', { preset: 'none', prior: 'alibi' }],
  ['none + neutral ggd prior', { preset: 'none', prior: 'ggd' }],
  ['ssmax + window', WINDOWS[0]], ['none + window', WINDOWS[1]],
];

describe('no false failures: strict verification of correct patches', () => {
  for (const file of fixtures) {
    describe(file, () => {
      const original = readModel(path.join(TORCH, file));
      for (const [name, options] of PRESETS) it(`--preset ${name}`, async () => { await strictPasses(file, original, options); });
      for (const n of ['keys', 'causal', 'mask'] as const) it(`--n ${n}`, async () => { await strictPasses(file, original, { trainLen: L, n }); });
      it('per-head and per-layer s', async () => {
        const heads = headCounts(original);
        if (heads.some((h) => h === 0)) {
          refuse(`${file} per-head s`, 'a head count is unknown');
          return;
        }
        const row = (h: number, k: number): number[] => Array.from({ length: h }, (_, i) => 0.25 + 0.05 * i + 0.02 * k);
        await strictPasses(file, original, { s: row(heads[0], 0) });
        await strictPasses(file, original, { s: heads.map((h, k) => row(h, k)) });
      });
      it('--layers 0', async () => { await strictPasses(file, original, { trainLen: L, layers: [0] }); });
      it('--update-s to another train length', async () => { await strictPasses(file, original, { trainLen: L }, { trainLen: 2 * L }); });
    });
  }

  for (const [name, make] of Object.entries(models)) {
    it(`${name}: ssmax, keys and causal n, per-head s, --update-s`, async () => {
      const m = make();
      assert.ok(await strictPasses(name, m, { trainLen: L }), 'the default patch applies');
      for (const n of ['keys', 'causal'] as const) await strictPasses(name, m, { trainLen: L, n });
      await strictPasses(name, m, { trainLen: L, prior: 'ggd', theta: THETA });
      await strictPasses(name, m, { preset: 'none', prior: 'alibi' });
      const heads = headCounts(m);
      if (heads.every((h) => h > 0)) await strictPasses(name, m, { s: Array.from({ length: heads[0] }, (_, i) => 0.3 + 0.1 * i) });
      else {
        refuse(`${name} per-head s`, 'a head count is unknown');
      }
      await strictPasses(name, m, { trainLen: L }, { trainLen: 2 * L });
    });
  }

  // Corpus models whose inputs let a sweep run (the others have fixed shapes: strict says what is unverified).
  const sample = ['ort_attention_mask1d_fp32.onnx', 'ort_attention_no_mask_fp16.onnx', 'ort_bert_toy_optimized.onnx'];
  for (const file of sample) {
    it(`corpus ${file}`, { skip: corpusSkip(file) }, async () => {
      assert.ok(await strictPasses(file, readModel(path.join(CORPUS, file)), { trainLen: L }));
    });
  }

  it('refuses exactly the expected combinations, each for its reason', () => {
    assert.deepEqual([...refusals.keys()].sort(), Object.keys(EXPECTED_REFUSALS).sort());
    for (const [label, reason] of refusals) assert.match(reason, EXPECTED_REFUSALS[label], label);
  });
});

// ---- no false passes ------------------------------------------------------------------------------------

type Mutation = [name: string, model: () => ModelProto, options: PatchOptions, wrong: (m: ModelProto) => void, site: RegExp];

/** Expects a failing check whose summary names the site. */
async function caught(original: ModelProto, options: PatchOptions, wrong: (m: ModelProto) => void, site: RegExp): Promise<void> {
  const patched = patchModel(original, options).model;
  wrong(patched);
  tally.mutations++;
  const r = await verifyPatch(original, patched, { lengths: [4, L, 4 * L] });
  assert.equal(r.passed, false, explain(r));
  const failed = r.checks.filter((c) => c.status === 'FAILED');
  assert.ok(failed.some((c) => site.test(c.summary)), `no failing check names the site ${site}:\n${explain(r)}`);
  tally.caught++;
}

const fixture = (name: string) => (): ModelProto => readModel(path.join(TORCH, `${name}.onnx`));

/** The factor of every site in `scope` applied once more. */
function twice(m: ModelProto, scope = 'main'): void {
  const s = modelScopes(m).find((x) => x.path === scope)!;
  for (const site of readRecord(m)!.sites.filter((x) => (x.scope ?? 'main') === scope)) {
    const apply = s.graph.nodes.find((n) => n.name === site.apply);
    if (!apply) continue;
    const again = `t/${apply.name}/again`;
    for (const r of [...s.graph.consumersOf(apply.output[0])]) r.input.forEach((x, i) => { if (x === apply.output[0]) s.graph.setInput(r, i, again); });
    s.graph.insertNode({ opType: 'Mul', domain: '', input: [apply.output[0], apply.input[1]], output: [again], name: again, attribute: [] });
  }
  s.commit();
}

/** Layer `layer`'s rewired input reads what it read before the patch: its factor is computed and not used. */
function missing(m: ModelProto, layer: number, scope = 'main'): void {
  const record = readRecord(m)!;
  const s = modelScopes(m).find((x) => x.path === scope)!;
  for (const e of record.journal!.filter((x) => x.scope === scope && x.owner === `L${layer}`)) {
    for (const w of e.rewired) {
      const n = s.graph.nodes.find((x) => nodeKey(x) === w.node)!;
      s.graph.setInput(n, w.input, w.from);
    }
  }
  s.commit();
}

/** The factor of every site replaced by a constant: s·ln 12 (right for the first short run in keys mode). */
function constantFactor(m: ModelProto): void {
  const g = new Graph(m.graph!);
  for (const site of readRecord(m)!.sites) {
    const apply = g.nodes.find((n) => n.name === site.apply)!;
    const s = Array.isArray(site.s) ? site.s[0] : site.s!;
    const c = `t/${apply.name}/constant`;
    g.insertNode({ opType: 'Constant', domain: '', input: [], output: [c], name: c, attribute: [{ name: 'value', type: 4, t: makeTensor('', DataType.FLOAT, [], [s * Math.log(12)]), floats: [], ints: [], strings: [], tensors: [], graphs: [] }] });
    g.setInput(apply, 1, c);
  }
  topoSort(m.graph!);
}

/** Every s initializer of the main graph set to `value` (a model holding that s: 1e30 overflows). */
function setS(m: ModelProto, value: number): void {
  for (const site of readRecord(m)!.sites) {
    const at = m.graph!.initializer.findIndex((t) => t.name === site.sInitializer);
    const old = m.graph!.initializer[at];
    const dims = old.dims.map(toNumber);
    m.graph!.initializer[at] = makeTensor(old.name, old.dataType, dims, new Array(dims.reduce((a, b) => a * b, 1)).fill(value));
  }
}

/** A keys factor where the record says causal (the journal is the keys patch's own). */
function keysWhereCausal(m: ModelProto): void {
  const record = readRecord(m)!;
  for (const site of record.sites) site.n = 'causal';
  writeRecord(m, record);
}

/** One call of the patched function runs an unpatched copy of it instead (its factor missing at that call). */
function callWithoutFactor(original: ModelProto) {
  return (m: ModelProto): void => {
    const fn = cloneModel(original).functions[0];
    const copy = { ...fn, name: `${fn.name}_unpatched` };
    m.functions.push(copy);
    const call = m.graph!.node.find((n) => n.opType === fn.name)!;
    const originalCall = original.graph!.node.find((n) => n.output[0] === call.output[0])!;
    call.opType = copy.name;
    call.input = [...originalCall.input];
  };
}

/** Reads the key count off the query's row axis (as the probe test's n = Tq tampering does). */
function queryLength(m: ModelProto): void {
  const g = m.graph!;
  const q = g.node.find((n) => n.name === readRecord(m)!.sites[0].apply)!.input[0];
  g.node.push({ opType: 'Shape', domain: '', name: 't/q_shape', input: [q], output: ['t/q_shape'], attribute: [] });
  g.node.find((n) => /^ssmax\/shared\/tk/.test(n.name))!.input[0] = 't/q_shape';
  topoSort(g);
  const last = g.initializer.findIndex((t) => t.name === 'ssmax/shared/last');
  g.initializer[last] = makeTensor('ssmax/shared/last', DataType.INT64, [1], [-2]);
}

const gpt2 = fixture('gpt2_past'), bert = fixture('bert_encoder'), llama = fixture('llama_gqa'), functions = fixture('attn_functions');
const PER_HEAD: PatchOptions = { s: [0.2, 0.3, 0.4, 0.5], n: 'keys' };

const MUTATIONS: Mutation[] = [
  ['n doubled (plain ops, cache)', gpt2, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /^layer \d/],
  ['n doubled (fused MultiHeadAttention)', models.mhaCacheModel, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(MultiHeadAttention/],
  ['n doubled (GroupQueryAttention)', models.gqaModel, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(GroupQueryAttention/],
  ['n doubled (ONNX Attention)', models.onnxAttentionModel, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(Attention/],
  ['n doubled (DecoderMaskedMultiHeadAttention)', models.dmmhaModel, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(DecoderMaskedMultiHeadAttention/],
  ['n doubled (com.microsoft Attention)', models.msAttentionModel, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(Attention/],
  ['n doubled (function body)', functions, { trainLen: L }, (m) => assert.ok(doubleN(m, modelScopes(m).find((s) => s.kind === 'function')!.path) > 0), /layer \d \(call/],
  ['n doubled (If branch)', models.ifModel, { trainLen: L }, (m) => assert.ok(doubleN(m, 'main/If.then_branch') > 0), /of main\/If\.then_branch/],
  ['n doubled (Loop body)', models.loopModel, { trainLen: L }, (m) => assert.ok(doubleN(m, 'main/Loop.body') > 0), /of main\/Loop\.body/],
  ['n off by one (plain ops)', llama, { trainLen: L }, (m) => assert.ok(nPlusOne(m) > 0), /^layer \d/],
  ['n off by one (fused)', models.mhaCrossModel, { trainLen: L }, (m) => assert.ok(nPlusOne(m) > 0), /layer 0 \(MultiHeadAttention/],
  ['keys n where the record says causal', gpt2, { trainLen: L, n: 'keys' }, keysWhereCausal, /^layer \d/],
  ['keys n where the record says causal (fused)', models.mhaCacheModel, { trainLen: L, n: 'keys' }, keysWhereCausal, /layer 0 \(MultiHeadAttention/],
  ['the query length instead of the key length', gpt2, { trainLen: L, n: 'keys' }, queryLength, /^layer \d/],
  ['per-head s permuted', bert, PER_HEAD, (m) => { reverseHeadsOfS(m, 0); reverseHeadsOfS(m, 1); }, /^layer \d head/],
  ['the factor on the wrong axis (along keys)', fixture('gpt2_decoder'), { trainLen: 64 }, (m) => {
    moveFactorToLogits(m);
    for (const t of m.graph!.initializer.filter((x) => /^ssmax\/(shared|L\d+)\/column$/.test(x.name))) Object.assign(t, makeTensor(t.name, DataType.INT64, [2], [1, -1]));
  }, /ratio varies along keys/],
  ['the factor missing in one layer', llama, { trainLen: L }, (m) => missing(m, 1), /^layer 1 /],
  ['the factor missing in one call site', functions, { trainLen: L }, callWithoutFactor(functions()), /layer 0 \(call/],
  ['the factor applied twice', bert, { trainLen: L }, (m) => twice(m), /matches the factor applied twice/],
  ['the factor applied twice (fused)', models.gqaModel, { trainLen: L }, (m) => twice(m), /layer 0 \(GroupQueryAttention/],
  ['s·ln n replaced by a constant (keys)', bert, { trainLen: L, n: 'keys' }, constantFactor, /^layer \d/],
  ['s·ln n replaced by a constant (causal)', llama, { trainLen: L }, constantFactor, /^layer \d/],
  ['a huge s overflowing to inf', bert, { trainLen: L }, (m) => setS(m, 1e30), /^layer \d/],
  ['a huge s overflowing to inf (qwen-logn)', gpt2, { preset: 'qwen-logn', trainLen: L }, (m) => setS(m, 1e30), /^layer \d/],
];

/** Layer `from`'s θα and θμ read by layer `to`'s prior (another layer's θ). */
function otherLayersTheta(m: ModelProto, to = 0, from = 1): void {
  const g = new Graph(m.graph!);
  const sites = readRecord(m)!.sites;
  for (const t of ['alpha', 'mu'] as const) {
    const a = sites[to].prior![t], b = sites[from].prior![t];
    for (const r of [...g.consumersOf(a)]) r.input.forEach((x, i) => { if (x === a) g.setInput(r, i, b); });
  }
}

/** The prior of every site added without its factor: the Mul the rewrite names prior_scaled (or prior_scale_scaled, per head) bypassed. */
function unscaledPrior(m: ModelProto): void {
  const g = new Graph(m.graph!);
  const scaled = g.nodes.filter((n) => /\/prior(_scale)?_scaled$/.test(n.name));
  assert.ok(scaled.length > 0, 'no Mul scales the prior');
  for (const n of scaled) {
    for (const r of [...g.consumersOf(n.output[0])]) r.input.forEach((x, i) => { if (x === n.output[0]) g.setInput(r, i, n.input[0]); });
  }
}

MUTATIONS.push(
  ['the prior reads another layer\'s θ', gpt2, { trainLen: L, prior: 'ggd', theta: { alpha: [[-0.5, 0, 0.3, -1], [0.2, -0.3, 0.1, 0]], beta: 0.8, mu: [[0, 0.2, -0.2, 0.4], [0.3, 0, 0, -0.1]] } },
    (m) => otherLayersTheta(m), /^layer 0\b/],
  ['the prior not scaled by the factor', gpt2, { trainLen: L, prior: 'ggd', theta: THETA }, unscaledPrior, /^layer \d prior/],
  ['the prior not scaled by the factor (fused MultiHeadAttention)', models.mhaCacheModel, { trainLen: L, prior: 'ggd', theta: THETA }, unscaledPrior, /layer 0 \(MultiHeadAttention.* prior/],
  ['n doubled (ONNX Attention expanded for its softcap)', models.onnxSoftcapModel, { trainLen: L }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(Attention/],
  ['n doubled (com.microsoft Attention expanded for causal n)', models.msAttentionModel, { trainLen: L, n: 'causal' }, (m) => assert.ok(doubleN(m) > 0), /layer 0 \(Attention/],
  ['the prior not scaled by the factor (expanded com.microsoft Attention)', models.msAttentionModel, { trainLen: L, n: 'causal', prior: 'ggd', theta: THETA }, unscaledPrior,
    /layer 0 \(Attention.* prior/],
  ['the prior not scaled by the factor (GroupQueryAttention)', models.gqaModel, { trainLen: L, prior: 'alibi' }, unscaledPrior, /layer 0 \(GroupQueryAttention.* prior/],
);

/** Every window's bias keeps the key one older than its W too (`Less` of the key's age made `LessOrEqual`). */
function windowOneWider(m: ModelProto): void {
  const less = m.graph!.node.filter((n) => n.name.endsWith('/in_window'));
  assert.ok(less.length > 0, 'no window comparison');
  for (const n of less) n.opType = 'LessOrEqual';
}

/** Layer `layer`'s Softmax reads what the window's Add read: the Add is computed and nothing reads it. */
function windowUnread(m: ModelProto, layer: number): void {
  const add = m.graph!.node.find((n) => n.name === `ssmax/L${layer}/window`)!;
  for (const n of m.graph!.node) n.input = n.input.map((i) => (i === add.output[0] ? add.input[0] : i));
}

MUTATIONS.push(
  // With key padding n is counted through the window's verdict, so the factor's probe fails first.
  ['the window one key wider than its W', gpt2, WINDOWS[0], windowOneWider, /^layer \d/],
  ['the window one key wider than its W (alone)', llama, WINDOWS[1], windowOneWider, /^layer \d window: /],
  ['the window\'s Add read by nothing', gpt2, WINDOWS[0], (m) => windowUnread(m, 1), /^layer 1: .*no longer reads the window's Add/],
);

describe('no false passes: wrong patches fail, naming the site', () => {
  for (const [name, make, options, wrong, site] of MUTATIONS) it(name, async () => { await caught(make(), options, wrong, site); });
});
