/**
 * The onnxruntime sessions verification needs, each created once: the original and the patched model (with
 * row-max outputs when sharpness is checked), the patch with its factor forced to 1, and the patch with probe
 * outputs. Only the sessions the selected checks need are created.
 */
import { InputError } from '../errors';
import { ModelProto } from '../io/onnx';
import { cloneModel } from '../rewrite/patch';
import { SiteRecord } from '../rewrite/record';
import { CheckId } from './plan';
import { Runner } from './run';
import { addProbeOutputs, addRowMaxOutputs, carryBf16AsFloat, forceUnitFactor, hasBf16Io, ProbeNames } from './runtime-model';

export type SessionKey = 'original' | 'patched' | 'unit' | 'probe';

/** A patched variant that onnxruntime refuses: every selected check fails with the reason. */
export class LoadFailure extends Error {}

export class Sessions {
  runners: Partial<Record<SessionKey, Runner>> = {};
  probes: ProbeNames[] = [];
  probeProblems: string[] = [];
  rowMax: { original: Map<number, string>; patched: Map<number, string> } = { original: new Map(), patched: new Map() };

  async release(): Promise<void> {
    await Promise.all(Object.values(this.runners).map((r) => r.release()));
  }
}

export async function openSessions(original: ModelProto, patched: ModelProto, checks: Set<CheckId>, records: SiteRecord[],
  progress: (line: string) => void): Promise<Sessions> {
  const s = new Sessions();
  const sites = records.map((r) => ({ layer: r.layer, softmax: r.softmax }));
  // Every model opened here is a fresh copy of its own, so it may be edited in place.
  const open = async (key: SessionKey, model: ModelProto, label: string): Promise<void> => {
    progress(`verify: loading ${label}`);
    if (hasBf16Io(model)) carryBf16AsFloat(model);
    try {
      // The probe copy reads the query twice (scaled and unscaled); onnxruntime 1.30's extended fusions can drop a
      // tensor read that way, and the probe only reads values, so it runs with basic optimisations.
      s.runners[key] = await Runner.fromModel(model, label, key === 'probe' ? 'basic' : 'all');
    } catch (e) {
      await s.release();
      if (key === 'original') throw new InputError(`onnxruntime cannot load the original model: ${oneLine(e)}`);
      throw new LoadFailure(`onnxruntime cannot load the ${label} model: ${oneLine(e)}`);
    }
  };
  const needsPair = checks.has('retrofit') || checks.has('liveness') || checks.has('sharpness');
  if (checks.has('wiring') || needsPair) {
    const m = cloneModel(original);
    if (checks.has('sharpness')) s.rowMax.original = addRowMaxOutputs(m, sites);
    await open('original', m, 'original');
  }
  if (needsPair) {
    const m = cloneModel(patched);
    if (checks.has('sharpness')) s.rowMax.patched = addRowMaxOutputs(m, sites);
    await open('patched', m, 'patched');
  }
  if (checks.has('wiring')) await open('unit', forceUnitFactor(cloneModel(patched)), 'patched with factor 1');
  if (checks.has('probe')) {
    const m = cloneModel(patched);
    const { probes, missing } = addProbeOutputs(m, records);
    s.probes = probes;
    s.probeProblems = missing;
    await open('probe', m, 'patched with probe outputs');
  }
  return s;
}

function oneLine(e: unknown): string {
  return String((e as Error)?.message ?? e).split('\n')[0];
}
