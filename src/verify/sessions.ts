/**
 * The onnxruntime sessions verification runs, one model variant each, created only when a check needs it and
 * released as soon as its last run is done, so at most one is resident at a time:
 *   original   the original model (with row-max outputs when sharpness is checked)
 *   unit       the patch with every factor forced to 1 (wiring parity)
 *   probe      the patch with every site's tensors before and after the factor as outputs (short runs)
 *   probeLast  the same with only the last row of logits (the retrofit runs, which may be long)
 *   patched    the patched model (with row-max outputs when sharpness is checked)
 * Models with external data, or large ones, are written to a temporary folder (their data files hard-linked,
 * or copied across file systems) and loaded from there: no protobuf of the whole model is built in memory.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { InputError } from '../errors';
import { ModelProto } from '../io/onnx';
import { externalFiles } from '../io/external';
import { encodeModel, inputFiles, writeModel } from '../io/model-file';
import { cloneModel } from '../rewrite/patch';
import { addProbeOutputs, ProbeWiring, RopeWiring } from './probe-model';
import { readRecord } from '../rewrite/record';
import { SessionReport } from './report';
import { addRowMaxOutputs, RowMaxOutputs } from './row-max';
import { Optimization, Runner } from './run';
import { carryBf16AsFloat, withStackedCache, withUnitFactor } from './runtime-model';
import { PREFIX } from './nodes';
import { makeScratch, removeScratch } from './scratch';
import { VerifySite } from './sites';

/** `written`: the patch as written where the checks read its plain-op form (fused sites), at its real factor. */
export type SessionKey = 'original' | 'unit' | 'probe' | 'probeLast' | 'patched' | 'written';

/** The order sessions run in: the original first (its outputs are what the others are compared with). */
export const SESSION_ORDER: SessionKey[] = ['original', 'unit', 'probe', 'probeLast', 'patched', 'written'];

export const SESSION_LABELS: Record<SessionKey, string> = {
  original: 'original', unit: 'patched with factor 1', probe: 'patched with probe outputs',
  probeLast: 'patched with last-row probe outputs', patched: 'patched', written: 'patched as written (fused)',
};

/** A patched variant that onnxruntime refuses: every check that needs it fails with the reason. */
export class LoadFailure extends Error {}

/** Models whose files together are larger than this are loaded from files rather than from bytes in memory. */
const FILE_THRESHOLD = 256 * 1024 * 1024;

export class SessionFactory {
  /** What each probe copy brings out per site, known once that copy is built. */
  readonly probes: Partial<Record<'probe' | 'probeLast', ProbeWiring[]>> = {};
  /** What the probe copy brings out of each rescaled RoPE constant, known once that copy is built. */
  rope: RopeWiring[] = [];
  readonly rowMax: Partial<Record<'original' | 'patched', RowMaxOutputs>> = {};
  readonly reports: SessionReport[] = [];
  private dir: string | null = null;
  private readonly fromFile: boolean;

  /**
   * `optimization`: onnxruntime's graph optimisation level for the model variants ('basic' where the original's own
   * outputs depend on it, see optimisationChanges).
   * `written`: the patch as written when `patched` is its plain-op form (sites written as fused operators, which the
   * probe cannot read): the factor-1 copy and the load check run it.
   */
  constructor(private readonly original: ModelProto, private readonly patched: ModelProto, private readonly sites: readonly VerifySite[],
    private readonly sharpness: boolean, readonly optimization: Optimization = 'all', private readonly written: ModelProto = patched) {
    this.fromFile = [original, patched].some((m) => externalFiles(m).length > 0 || filesSize(m) > FILE_THRESHOLD);
  }

  /** Whether the checks read a plain-op form of the patch, and the patch as written is another model. */
  get fusedForm(): boolean {
    return this.written !== this.patched;
  }

  /** Graph outputs every variant runs without (the caches of a plan that feeds a large one, Setup.droppedOutputs). */
  dropOutputs: ReadonlySet<string> = new Set();

  /** Builds the variant and opens its session. */
  async open(key: SessionKey): Promise<Runner> {
    const model = this.variant(key);
    carryBf16AsFloat(model);
    this.drop(model);
    // The probe copies read a tensor twice (scaled and unscaled); onnxruntime 1.30's extended fusions can drop a
    // tensor read that way, and the probe only reads values, so they run with basic optimisations.
    const optimization = key === 'probe' || key === 'probeLast' ? 'basic' : this.optimization;
    return this.create(key, model, optimization);
  }

