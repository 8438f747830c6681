/**
 * docs/recipes.md's recipes, by heading: the model each one reads (a fixture, a corpus file, or a merged decoder
 * built here: the corpus has no Optimum export), what it must print and what it must write. test/recipes.test.ts
 * runs them with this checkout's CLI; test/install.test.ts runs them in a project that installed the packed package.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { AttributeProto, DataType, GraphProto, ModelProto, ValueInfoProto } from '../../src/io/onnx';
import { decodeModel, encodeModel, readModel } from '../../src/io/model-file';
import { CORPUS, TORCH } from './ref';
import { ortLoadError } from './io';
import { assertLines, blocks, section, ShellResult } from './readme';

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

const GENAI = 'genai_tiny-random-LlamaForCausalLM-fp16';

export interface Recipe {
  /** The corpus files (or folders) it reads: the test skips, saying so, without them. */
  corpus: string[];
  /** Puts the recipe's input into the folder its commands run in. */
  setup: (dir: string) => void;
  /** Checks what it wrote, beyond what it printed. */
  check: (dir: string) => void | Promise<void>;
}

export const RECIPES: Record<string, Recipe> = {
  'PyTorch `torch.onnx.export`': {
    corpus: [],
    setup: (dir) => fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'gpt2_past.onnx')),
    check: (dir) => {
      const report = JSON.parse(fs.readFileSync(path.join(dir, 'gpt2_past.report.json'), 'utf8'));
      assert.deepEqual([report.status, report.strict.passed, report.verification.checks.map((c: { status: string }) => c.status)],
        ['ok', true, ['PASSED', 'PASSED', 'PASSED', 'PASSED', 'PASSED']]);
    },
  },
  'Hugging Face Optimum: merged decoders (`decoder_model_merged.onnx`)': {
    corpus: [],
    setup: (dir) => fs.writeFileSync(path.join(dir, 'decoder_model_merged.onnx'),
      encodeModel(optimumMerged(decodeModel(fs.readFileSync(path.join(TORCH, 'gpt2_past.onnx')))))),
    check: (dir) => {
      const out = path.join(dir, 'decoder_model_merged.ssmax.onnx');
      assert.ok(fs.statSync(out).size < 1.05 * fs.statSync(path.join(dir, 'decoder_model_merged.onnx')).size, 'the shared weights were duplicated');
      assert.equal(readModel(out).graph!.node.length, 1, 'the main graph still holds only the If');
    },
  },
  "onnxruntime's transformers optimizer": {
    corpus: ['ort_whisper_hf_fp32_decoder_attention_no_past.onnx'],
    setup: (dir) => fs.copyFileSync(path.join(CORPUS, 'ort_whisper_hf_fp32_decoder_attention_no_past.onnx'), path.join(dir, 'whisper_decoder_opt.onnx')),
    check: (dir) => assert.ok(fs.existsSync(path.join(dir, 'whisper_decoder_opt.ssmax.onnx'))),
  },
  'onnxruntime-genai model folders': {
    corpus: [GENAI],
    setup: (dir) => {
      const llama = path.join(dir, 'llama');
      fs.mkdirSync(llama);
      for (const f of fs.readdirSync(path.join(CORPUS, GENAI))) fs.copyFileSync(path.join(CORPUS, GENAI, f), path.join(llama, f));
      // The corpus keeps the model files only: the rest of a builder's folder, as the recipe copies it.
      fs.writeFileSync(path.join(llama, 'genai_config.json'), JSON.stringify({ model: { decoder: { filename: 'model.onnx' } } }));
      fs.writeFileSync(path.join(llama, 'tokenizer.json'), '{}');
    },
    check: async (dir) => {
      const out = path.join(dir, 'llama-ssmax');
      assert.deepEqual(fs.readdirSync(out).sort(), ['genai_config.json', 'model.onnx', 'model.onnx.data', 'tokenizer.json']);
      assert.notEqual(fs.statSync(path.join(out, 'model.onnx.data')).ino, fs.statSync(path.join(dir, 'llama/model.onnx.data')).ino, 'linked, not copied');
      assert.equal(await ortLoadError(path.join(out, 'model.onnx')), null);
    },
  },
};

/** The recipe's printout: stdout has the lines of its first text block; stderr is its second (without one, empty). */
export function assertRecipeOutput(heading: string, r: ShellResult): void {
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const [expected, warnings] = blocks(section(heading), 'text');
  if (warnings === undefined) assert.equal(r.stderr, '', 'no warning or error');
  else assert.equal(r.stderr, warnings, 'the warnings the recipe shows');
  assertLines(r.stdout, expected);
}
