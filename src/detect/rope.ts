/**
 * RoPE's frequencies as exporters write them in the graph: Cos and Sin of angles = positions × a constant of
 * frequencies (θ_i = base^(−2i/d), a geometric series), the angles maybe concatenated with themselves, cast or
 * transposed on the way. Other forms are named so that `--rope` can refuse them: RotaryEmbedding operators and
 * GroupQueryAttention's `do_rotary` hold their cos/sin caches inside, and a model with Cos/Sin of anything else
 * is not one this reads.
 */
import { nodeLabel } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { NodeProto } from '../io/onnx';

export interface RopeFrequencies {
  /** The constant of frequencies, as the graph names it (an initializer or a Constant's output). */
  constant: string;
  /** Its values, in order, and dims. */
  theta: number[];
  dims: number[];
  type: number;
  /** The node that reads it (the angles' Mul or MatMul) and at which input. */
  reader: { node: NodeProto; input: number };
  /** The Cos and Sin whose angles it sets. */
  trig: NodeProto[];
}

/** Ops the angles pass through between their product and the Cos or Sin (a Concat: every input is followed). */
const PASS = new Set(['Concat', 'Cast', 'Transpose', 'Reshape', 'Unsqueeze', 'Squeeze', 'Identity', 'Expand']);

/** Ops between the constant of frequencies and the product (its input 0 is the frequencies). */
const SHAPE = new Set(['Cast', 'Unsqueeze', 'Reshape', 'Transpose', 'Expand', 'Identity', 'Squeeze']);

/** The products of positions and frequencies: the angles. */
const PRODUCT = new Set(['Mul', 'MatMul', 'FusedMatMul', 'Einsum']);

/** Fused forms whose rotary caches are inside the operator. */
function fusedRotary(scope: Scope): NodeProto | undefined {
  return scope.graph.nodes.find((n) => n.opType === 'RotaryEmbedding'
    || (n.opType === 'GroupQueryAttention' && n.attribute.some((a) => a.name === 'do_rotary' && Number(a.i ?? 0) === 1)));
}

/** Every constant of frequencies of the scope, or why RoPE cannot be rescaled there. */
export function findRopeFrequencies(scope: Scope): RopeFrequencies[] | string {
  const fused = fusedRotary(scope);
  if (fused) return `'${nodeLabel(fused)}' (${fused.opType}) rotates with cos/sin caches inside the operator, which --rope does not rescale yet`;
  const found = new Map<string, RopeFrequencies>();
  for (const trig of scope.graph.nodes.filter((n) => (n.opType === 'Cos' || n.opType === 'Sin') && (n.domain ?? '') === '')) {
    const products = anglesOf(scope, trig);
    if (typeof products === 'string') return products;
    for (const product of products) {
      const f = frequenciesOf(scope, trig, product);
      if (typeof f === 'string') return f;
      const key = `${nodeLabel(f.reader.node)}|${f.reader.input}`;
      const entry = found.get(key) ?? f;
      if (!entry.trig.includes(trig)) entry.trig.push(trig);
      found.set(key, entry);
    }
  }
  if (found.size === 0) return 'no Cos or Sin of positions × a constant of frequencies: the model has no RoPE this reads (cos/sin caches precomputed as tables are not rescaled yet)';
  return [...found.values()];
}

/** The products whose angles the Cos or Sin reads, through reshapes and Concats of the angles. */
function anglesOf(scope: Scope, trig: NodeProto): NodeProto[] | string {
  const g = scope.graph;
  const out: NodeProto[] = [];
  const walk = (x: string): string | undefined => {
    const p = g.producer.get(x);
    if (p && PASS.has(p.opType)) {
      for (const i of p.opType === 'Concat' ? p.input : [p.input[0]]) {
        const why = walk(i);
        if (why) return why;
      }
      return undefined;
    }
    if (p && PRODUCT.has(p.opType)) { out.push(p); return undefined; }
    return `'${nodeLabel(trig)}': its angles are not positions × a constant of frequencies (they come from ${p ? `'${nodeLabel(p)}' (${p.opType})` : 'an input'})`;
  };
  return walk(trig.input[0]) ?? out;
}

/** The constant one operand of the product reads (through reshapes and casts), checked to be RoPE's frequencies. */
function frequenciesOf(scope: Scope, trig: NodeProto, product: NodeProto): RopeFrequencies | string {
  const g = scope.graph;
  const roots = product.input.map((i) => rootConstant(scope, product, i));
  const k = roots.findIndex((r) => r !== undefined);
  if (k < 0 || roots.filter((r) => r !== undefined).length !== 1) return `'${nodeLabel(product)}': the angles of '${nodeLabel(trig)}' are not positions × one constant of frequencies`;
  const { constant, reader } = roots[k]!;
  const value = g.constValue(constant)!;
  const theta = value.values.map(Number);
  if (!isGeometric(theta)) return `'${constant}': the frequencies of '${nodeLabel(trig)}' are not a geometric series base^(−2i/d)`;
  return { constant, theta, dims: value.dims, type: value.dataType, reader, trig: [] };
}

/** The initializer or Constant an operand is a reshaped or cast copy of, and the node that reads it on the way. */
function rootConstant(scope: Scope, product: NodeProto, input: string): { constant: string; reader: { node: NodeProto; input: number } } | undefined {
  const g = scope.graph;
  let reader = { node: product, input: product.input.indexOf(input) };
  let x = input;
  for (;;) {
    const p = g.producer.get(x);
    if (!p || p.opType === 'Constant') return g.constValue(x) ? { constant: x, reader } : undefined;
    if (!SHAPE.has(p.opType)) return undefined;
    reader = { node: p, input: 0 };
    x = p.input[0];
  }
}

/** Frequencies RoPE's form θ_i = base^(−2i/d) can be: positive, falling by one ratio (within 1e-4 of it). */
export function isGeometric(theta: readonly number[]): boolean {
  if (theta.length < 2 || !theta.every((t) => t > 0 && Number.isFinite(t))) return false;
  const ratio = theta[1] / theta[0];
  return ratio < 1 && theta.every((t, i) => i === 0 || Math.abs(t / theta[i - 1] - ratio) <= 1e-4 * ratio);
}
