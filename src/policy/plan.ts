/**
 * The options of a patch, resolved into one plan before the model is touched: the preset and its factor, where s
 * comes from, which layers, how n is computed, which refused sites are forced, and whether an existing patch is
 * updated. Every value is checked here, for API callers as for the CLI, and combinations that would be ignored
 * are refused.
 */
import { InputError, opt } from '../errors';
import { Preset, PresetOptions, resolvePreset } from './factor';
import { LayerSelection, LayerSpec, layerSpec } from './layers';
import { NOption, parseNOption } from './n-mode';
import { PriorOptions, PriorSpec, resolvePrior } from './prior';
import { resolveScaleSpec, ScaleOptions, ScaleSpec } from './scale';
import { resolveWindow, WindowOptions, WindowSpec } from './window';
import { resolveRope, RopeOptions, RopeSpec } from './rope';

/** What a patch does, as values: no file names and no command-line spellings (the CLI reads files and parses flags). */
export interface PlanOptions extends ScaleOptions, PriorOptions, WindowOptions, RopeOptions, PresetOptions {
  /** How n is computed at each site (default auto). */
  n?: NOption;
  /** On an already patched model, replace s instead of refusing. */
  updateS?: boolean;
  /** Node names of refused sites to patch anyway (the deviation from exact SSMax is accepted knowingly). */
  force?: readonly string[];
  /** Layers to patch (default all). */
  layers?: LayerSelection;
}

export interface PatchPlan {
  preset: Preset;
  /** Where s comes from; absent for the none preset and for an update of θ alone. */
  spec?: ScaleSpec;
  /** The positional prior to add, if any. */
  prior?: PriorSpec;
  /** The sliding window to add, if any. */
  window?: WindowSpec;
  /** RoPE rescaled, if asked. */
  rope?: RopeSpec;
  n: NOption;
  layers: LayerSpec;
  force: string[];
  update: boolean;
  /** The training length the user stated, kept in the patch record. */
  trainLen?: number;
}

export function resolvePlan(o: PlanOptions): PatchPlan {
  const n = parseNOption(o.n ?? 'auto');
  if (o.force !== undefined && (!Array.isArray(o.force) || o.force.some((f: unknown) => typeof f !== 'string' || f === ''))) {
    throw new InputError(`${opt('force')} must be a list of node names`, 'usage');
  }
  if (o.updateS) refuseIgnoredByUpdate(o);
  const preset = resolvePreset(o);
  const prior = resolvePrior(o);
  const window = resolveWindow(o);
  const rope = resolveRope(o);
  return {
    preset, spec: scaleSpecOf(preset, prior, o, window !== undefined, rope), prior, ...(window ? { window } : {}), ...(rope ? { rope } : {}),
    n, layers: layerSpec(o.layers), force: [...(o.force ?? [])],
    update: Boolean(o.updateS), trainLen: o.trainLen,
  };
}

/** s is needed for a factor; the none preset has none, and an update may change θ alone. */
function scaleSpecOf(preset: Preset, prior: PriorSpec | undefined, o: PlanOptions, window: boolean, rope: RopeSpec | undefined): ScaleSpec | undefined {
  // qwen-logn and slope need L for their factor, YaRN for its ramp: stating it gives no s.
  const lForOthers = preset.kind === 'qwen-logn' || preset.kind === 'slope' || (preset.kind === 'none' && rope?.method === 'yarn');
  const sGiven = o.s !== undefined || (o.trainLen !== undefined && !lForOthers);
  if (preset.kind === 'none') {
    if (!prior && !window && !rope) throw new InputError(`${opt('preset', 'none')} adds no factor: give ${opt('prior')}, ${opt('window')} or ${opt('rope')} too, or another preset`, 'usage');
    // n is the factor's alone: the prior reads positions.
    if (o.n !== undefined && o.n !== 'auto') throw new InputError(`${opt('preset', 'none')} has no factor, so no n: ${opt('n', o.n)} would be ignored`, 'usage');
    if (sGiven) throw new InputError(`${opt('preset', 'none')} has no s: ${opt('s')} and ${opt('trainLen')} would be ignored`, 'usage');
    return undefined;
  }
  if (o.updateS && prior && !sGiven && preset.kind !== 'llama4') return undefined;
  return scaleSpecFor(preset, o);
}

/** An update replaces s and nothing else: options that shape the factor would be silently ignored. */
function refuseIgnoredByUpdate(o: PlanOptions): void {
  const ignored: [keyof PlanOptions, boolean][] = [
    ['layers', o.layers !== undefined], ['n', o.n !== undefined && o.n !== 'auto'], ['force', Boolean(o.force?.length)],
    ['b', o.b !== undefined], ['floorScale', o.floorScale !== undefined], ['window', o.window !== undefined], ['sinks', o.sinks !== undefined],
    ['rope', o.rope !== undefined], ['ropeScale', o.ropeScale !== undefined],
  ];
  const given = ignored.filter(([, g]) => g).map(([k]) => opt(k));
  if (given.length) {
    throw new InputError(`${opt('updateS')} replaces s in place and keeps everything else of the patch: ${given.join(', ')} would be ignored; revert and patch again to change them`, 'usage');
  }
}

/** s per preset: llama4's s is its attn_scale; the others take s, trainLen or an s file (slope: s, else 1/ln L). */
function scaleSpecFor(preset: Preset, options: PlanOptions): ScaleSpec {
  if (preset.kind === 'qwen-logn' && options.s !== undefined) {
    throw new InputError(`the qwen-logn preset takes s = 1/ln L from ${opt('trainLen')}, not ${opt('s')}`, 'usage');
  }
  if (preset.kind === 'llama4') {
    if (options.s !== undefined) throw new InputError(`the llama4 preset takes ${opt('attnScale')}, not ${opt('s')}`, 'usage');
    return { kind: 'scalar', s: preset.attnScale, from: opt('attnScale') };
  }
  return resolveScaleSpec(options, preset.kind === 'slope');
}
