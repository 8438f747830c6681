/**
 * What the tool makes of every file of ../shared/corpus, file by file (skipped when the corpus is absent): the
 * sites it patches (operator and n mode, how many, how many expanded), or the reason it refuses the attention it
 * found, or why a file has no attention. The README's corpus tally is checked against this table.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { InputError } from '../src/errors';
import { readModel } from '../src/io/model-file';
import { patchModel } from '../src/rewrite/patch';
import { CORPUS, onnxFiles } from './support/ref';

type Outcome = { sites: Record<string, number>; expanded?: number } | { refused: RegExp } | { none: RegExp };

/** `sites`: patched sites by `kind n`; `refused`: attention refused, the reason; `none`: no attention, the reason. */
const CORPUS_OUTCOMES: Record<string, Outcome> = {
  'control_onnx_light_squeezenet.onnx': { none: /logits not produced by MatMul of two activations/ },
  'control_onnx_pytorch-converted_softmax_lastdim.onnx': { none: /logits not produced by MatMul of two activations/ },
  'genai_tiny-random-LlamaForCausalLM-fp16/model.onnx': { sites: {'com.microsoft.MultiHeadAttention causal': 2} },
  'onnxnode_attention_24_qk_matmul_output_mode3_softmax_precision.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_3d.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_3d_expanded.onnx': { sites: {'Softmax keys': 1} },
  'onnxnode_attention_3d_gqa.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_3d_with_past_and_present_qk_matmul_bias.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_attn_mask.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_attn_mask_3d_causal.onnx': { sites: {'Attention causal': 1} },
  'onnxnode_attention_4d_attn_mask_bool.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_attn_mask_bool_expanded.onnx': { sites: {'Softmax padding': 1} },
  'onnxnode_attention_4d_attn_mask_expanded.onnx': { sites: {'Softmax padding': 1} },
  'onnxnode_attention_4d_causal.onnx': { sites: {'Attention causal': 1} },
  'onnxnode_attention_4d_causal_expanded.onnx': { sites: {'Softmax causal': 1} },
  'onnxnode_attention_4d_diff_heads_sizes.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_expanded.onnx': { sites: {'Softmax keys': 1} },
  'onnxnode_attention_4d_fp16.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_fp16_expanded.onnx': { sites: {'Softmax keys': 1} },
  'onnxnode_attention_4d_gqa.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_gqa_causal_nonpad_decode.onnx': { sites: {'Attention causal': 1} },
  'onnxnode_attention_4d_gqa_causal_nonpad_decode_expanded.onnx': { sites: {'Softmax mask': 1} },
  'onnxnode_attention_4d_gqa_expanded.onnx': { sites: {'Softmax keys': 1} },
  'onnxnode_attention_4d_gqa_with_past_and_present_fp16.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_scaled.onnx': { sites: {'Attention keys': 1} },
  // Expanded: the factor after the cap.
  'onnxnode_attention_4d_softcap.onnx': { sites: {'Attention keys': 1}, expanded: 1 },
  'onnxnode_attention_4d_softcap_expanded.onnx': { sites: {'Softmax keys': 1} },
  'onnxnode_attention_4d_with_past_and_present.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_with_past_and_present_expanded.onnx': { sites: {'Softmax padding': 1} },
  'onnxnode_attention_4d_with_qk_matmul_softmax.onnx': { sites: {'Attention keys': 1} },
  'onnxnode_attention_4d_with_qk_matmul_softmax_expanded.onnx': { sites: {'Softmax padding': 1} },
  'onnxnode_attention_causal_boolmask_nan_robustness.onnx': { sites: {'Attention causal': 1} },
  // No onnxruntime kernel to check a patch against: refused, saying to patch its expanded form (the next file).
  'onnxnode_flexattention.onnx': { refused: /FlexAttention: not patched \(onnxruntime has no kernel for it.*expand it into its function body/ },
  'onnxnode_flexattention_expanded_ver26.onnx': { sites: {'Softmax keys': 1} },
  'onnxnode_softmax_axis_1.onnx': { none: /Softmax over axis 1 of a rank-3 tensor, not over the last \(key\) axis/ },
  'onnxnode_softmax_example.onnx': { none: /logits not produced by MatMul of two activations/ },
  'ort_attention_mask1d_fp16.onnx': { sites: {'Softmax padding': 1} },
  'ort_attention_mask1d_fp32.onnx': { sites: {'Softmax padding': 1} },
  'ort_attention_mask_no_cast.onnx': { sites: {'Softmax keys': 1} },
  'ort_attention_mha.onnx': { sites: {'com.microsoft.MultiHeadAttention keys': 1} },
  'ort_attention_no_mask_fp16.onnx': { sites: {'Softmax keys': 1} },
  'ort_attention_opt.onnx': { sites: {'com.microsoft.Attention padding': 1}, expanded: 1 },
  'ort_attention_past_unidir.onnx': { sites: {'Softmax causal-padding': 1} },
  'ort_attention_symbolic_batch.onnx': { sites: {'Softmax padding': 1} },
  'ort_bert_3d_attention_opt.onnx': { sites: {'com.microsoft.Attention padding': 1}, expanded: 1 },
  'ort_bert_toy_optimized.onnx': { sites: {'Softmax padding': 5} },
  'ort_gpt2_one_layer.onnx': { sites: {'Softmax causal': 1} },
  'ort_gpt2_past_one_layer.onnx': { sites: {'Softmax causal': 1} },
  // 5 causal Attention nodes in each of init_decoder and decoder, expanded.
  'ort_tiny_gpt2_greedysearch_with_init_decoder.onnx': { sites: {'com.microsoft.Attention causal-padding': 10}, expanded: 10 },
  'ort_whisper_decoder_mha_fused.onnx': { sites: {'com.microsoft.MultiHeadAttention keys': 1} },
  'ort_whisper_decoder_with_past_cross_mha_fused.onnx': { sites: {'com.microsoft.MultiHeadAttention keys': 1} },
  'ort_whisper_decoder_with_past_self_mha_fused.onnx': { sites: {'com.microsoft.MultiHeadAttention causal': 1} },
  'ort_whisper_hf_fp32_decoder_attention_no_past.onnx': { sites: {'com.microsoft.Attention causal': 1, 'com.microsoft.MultiHeadAttention keys': 1}, expanded: 1 },
  'ort_whisper_hf_fp32_decoder_attention_no_past_split_bias.onnx': { sites: {'com.microsoft.Attention causal': 1, 'com.microsoft.MultiHeadAttention keys': 1}, expanded: 1 },
  'ort_whisper_hf_fp32_decoder_attention_with_past.onnx': { sites: {'com.microsoft.MultiHeadAttention causal': 1, 'com.microsoft.MultiHeadAttention keys': 1} },
  'ort_whisper_hf_fp32_decoder_attention_with_past_split_bias.onnx': { sites: {'com.microsoft.MultiHeadAttention causal': 1, 'com.microsoft.MultiHeadAttention keys': 1} },
  'ort_whisper_hf_fp32_encoder_self_attention.onnx': { sites: {'com.microsoft.Attention keys': 1} },
  'tract_gqa_prefill_rope.onnx': { sites: {'com.microsoft.GroupQueryAttention causal': 1} },
  // Inputs of unknown rank, opset 11: n is the size of the group the Softmax normalises.
  'trt_polygraphy_attention.onnx': { sites: {'Softmax keys': 1} },
  'trt_polygraphy_attention_head.onnx': { sites: {'Softmax keys': 1} },
  'trt_polygraphy_attention_same_qkv.onnx': { sites: {'Softmax keys': 1} },
  'trt_polygraphy_multi_attention.onnx': { sites: {'Softmax keys': 2} },
};

const files = onnxFiles(CORPUS).map((f) => path.relative(CORPUS, f)).sort();

describe('every corpus file: the expected outcome', { skip: files.length === 0 ? `${CORPUS} not present` : false }, () => {
  it('the table lists exactly the corpus files', () => assert.deepEqual(files, Object.keys(CORPUS_OUTCOMES).sort()));
  for (const file of files) {
    it(file, () => {
      const want = CORPUS_OUTCOMES[file];
      let report;
      try {
        report = patchModel(readModel(path.join(CORPUS, file)), { trainLen: 64 }).report;
      } catch (e) {
        assert.ok(e instanceof InputError, `crashed: ${(e as Error).stack}`);
        assert.ok(!('sites' in want), `refused: ${e.message}`);
        assert.match(e.message, 'refused' in want ? want.refused : want.none);
        return;
      }
      assert.ok('sites' in want, `patched ${report.sites.length} site(s), expected a refusal`);
      const got: Record<string, number> = {};
      for (const s of report.sites) got[`${s.kind} ${s.n}`] = (got[`${s.kind} ${s.n}`] ?? 0) + 1;
      assert.deepEqual(got, want.sites);
      assert.equal(report.sites.filter((s) => s.expanded).length, want.expanded ?? 0);
      assert.deepEqual(report.skipped.filter((k) => k.attention).map((k) => k.reason), [], 'no attention may be left refused beside patched sites');
    });
  }
});

describe('the README corpus tally is this table\'s', () => {
  it('patched, refused and without attention', () => {
    const readme = fs.readFileSync(path.resolve(__dirname, '../../README.md'), 'utf8');
    const count = (k: string): number => Object.values(CORPUS_OUTCOMES).filter((o) => k in o).length;
    const m = /corpus \*\*(\d+) patched\*\*, \*\*(\d+) with attention refused[^*]*\*\*[^*]*\*\*(\d+) without attention\*\*/.exec(readme.replace(/\s+/g, ' '));
    assert.ok(m, 'the README has no corpus tally line');
    assert.deepEqual(m!.slice(1, 4).map(Number), [count('sites'), count('refused'), count('none')]);
    assert.match(readme, new RegExp(`\\(${Object.keys(CORPUS_OUTCOMES).length} files`));
  });
});
