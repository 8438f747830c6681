/**
 * RoPE rescaled in the graph (policy/rope.ts): the constant of frequencies is multiplied by θ'_i / θ_i before the
 * node that reads it, and for YaRN every reader of the Cos and Sin reads them times its factor. The constant itself
 * is left as it was, so revert (the journal) restores the model exactly, and verification can undo the rescaling by
 * setting the multipliers to 1.
 */
import { InputError } from '../errors';
import { nodeLabel } from '../graph/graph';
import { RopeFrequencies } from '../detect/rope';
import { PART } from '../identity';
import { ropeFrequencies, RopeSpec } from '../policy/rope';
import { Builder } from './builder';

/** What the record keeps of one rescaled constant: the names verification reads. */
export interface RopeSiteRecord {
  /** The constant of frequencies, unchanged. */
  constant: string;
  /** The initializer of the multipliers θ'_i / θ_i. */
  factor: string;
  /** The Mul of the constant by them (by node name). */
  apply: string;
  /** YaRN: the initializer of its factor on cos and sin. */
  mscale?: string;
  /** YaRN: the Cos and Sin whose readers read them times that factor (by label). */
  trig?: string[];
}

export function insertRope(b: Builder, f: RopeFrequencies, spec: RopeSpec): RopeSiteRecord {
  const next = ropeFrequencies(spec, f.theta);
  const factor = b.constant(PART.ropeFactor, f.type, f.dims, next.theta.map((t, i) => t / f.theta[i]));
  const scaled = b.op('Mul', [f.constant, factor], {}, PART.rope);
  const apply = b.last!.name;
  b.editor.setInput(f.reader.node, f.reader.input, scaled);
  if (next.mscale === 1) return { constant: f.constant, factor, apply };
  const mscale = b.constant(PART.ropeMscale, f.type, [], [next.mscale]);
  for (const trig of f.trig) {
    const out = trig.output[0];
    if (b.graph.proto.output.some((o) => o.name === out)) throw new InputError(`'${nodeLabel(trig)}' is a graph output: YaRN's factor on it would change the model's interface`, 'cannot-patch');
    const readers = [...b.graph.consumersOf(out)];
    const times = b.op('Mul', [out, mscale], {}, PART.ropeMscaled);
    for (const r of readers) r.input.forEach((x, i) => { if (x === out) b.editor.setInput(r, i, times); });
  }
  return { constant: f.constant, factor, apply, mscale, trig: f.trig.map((t) => nodeLabel(t)) };
}
