/**
 * Attention architectures built from torchvision and torchaudio themselves (fixtures/torchlib/make_torchlib.py,
 * issue 23): ViT, Swin, Swin V2, MaxViT, wav2vec2 and HuBERT with and without lengths, Conformer, Emformer (also
 * streaming), nn.Transformer, each exported at opset 14 and 17. Every file is patched with the default options
 * (one s, n auto) and with per-head s, and its outputs on onnxruntime are compared with PyTorch's SSMax outputs,
 * where n is the keys each row really attends to (Swin: the keys of its window the shift mask leaves visible).
 *
 * Before the fixes of issue 23 70 of these cases failed (fixtures/torchlib/README.md, "State before the fixes").
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { ModelProto, parseModel, patchModel, PatchResult, readModel, revertModel, serializeModel } from '../src/index';
import { FIXTURES, loadRef, RefCase, RefFile } from './support/ref';
import { refError, Sessions } from './support/refrun';

const DIR = path.join(FIXTURES, 'torchlib');
const TOLERANCE = 1e-4;

/** The reference files of make_torchlib.py: one head count per site, and what n is at each site. */
interface TorchlibRef extends Omit<RefFile, 'num_heads'> {
  num_heads: number[];
  sites: { heads: number; n: string }[];
}

type Kind = 'scalar' | 'per-head' | 'per-site';

const S_SCALAR = 0.3;
/** The n mode each kind of row count of the references needs (Swin's windows and Emformer's blocks are counted). */
const N_MODE: Record<string, string> = { keys: 'keys', window: 'mask', padding: 'padding', causal: 'causal', block: 'mask' };

const uniformHeads = (ref: TorchlibRef): boolean => new Set(ref.num_heads).size === 1;

/** Per-head s is one list when every site has the same heads, else one row per site (then it is the per-head case). */
function kindOf(ref: TorchlibRef, c: RefCase): Kind {
  const s = c.patch!.s;
  if (typeof s === 'number') return 'scalar';
  return Array.isArray(s[0]) && uniformHeads(ref) ? 'per-site' : 'per-head';
}

/** One patch per s, shared by the cases with that s. */
function patches(model: ModelProto): (s: number | number[] | number[][]) => PatchResult {
  const done = new Map<string, PatchResult>();
  return (s) => {
    const key = JSON.stringify(s);
    if (!done.has(key)) done.set(key, patchModel(model, { s }));
    return done.get(key)!;
  };
}

const files = fs.readdirSync(DIR).filter((f) => f.endsWith('.ref.json')).map((f) => f.replace(/\.ref\.json$/, '')).sort();

describe('torchvision / torchaudio fixtures', () => {
  it('every architecture at opset 14 and 17', () => {
    const models = ['vit', 'swin', 'swin_v2', 'maxvit', 'wav2vec2', 'wav2vec2_lengths', 'hubert', 'hubert_lengths', 'conformer',
      'emformer', 'emformer_stream', 'transformer'];
    assert.deepEqual(files, models.flatMap((m) => [`${m}_op14`, `${m}_op17`]).sort());
  });
});

for (const name of files) {
  const ref = loadRef(name, DIR) as unknown as TorchlibRef;
  describe(`torchlib fixture ${name}`, () => {
    const original = readModel(path.join(DIR, ref.model));
    const patched = patches(original);
    const sessions = new Sessions();
    after(() => sessions.release());
    const perHead = ref.cases.find((c) => c.patch && kindOf(ref, c) === 'per-head')!.patch!.s;

    it('every attention site is patched, with its head count', () => {
      const { report } = patched(perHead);
      assert.equal(report.sites.length, ref.sites.length);
      assert.deepEqual(report.sites.map((s) => s.heads), ref.num_heads, report.sites.map((s) => s.headsReason).join('\n'));
    });

    it('each site counts n the way its rows see keys', () => {
      const { report } = patched(S_SCALAR);
      assert.deepEqual(report.sites.map((s) => s.n), ref.sites.map((s) => N_MODE[s.n]), report.sites.map((s) => s.nReason).join('\n'));
    });

    it('patched with per-head s, it reverts to the original exactly', () => {
      const { model: m } = patched(perHead);
      const back = revertModel(parseModel(serializeModel(m), 'patched')).model;
      assert.ok(Buffer.from(serializeModel(back)).equals(Buffer.from(serializeModel(original))));
    });

    for (const c of ref.cases) {
      if (!c.patch) {
        it(`${c.name}: the export runs as PyTorch does`, async () => {
          const e = refError(await sessions.outputs(original, c), c);
          assert.ok(e <= TOLERANCE, `the original is ${e} from PyTorch: the fixture is wrong`);
        });
        continue;
      }
      const s = c.patch.s;
      it(`${c.name}: SSMax matches PyTorch within ${TOLERANCE}`, async () => {
        const { model: m, report } = patched(s);
        assert.equal(report.sites.length, ref.sites.length, 'not every attention site is patched');
        const e = refError(await sessions.outputs(m, c), c);
        assert.ok(e <= TOLERANCE, `max abs error ${e} (n per site: ${report.sites.map((x) => `${x.n} (${x.nReason})`).join('; ')})`);
      });
    }
  });
}
