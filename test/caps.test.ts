/**
 * Caps inside operators (issue 33): a real GPT-2 decoder whose EmbedLayerNormalization holds a position embedding
 * of 512 rows, patched for L = 8192. The patch report and its warning name the cap; verification skips what cannot
 * apply beyond it as not applicable, so --strict passes; no message advises --max-len, which cannot help there.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { CORPUS } from './support/ref';
import { cli, removeScratch, tmpdir } from './support/io';

after(removeScratch);

const GPT2 = path.join(CORPUS, 'genai_tiny-random-gpt2-fp16_past.onnx');

describe('a cap inside an operator, at patch time and in verification', { skip: fs.existsSync(GPT2) ? false : `${GPT2} not present` }, () => {
  it('EmbedLayerNormalization\'s 512 rows: report and warning say the cap, --strict passes at L = 8192, no --max-len advice', () => {
    const out = path.join(tmpdir('ssmax-caps-'), 'out.onnx');
    const r = cli([GPT2, '--train-len', '8192', '--verify', '--strict', '--max-len', '16384', '-o', out, '--json']);
    assert.equal(r.code, 0, r.stderr + r.stdout);
    const doc = JSON.parse(r.stdout);
    const why = "EmbedLayerNormalization 'EmbedLayerNormalization_0': its position embedding 'transformer.wpe.weight' has 512 rows";
    assert.equal(doc.lengths.kind, 'capped');
    assert.equal(doc.lengths.cap, 512);
    assert.equal(doc.lengths.why, why);
    const warning = doc.warnings.find((w: { code: string }) => w.code === 'fixed-lengths');
    assert.ok(warning, JSON.stringify(doc.warnings));
    assert.match(warning.message, /^no attention length of this model can exceed 512 \(EmbedLayerNormalization /);
    assert.match(warning.message, /the cap is the model's own, which no option lifts; give --train-len 512 to reproduce the original at n = 512$/);
    const checks = Object.fromEntries(doc.verification.checks.map((c: { id: string; status: string; skip?: string }) => [c.id, `${c.status} ${c.skip ?? ''}`.trim()]));
    assert.deepEqual(checks, { wiring: 'PASSED', probe: 'PASSED', retrofit: 'SKIPPED not applicable', liveness: 'SKIPPED not applicable', sharpness: 'SKIPPED not applicable' });
    for (const c of doc.verification.checks) {
      if (c.status === 'SKIPPED') assert.ok(c.summary.includes(why), c.summary);
    }
    assert.doesNotMatch(r.stdout + r.stderr, /--max-len|re-export/);
    assert.ok(fs.existsSync(out));
  });
});