  /** The original as it is (no outputs added) at an optimisation level, for optimisationChanges. */
  async openOriginal(optimization: Optimization): Promise<Runner> {
    const model = cloneModel(this.original);
    carryBf16AsFloat(model);
    return this.create('original', model, optimization, `original-${optimization}`);
  }

  /** The patched model as it is (no outputs added) at an optimisation level: whether it loads (load-check.ts). */
  async openPatched(optimization: Optimization): Promise<Runner> {
    const model = withStackedCache(cloneModel(this.written));
    carryBf16AsFloat(model);
    return this.create('patched', model, optimization, `patched-${optimization}`);
  }

  private async create(key: SessionKey, model: ModelProto, optimization: Optimization, folder: string = key): Promise<Runner> {
    try {
      return await Runner.create(this.fromFile ? this.write(folder, model) : encodeModel(model), SESSION_LABELS[key], optimization);
    } catch (e) {
      if (e instanceof InputError) throw e;
      if (key === 'original') throw originalLoadError(e);
      throw new LoadFailure(`onnxruntime cannot load the ${SESSION_LABELS[key]} model: ${firstLine(e)}`);
    }
  }

  /**
   * A session of a copy of the patched model made elsewhere (calibration's, with s as inputs), loaded as the
   * variants are: from bytes, or from a file beside its data. `sameShape`: its runs all have one shape
   * (Runner.create keeps an arena for them).
   */
  async openModel(model: ModelProto, label: string, sameShape = false): Promise<Runner> {
    carryBf16AsFloat(model);
    this.drop(model);
    try {
      return await Runner.create(this.fromFile ? this.write(label.replace(/\W+/g, '-'), model) : encodeModel(model), label, 'all', sameShape);
    } catch (e) {
      if (e instanceof InputError) throw e;
      throw new LoadFailure(`onnxruntime cannot load the ${label} model: ${firstLine(e)}`);
    }
  }

  /** Not a graph output, a present is freed as soon as its layer has read it. */
  private drop(model: ModelProto): void {
    if (this.dropOutputs.size) model.graph!.output = model.graph!.output.filter((o) => !this.dropOutputs.has(o.name));
  }

  async release(runner: Runner): Promise<void> {
    this.reports.push({ label: runner.label, createMs: Math.round(runner.createMs), runMs: Math.round(runner.runMs) });
    await runner.release();
  }

  /** Removes the temporary folder of model files, if any. */
  cleanup(): void {
    if (this.dir) removeScratch(this.dir);
    this.dir = null;
  }

  private variant(key: SessionKey): ModelProto {
    switch (key) {
      case 'original': return this.withRowMax('original', cloneModel(this.original));
      case 'patched': return this.withRowMax('patched', cloneModel(this.patched));
      case 'unit': return withStackedCache(withUnitFactor(this.written));
      case 'written': return withStackedCache(cloneModel(this.written));
      case 'probe': case 'probeLast': {
        const m = cloneModel(this.patched);
        const r = addProbeOutputs(m, this.sites, key === 'probe' ? 'all' : 'last', key === 'probe' ? readRecord(this.patched)?.rope?.sites : []);
        this.probes[key] = r.sites;
        if (key === 'probe') this.rope = r.rope;
        return m;
      }
    }
  }

  private withRowMax(key: 'original' | 'patched', m: ModelProto): ModelProto {
    if (this.sharpness) this.rowMax[key] = addRowMaxOutputs(m, this.sites);
    return m;
  }

  private write(key: string, model: ModelProto): string {
    this.dir ??= makeScratch('ssmax-verify-');
    const folder = path.join(this.dir, key);
    fs.mkdirSync(folder);
    const file = path.join(folder, 'model.onnx');
    writeModel(file, model, { externalData: 'link', scratch: true });
    return file;
  }
}

function filesSize(m: ModelProto): number {
  return inputFiles(m).reduce((sum, f) => {
    try {
      return sum + fs.statSync(f).size;
    } catch {
      return sum;
    }
  }, 0);
}

/** The original runs with the sharpness check's row maxima added: a failure in those nodes is ssmax-patch's, not the model's. */
export function originalLoadError(e: unknown): InputError {
  const ours = firstLine(e).includes(PREFIX) ? ' with the sharpness check\'s nodes added (an ssmax-patch bug; --checks without sharpness avoids it)' : '';
  return new InputError(`onnxruntime cannot load the original model${ours}: ${firstLine(e)}`, 'cannot-verify');
}

/** The first line of an error's message (onnxruntime's may run to many). */
export function firstLine(e: unknown): string {
  return String((e as Error)?.message ?? e).split('\n')[0];
}
