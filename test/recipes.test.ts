/**
 * The README's recipes (issue 13), each run as written on a model of its kind, checking the lines the README
 * shows: a torch.onnx.export decoder (fixture), an Optimum merged decoder with If (built here from the fixture:
 * the corpus has none), onnxruntime's transformers optimizer output and an onnxruntime-genai folder (corpus).
 * Also the README's command for a clone, run twice.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { AttributeProto, DataType, GraphProto, ModelProto, ValueInfoProto } from '../src/io/onnx';
import { decodeModel, encodeModel, readModel } from '../src/io/model-file';
import { CORPUS, corpusSkip, TORCH } from './support/ref';
import { ortLoadError, removeScratch, tmpdir } from './support/io';
import { assertLines, blocks, REPO, runShell, section } from './support/readme';

after(removeScratch);

const inCorpus = corpusSkip;

/**
 * Runs the recipe's shell block in `cwd` and checks the output against the recipe's first text block, and stderr
 * against its second (without one, stderr must be empty).
 */
function runRecipe(heading: string, cwd: string): string {
  const text = section(heading);
  const [sh] = blocks(text, 'sh');
  const [expected, warnings] = blocks(text, 'text');
  const r = runShell(sh, cwd);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  if (warnings === undefined) assert.equal(r.stderr, '', 'no warning or error');
  else assert.equal(r.stderr, warnings, 'the warnings the recipe shows');
  assertLines(r.stdout, expected);
  return r.stdout;
}

/**
 * An Optimum-style merged decoder: the decoder twice, in the branches of If(use_cache_branch), reading the
 * model's inputs and the shared weights from the main graph, as optimum's merge_decoders writes it.
 */
function optimumMerged(decoder: ModelProto): ModelProto {
  const g = decoder.graph!;
  const outer = new Set([...g.input.map((v) => v.name), ...g.initializer.map((t) => t.name)]);
  const branch = (tag: string): GraphProto => {
    const rename = (n: string): string => (n === '' || outer.has(n) ? n : `${tag}/${n}`);
    return {
      name: tag, input: [], initializer: [], valueInfo: [], output: g.output.map((o) => ({ ...o, name: rename(o.name) })),
      node: g.node.map((n) => ({ ...n, name: `${tag}${n.name}`, input: n.input.map(rename), output: n.output.map(rename) })),
    };
  };
  const attr = (name: string, graph: GraphProto): AttributeProto => ({ name, type: 5, g: graph, floats: [], ints: [], strings: [], tensors: [], graphs: [] });
  const flag: ValueInfoProto = { name: 'use_cache_branch', type: { tensorType: { elemType: DataType.BOOL, shape: { dim: [{ dimValue: 1 }] } } } };
  return {
    ...decoder,
    graph: {
      name: 'merged', initializer: g.initializer, valueInfo: [], input: [...g.input, flag], output: g.output,
      node: [{ opType: 'If', domain: '', name: 'optimum::if', input: ['use_cache_branch'], output: g.output.map((o) => o.name),
        attribute: [attr('then_branch', branch('with_past')), attr('else_branch', branch('without_past'))] }],
    },
  };
}

describe('README recipes', () => {
  it('PyTorch torch.onnx.export: all five checks pass, --strict too; the report is written', () => {
    const dir = tmpdir('ssmax-recipe-');
    fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'gpt2_past.onnx'));
    runRecipe('PyTorch `torch.onnx.export`', dir);
    const report = JSON.parse(fs.readFileSync(path.join(dir, 'gpt2_past.report.json'), 'utf8'));
    assert.deepEqual([report.status, report.strict.passed, report.verification.checks.map((c: { status: string }) => c.status)],
      ['ok', true, ['PASSED', 'PASSED', 'PASSED', 'PASSED', 'PASSED']]);
  });

  it('Optimum merged decoder: both If branches patched, numbered per branch, weights written once', () => {
    const dir = tmpdir('ssmax-recipe-');
    const input = path.join(dir, 'decoder_model_merged.onnx');
    fs.writeFileSync(input, encodeModel(optimumMerged(decodeModel(fs.readFileSync(path.join(TORCH, 'gpt2_past.onnx'))))));
    runRecipe('Hugging Face Optimum: merged decoders (`decoder_model_merged.onnx`)', dir);
    const out = path.join(dir, 'decoder_model_merged.ssmax.onnx');
    assert.ok(fs.statSync(out).size < 1.05 * fs.statSync(input).size, 'the shared weights were duplicated');
    const patched = readModel(out);
    assert.equal(patched.graph!.node.length, 1, 'the main graph still holds only the If');
  });

  it("onnxruntime's transformers optimizer: MultiHeadAttention patched, the unidirectional Attention refused with its reason",
    { skip: inCorpus('ort_whisper_hf_fp32_decoder_attention_no_past.onnx') }, () => {
      const dir = tmpdir('ssmax-recipe-');
      fs.copyFileSync(path.join(CORPUS, 'ort_whisper_hf_fp32_decoder_attention_no_past.onnx'), path.join(dir, 'whisper_decoder_opt.onnx'));
      runRecipe("onnxruntime's transformers optimizer", dir);
    });

  const genai = 'genai_tiny-random-LlamaForCausalLM-fp16';
  it('onnxruntime-genai folder: the weights copied into the new folder beside the copied config; onnxruntime loads it',
    { skip: inCorpus(genai) }, async () => {
      const dir = tmpdir('ssmax-recipe-');
      const llama = path.join(dir, 'llama');
      fs.mkdirSync(llama);
      for (const f of fs.readdirSync(path.join(CORPUS, genai))) fs.copyFileSync(path.join(CORPUS, genai, f), path.join(llama, f));
      // The corpus keeps the model files only: the rest of a builder's folder, as the recipe copies it.
      fs.writeFileSync(path.join(llama, 'genai_config.json'), JSON.stringify({ model: { decoder: { filename: 'model.onnx' } } }));
      fs.writeFileSync(path.join(llama, 'tokenizer.json'), '{}');
      runRecipe('onnxruntime-genai model folders', dir);
      const out = path.join(dir, 'llama-ssmax');
      assert.deepEqual(fs.readdirSync(out).sort(), ['genai_config.json', 'model.onnx', 'model.onnx.data', 'tokenizer.json']);
      assert.notEqual(fs.statSync(path.join(out, 'model.onnx.data')).ino, fs.statSync(path.join(llama, 'model.onnx.data')).ino, 'linked, not copied');
      assert.equal(await ortLoadError(path.join(out, 'model.onnx')), null);
    });

  it("the README's command for a clone can be run twice", () => {
    const [sh] = blocks(section('From a clone of this repository'), 'sh');
    const command = sh.split('\n')[0].replace(/^npm ci && npm run build && /, '');
    assert.match(command, /^npx ssmax-patch fixtures\/torch\/gpt2_past\.onnx .* --force$/);
    const dir = tmpdir('ssmax-first-');
    // The same command with its output in a scratch folder instead of /tmp.
    const local = command.replace('/tmp/gpt2_past.ssmax.onnx', path.join(dir, 'gpt2_past.ssmax.onnx'));
    for (const run of [1, 2]) {
      const r = runShell(local, REPO);
      assert.equal(r.code, 0, `run ${run}: ${r.stderr}`);
      assert.match(r.stdout, /verify: PASSED/);
    }
  });
});
