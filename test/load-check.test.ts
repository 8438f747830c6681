/**
 * The patch command loads its own output on onnxruntime (at 'all' and 'disabled') before writing it: a patch that
 * does not load where the original does is an internal error naming both levels, never a written file; where
 * onnxruntime refuses the original too the patch is written with a warning saying the check could not be made.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { SsmaxError } from '../src/errors';
import { DataType, ModelProto, NodeProto } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { cloneModel, patchModel } from '../src/rewrite/patch';
import { checkLoads } from '../src/verify/load-check';
import { attentionNodes, f32 as f32Init, model, node, value } from './support/build';
import { cli, removeScratch, tmpdir } from './support/io';

after(removeScratch);

const N = 2, H = 4;

/** Softmax attention on q, k, v [B, N, S, H]; `extra` nodes after it (on its output). */
function attention(extra: NodeProto[] = []): ModelProto {
  return model({
    nodes: [...attentionNodes('q', 'k', 'v', 'out', 'a'), ...extra],
    inputs: ['q', 'k', 'v'].map((x) => value(x, DataType.FLOAT, ['B', N, 'S', H])),
    outputs: [value(extra.length ? 'y' : 'out', DataType.FLOAT, [])],
    initializers: [f32Init('sqrt_d', [], [2])],
  });
}

describe('the patch loads before it is written', () => {
  it('a patched model onnxruntime loads at both levels passes, with the time it took', async () => {
    const m = attention();
    const r = await checkLoads(m, patchModel(m, { trainLen: 8 }).model);
    assert.equal(r.status, 'loaded');
    assert.ok(r.ms > 0);
  });

  it('a patched model onnxruntime refuses where it loads the original: an internal error naming both levels', async () => {
    const m = attention();
    const broken = cloneModel(patchModel(m, { trainLen: 8 }).model);
    // An Unsqueeze in its opset-11 form (axes attribute) at opset 17: what a form mistake of the builder would write.
    broken.graph!.node.push(node('Unsqueeze', ['out'], ['out_1'], { axes: [0] }));
    broken.graph!.output.push(value('out_1', DataType.FLOAT, []));
    await assert.rejects(checkLoads(m, broken), (e: unknown) => e instanceof SsmaxError && e.exitCode === 3
      && /at 'all': .*Unsqueeze.*; at 'disabled': .*Unsqueeze/.test(e.message));
  });

  it('an original onnxruntime refuses too: written, with a warning that says the check was not possible', () => {
    // Squeeze with an axes attribute at opset 17 (deeploy_SleepViT's): onnxruntime refuses the original itself.
    const m = attention([node('Squeeze', ['out'], ['y'], { axes: [0] })]);
    const dir = tmpdir('ssmax-load-');
    const input = path.join(dir, 'refused.onnx');
    fs.writeFileSync(input, encodeModel(m));
    const out = path.join(dir, 'patched.onnx');
    const r = cli(['patch', input, '-o', out, '--train-len', '8', '--json', '--quiet']);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout) as { warnings: { code: string; message: string }[] };
    const w = report.warnings.find((x) => x.code === 'original-does-not-load');
    assert.ok(w, JSON.stringify(report.warnings));
    assert.match(w.message, /^onnxruntime refuses the original model too \(at 'all': .*Squeeze.*; at 'disabled': .*\): whether the patched model loads was not checked$/);
    assert.ok(fs.existsSync(out));
  });
});
