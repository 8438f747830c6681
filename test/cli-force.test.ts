/** --force-site on the command line: refused sites named with their reason, forcing them, and typos caught. */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { DataType } from '../src/io/onnx';
import { encodeModel } from '../src/io/model-file';
import { model, node, value } from './support/build';
import { cli, removeScratch, tmpdir } from './support/io';

after(removeScratch);


/** A com.microsoft GroupQueryAttention node with softcap (refused) beside one without (patched). */
function softcapModel(dir: string): string {
  const attn = (name: string, y: string, attrs: Record<string, number>) => ({
    ...node('GroupQueryAttention', ['Q', 'K', 'V', '', '', 'seqlens_k', 'total'], [y], { num_heads: 2, kv_num_heads: 2, ...attrs }, name), domain: 'com.microsoft',
  });
  const m = model({
    nodes: [attn('capped', 'Y1', { softcap: 30.5 }), attn('plain', 'Y2', {})],
    inputs: [...['Q', 'K', 'V'].map((n) => value(n, DataType.FLOAT, [1, 'S', 16])), value('seqlens_k', DataType.INT32, [1]), value('total', DataType.INT32, [])],
    outputs: ['Y1', 'Y2'].map((n) => value(n, DataType.FLOAT, [])),
  });
  m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
  const file = path.join(dir, 'softcap.onnx');
  fs.writeFileSync(file, encodeModel(m));
  return file;
}

describe('--force-site', () => {
  const dir = tmpdir('ssmax-force-');
  const input = softcapModel(dir);

  it('lists the refused site with its layer, reason and the flag that accepts it', () => {
    const r = cli([input, '--s', '0.4', '--dry-run']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /L1 {2}plain {2}com\.microsoft\.GroupQueryAttention {2}n=causal/);
    assert.match(r.stdout, /refused 1 attention node\(s\):\n {2}L0 {2}capped: GroupQueryAttention: softcap=30\.5.*\(--force-site capped to patch anyway\)/);
  });

  it('patches the refused site when forced, and says which deviation was accepted', () => {
    const r = cli([input, '--s', '0.4', '--dry-run', '--json', '--force-site', 'capped']);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout);
    assert.deepEqual(report.sites.map((s: { node: string; layer: number }) => [s.node, s.layer]), [['capped', 0], ['plain', 1]]);
    assert.match(report.sites[0].deviation, /softcap/);
  });

  it('a name that is no attention node is a one-line usage error; nothing is written', () => {
    const out = path.join(dir, 'out.onnx');
    const r = cli([input, '--s', '0.4', '-o', out, '--force-site', 'cappd']);
    assert.equal(r.code, 2);
    assert.equal(r.stderr.trim().split('\n').length, 1);
    assert.match(r.stderr, /--force-site cappd: no such attention node \(refused sites: capped\)/);
    assert.ok(!fs.existsSync(out));
  });
});
