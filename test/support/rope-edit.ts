/**
 * RoPE rescaled by editing a model's frequency constant in place, a second path to what `--rope` writes (which adds
 * a Mul and leaves the constant): test/rope.test.ts compares the two. It reads the form the LM benchmark's models
 * write (Cos and Sin of positions × one constant of frequencies); anything else is an error. The formulas are the
 * tool's (policy/rope.ts), checked against Hugging Face's in lm-models.test.ts.
 */
import * as fs from 'node:fs';
import { Graph } from '../../src/graph/graph';
import { makeTensor } from '../../src/graph/tensor';
import { topoSort } from '../../src/graph/toposort';
import { readModel, serializeModel } from '../../src/io/model-file';
import { DataType, NodeProto, TensorProto, toNumber } from '../../src/io/onnx';
import { ropeFrequencies, RopeMethod } from '../../src/policy/rope';

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
  const next = ropeFrequencies({ method, scale, trainLen: L }, theta);
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
