/**
 * The model calibration runs: a copy of the slope patch whose s initializers are inputs of the main graph (so one
 * onnxruntime session runs every candidate s, fed at each run, with nothing folded into constants), and the
 * attention statistic of every row of every site as outputs (verification's row-max outputs, over all rows).
 * `stat` null (calibrate by loss, which reads the logits only): no statistic, since onnxruntime computes every
 * node of a session whatever the run fetches.
 */
import { modelScopes } from '../graph/scopes';
import { DataType, ModelProto, toNumber } from '../io/onnx';
import { cloneModel } from '../io/model-file';
import { addRowMaxOutputs, RowStatistic } from '../verify/row-max';
import { VerifySite } from '../verify/sites';
import { HostTensor, makeHost } from '../verify/tensors';
import { readRecord } from '../rewrite/record';
import type { RopeSiteRecord } from '../rewrite/rope';
import { ropeFrequencies, RopeSpec } from '../policy/rope';

export interface CalibrationModel {
  model: ModelProto;
  /** A rescaled RoPE's multipliers and YaRN's factor as inputs (the record's initializer names), per constant: a RoPE scale per run. */
  rope: { site: RopeSiteRecord; dims: number[]; dataType: number }[];
  /** Per site index: the input that feeds its s, and that s tensor's dims ([] or [H, 1, 1]). */
  scales: Map<number, { input: string; dims: number[] }>;
  /** Per site index: the output holding its rows' statistic, and the one holding its key count. */
  outputs: Map<number, string>;
  keys: Map<number, string>;
  /** Sites whose probabilities no output shows, with the reason. */
  unseen: string[];
}

export function calibrationModel(patched: ModelProto, sites: readonly VerifySite[], stat: RowStatistic | null): CalibrationModel {
  const model = cloneModel(patched);
  const rows = stat ? addRowMaxOutputs(model, sites, stat, 'all') : { outputs: new Map<number, string>(), keys: new Map<number, string>(), unseen: new Map() };
  const scales = new Map<number, { input: string; dims: number[] }>();
  const graphs = modelScopes(model).map((s) => s.graph.proto);
  const main = model.graph!;
  sites.forEach((site, i) => {
    const name = site.record.sInitializer;
    if (!name) return;
    // Names the patch inserts are unique model-wide: a subgraph reads the main graph's input as an outer-scope value.
    const owner = graphs.find((g) => g.initializer.some((t) => t.name === name));
    if (!owner) return;
    const t = owner.initializer.find((x) => x.name === name)!;
    owner.initializer = owner.initializer.filter((x) => x !== t);
    // IR < 4 declares initializers as inputs of their graph too.
    owner.input = owner.input.filter((v) => v.name !== name);
    const dims = t.dims.map(toNumber);
    main.input.push({ name, type: { tensorType: { elemType: DataType.FLOAT, shape: { dim: dims.map((d) => ({ dimValue: d })) } } } });
    scales.set(i, { input: name, dims });
  });
  return { model, scales, rope: ropeInputs(model), outputs: rows.outputs, keys: rows.keys, unseen: [...rows.unseen.values()] };
}

/** The rescaled RoPE's initializers (record.rope) moved to inputs of the main graph, in their own type. */
function ropeInputs(model: ModelProto): CalibrationModel['rope'] {
  const main = model.graph!;
  const toInput = (name: string): { dims: number[]; dataType: number } => {
    const t = main.initializer.find((x) => x.name === name)!;
    main.initializer = main.initializer.filter((x) => x !== t);
    main.input = main.input.filter((v) => v.name !== name);
    const dims = t.dims.map(toNumber);
    main.input.push({ name, type: { tensorType: { elemType: t.dataType, shape: { dim: dims.map((d) => ({ dimValue: d })) } } } });
    return { dims, dataType: t.dataType };
  };
  return (readRecord(model)?.rope?.sites ?? []).map((site) => {
    if (site.mscale) toInput(site.mscale);
    return { site, ...toInput(site.factor) };
  });
}

/**
 * The feeds of a RoPE rescaled for `scale` (policy/rope.ts) from the original frequencies of each constant
 * (`theta`); null: the original's RoPE (multipliers and YaRN's factor 1).
 */
export function ropeFeeds(cm: CalibrationModel, spec: Omit<RopeSpec, 'scale'>, theta: (site: RopeSiteRecord) => number[], scale: number | null): Record<string, HostTensor> {
  const feeds: Record<string, HostTensor> = {};
  const type = (t: number): 'float16' | 'float32' => (t === DataType.FLOAT16 ? 'float16' : 'float32');
  for (const r of cm.rope) {
    const base = theta(r.site);
    const next = scale === null ? { theta: base, mscale: 1 } : ropeFrequencies({ ...spec, scale }, base);
    feeds[r.site.factor] = makeHost(type(r.dataType), r.dims, next.theta.map((t, i) => t / base[i]));
    if (r.site.mscale) feeds[r.site.mscale] = makeHost(type(r.dataType), [], [next.mscale]);
  }
  return feeds;
}

/** The s feeds of every site: `valueOf(site, head)` gives the s of a head of a site. */
export function scaleFeeds(cm: CalibrationModel, valueOf: (site: number, head: number) => number): Record<string, HostTensor> {
  const feeds: Record<string, HostTensor> = {};
  for (const [i, { input, dims }] of cm.scales) {
    const heads = dims.length ? dims[0] : 1;
    feeds[input] = makeHost('float32', dims, Array.from({ length: heads }, (_, h) => valueOf(i, h)));
  }
  return feeds;
}
