/**
 * RoPE rescaled in a copy of a benchmark model, to measure what position interpolation, NTK-aware scaling and YaRN
 * would give past L with and without SSMax (issue 36). Not a feature of the tool yet: the frequencies are found as
 * the benchmark's own models write them (Cos and Sin of positions × one constant of K geometric frequencies,
 * θ_i = base^(−2i/d), d = 2K) and edited in place; anything else is an error. The formulas are Hugging Face
 * transformers' (`linear`, static NTK-aware base scaling, `yarn` with β_fast = 32, β_slow = 1).
 */
import * as fs from 'node:fs';
import { Graph } from '../src/graph/graph';
import { makeTensor } from '../src/graph/tensor';
import { topoSort } from '../src/graph/toposort';
import { readModel, serializeModel } from '../src/io/model-file';
import { DataType, NodeProto, TensorProto, toNumber } from '../src/io/onnx';

export type RopeMethod = 'pi' | 'ntk' | 'yarn';

/** The new frequencies for a context `scale` times L, and YaRN's factor on cos and sin (1 for the others). */
export function ropeFrequencies(method: RopeMethod, scale: number, theta: number[], L: number): { theta: number[]; mscale: number } {
  const K = theta.length, d = 2 * K;
  if (method === 'pi') return { theta: theta.map((t) => t / scale), mscale: 1 };
  if (method === 'ntk') return { theta: theta.map((t, i) => t * scale ** (-(2 * i) / (d - 2))), mscale: 1 };
  const base = theta[1] ** (-d / 2);
  const correction = (rotations: number): number => (d * Math.log(L / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
  const low = Math.max(Math.floor(correction(32)), 0), high = Math.min(Math.ceil(correction(1)), d - 1);
  const ramp = (i: number): number => Math.min(1, Math.max(0, (i - low) / (high === low ? 0.001 : high - low)));
  // ramp 0: high frequencies kept (extrapolated); ramp 1: interpolated as PI.
  return { theta: theta.map((t, i) => t / scale * ramp(i) + t * (1 - ramp(i))), mscale: 0.1 * Math.log(scale) + 1 };
}

/** The constant of frequencies the Cos and Sin read through one Mul with positions, and those Cos and Sin. */
function findFrequencies(g: Graph): { name: string; tensor: TensorProto; set: (t: TensorProto) => void; trig: NodeProto[] } {
  const trig = g.nodes.filter((n) => n.opType === 'Cos' || n.opType === 'Sin');
  const sources = new Set<string>();
  for (const n of trig) {
    let x = n.input[0];
    for (let p = g.producer.get(x); p && (p.opType === 'Concat' || p.opType === 'Cast' || p.opType === 'Transpose'); p = g.producer.get(x)) x = p.input[0];
    const mul = g.producer.get(x);
    const k = mul?.opType === 'Mul' ? mul.input.findIndex((i) => g.isConstant(i)) : -1;
    if (k < 0) throw new Error(`${n.name}: its angles are not positions × a constant of frequencies`);
    sources.add(mul!.input[k]);
  }
  if (sources.size !== 1) throw new Error(`${sources.size} constants of frequencies feed the Cos and Sin, not one`);
  const [name] = sources;
  const init = g.initializers.get(name);
  if (init) return { name, tensor: init, set: (t) => g.replaceInitializer(t), trig };
  const c = g.producer.get(name)!;
  const attr = c.attribute.find((a) => a.name === 'value')!;
  return { name, tensor: attr.t!, set: (t) => { attr.t = { ...t, name: '' }; }, trig };
}

/** Writes `out`: the model of `file` with its RoPE rescaled for `scale`·L by `method`. */
export function rescaleRope(file: string, method: RopeMethod, scale: number, L: number, out: string): string {
  const model = readModel(file);
  const g = new Graph(model.graph!);
  const { name, tensor, set, trig } = findFrequencies(g);
  const theta = g.constValue(name)!.values.map(Number);
  if (!theta.every((t, i) => t > 0 && (i < 2 || Math.abs(t / theta[i - 1] - theta[1] / theta[0]) < 1e-4 * (theta[1] / theta[0])))) {
    throw new Error('the frequencies are not a geometric series base^(−2i/d)');
  }
  const next = ropeFrequencies(method, scale, theta, L);
  set(makeTensor(tensor.name || name, tensor.dataType ?? DataType.FLOAT, (tensor.dims ?? []).map(toNumber), next.theta));
  if (next.mscale !== 1) {
    for (const n of trig) {
      const scaled = `${n.output[0]}/yarn_mscale`, factor = `${n.output[0]}/yarn_mscale_value`;
      g.redirect(n.output[0], scaled);
      g.addInitializer(makeTensor(factor, DataType.FLOAT, [], [next.mscale]));
      g.insertNode({ opType: 'Mul', domain: '', name: scaled, input: [n.output[0], factor], output: [scaled], attribute: [] });
    }
  }
  topoSort(model.graph!);
  fs.writeFileSync(out, serializeModel(model));
  return out;
}
