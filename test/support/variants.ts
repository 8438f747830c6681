/**
 * A generator of exporter variants (metamorphic testing, issue 32): from one attention site of a model, rewrites
 * that change how an exporter writes the attention but not what it computes. Each class is one small function in
 * REWRITES; a chain applies several to one copy of the model. A rewrite returns null where it does not apply (the
 * site has no such form, a rank it needs is unknown): the caller says so, it is not a pass.
 *
 * The site is anchored by tensor names, which the rewrites keep: the Softmax's output (`probs`), the query·key
 * product's output (`logits`) and the value product's output (`out`). A rewrite that replaces one of these ops
 * writes the same output name, so the next rewrite of a chain finds the site again.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { modelScopes } from '../../src/graph/scopes';
import { makeTensor } from '../../src/graph/tensor';
import { cloneModel, readModel, serializeModel, writeModel } from '../../src/io/model-file';
import { AttributeProto, DataType, FunctionProto, GraphProto, isDefaultDomain, ModelProto, NodeProto, TensorProto, toNumber } from '../../src/io/onnx';
import { node } from './build';

/** Tensor names of one plain-op attention site in the main graph. */
export interface Anchor { logits: string; probs: string; out: string }

/**
 * `owner`: whose code a failure of the class points at: `detect` (detection and the patch's walks: this branch's),
 * `emit` (the form of inserted nodes, opset imports, loading: the opset-aware builder's), `qdq` (quantised models).
 * `site`: the class needs a plain-op site (an Anchor); the others rewrite the whole model and apply to fused sites too.
 */
export interface RewriteClass {
  name: string;
  owner: 'detect' | 'emit' | 'qdq';
  site: boolean;
  /** Set when the rewrite is exact in real numbers but not always in floating point: why (the case is then n/a where the unpatched variant's outputs move). */
  inexact?: string;
  /** As `inexact`, on fp16 models only. */
  inexactFp16?: string;
  apply(m: ModelProto, a: Anchor | null, rnd: () => number): ModelProto | null;
}

/** Deterministic generator in [0, 1) (mulberry32). */
export function seeded(seed: number): () => number {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let x = Math.imul(t ^ (t >>> 15), 1 | t);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

// ---- graph editing helpers (the main graph of a copy) ----

const opsetOf = (m: ModelProto, domain = ''): number => {
  const versions = m.opsetImport.filter((o) => (domain === '' ? isDefaultDomain(o.domain) : o.domain === domain)).map((o) => toNumber(o.version));
  // onnxruntime reads the imports in order and the last of a domain wins (see duplicateImportVersions).
  return versions.length ? versions[versions.length - 1] : 0;
};

let counter = 0;
const fresh = (base: string): string => `${base}__v${++counter}`;

const producerIndex = (g: GraphProto, name: string): number => g.node.findIndex((n) => n.output.includes(name));
const consumers = (g: GraphProto, name: string): NodeProto[] => g.node.filter((n) => n.input.includes(name));

function addInit(g: GraphProto, t: TensorProto): string {
  g.initializer.push(t);
  return t.name;
}
const ints = (g: GraphProto, values: number[]): string => addInit(g, makeTensor(fresh('c'), DataType.INT64, [values.length], values));

function elemType(m: ModelProto, name: string): number | undefined {
  return modelScopes(m)[0].shapes.type(name);
}
function rankOf(m: ModelProto, name: string): number | undefined {
  return modelScopes(m)[0].shapes.rank(name);
}

/**
 * Puts `nodes` (computing `to` from `from`) on the edge after `from`: every node reading `from` reads `to` instead.
 * They go just before the first reader, so the graph stays in topological order. False where nothing reads `from`
 * (the rewrite then does not apply: it is not a silent no-op).
 */
function onEdge(g: GraphProto, from: string, to: string, nodes: NodeProto[]): boolean {
  const readers = consumers(g, from);
  if (readers.length === 0) return false;
  for (const r of readers) r.input = r.input.map((i) => (i === from ? to : i));
  const at = Math.min(...readers.map((r) => g.node.indexOf(r)));
  g.node.splice(at, 0, ...nodes);
  return true;
}

function replaceNode(g: GraphProto, old: NodeProto, nodes: NodeProto[]): void {
  g.node.splice(g.node.indexOf(old), 1, ...nodes);
}

/** Unsqueeze/Squeeze/Reduce* axes in the form of the opset: an attribute before `inputFrom`, an input from it on. */
function withAxes(g: GraphProto, op: string, input: string[], output: string, axes: number[], inputFrom: number, opset: number,
  attrs: Record<string, number> = {}): NodeProto {
  if (opset >= inputFrom) return node(op, [...input, ints(g, axes)], [output], attrs, fresh(op));
  return node(op, input, [output], { ...attrs, axes }, fresh(op));
}

const ms = (n: NodeProto): NodeProto => ({ ...n, domain: 'com.microsoft' });
function needMs(m: ModelProto): void {
  if (!m.opsetImport.some((o) => o.domain === 'com.microsoft')) m.opsetImport.push({ domain: 'com.microsoft', version: 1 });
}

const shapeOnly = (name: string, build: (m: ModelProto, g: GraphProto, t: string, out: string) => NodeProto[] | null) =>
  (on: 'probs' | 'logits') => (m: ModelProto, a: Anchor | null): ModelProto | null => {
    if (!a) return null;
    const g = m.graph!;
    const t = a[on];
    const out = fresh(`${t}_${name}`);
    const nodes = build(m, g, t, out);
    if (!nodes) return null;
    return onEdge(g, t, out, nodes) ? m : null;
  };

const identity = shapeOnly('id', (_m, _g, t, out) => [node('Identity', [t], [out], {}, fresh('Identity'))]);
const castSame = shapeOnly('cast', (m, _g, t, out) => {
  const type = elemType(m, t);
  return type ? [node('Cast', [t], [out], { to: type }, fresh('Cast'))] : null;
});
const expandSame = shapeOnly('expand', (_m, _g, t, out) => {
  const shape = fresh('shape');
  return [node('Shape', [t], [shape], {}, fresh('Shape')), node('Expand', [t, shape], [out], {}, fresh('Expand'))];
});
const reshapeRoundTrip = shapeOnly('flat', (_m, g, t, out) => {
  const [shape, flat] = [fresh('shape'), fresh('flat')];
  return [node('Shape', [t], [shape], {}, fresh('Shape')), node('Reshape', [t, ints(g, [-1])], [flat], {}, fresh('Reshape')),
    node('Reshape', [flat, shape], [out], {}, fresh('Reshape'))];
});
const unsqueezeSqueeze = shapeOnly('unsq', (m, g, t, out) => {
  const mid = fresh('unsq');
  const opset = opsetOf(m);
  return [withAxes(g, 'Unsqueeze', [t], mid, [0], 13, opset), withAxes(g, 'Squeeze', [mid], out, [0], 13, opset)];
});
/** A rank-4 [B, H, S, T] tensor as a [B·H, S, T] view and back, as torch's matmul lowering writes it. */
const bhView = shapeOnly('bh', (m, g, t, out) => {
  if (rankOf(m, t) !== 4) return null;
  const [shape, last, viewShape, view] = [fresh('shape'), fresh('last2'), fresh('view_shape'), fresh('view')];
  return [node('Shape', [t], [shape], {}, fresh('Shape')), node('Gather', [shape, ints(g, [2, 3])], [last], { axis: 0 }, fresh('Gather')),
    node('Concat', [ints(g, [-1]), last], [viewShape], { axis: 0 }, fresh('Concat')), node('Reshape', [t, viewShape], [view], {}, fresh('Reshape')),
    node('Reshape', [view, shape], [out], {}, fresh('Reshape'))];
});

/** The product node writing `name` when it is a plain MatMul of two rank-`r` activations of the same rank. */
function plainMatMul(m: ModelProto, name: string): { n: NodeProto; rank: number } | null {
  const g = m.graph!;
  const n = g.node[producerIndex(g, name)];
  if (!n || n.opType !== 'MatMul' || (n.domain && n.domain !== 'ai.onnx')) return null;
  const [ra, rb] = [rankOf(m, n.input[0]), rankOf(m, n.input[1])];
  return ra !== undefined && ra === rb && ra >= 3 ? { n, rank: ra } : null;
}

const swapLast = (r: number): number[] => [...Array(r - 2).keys(), r - 1, r - 2];

/** The input of the Transpose writing `name` when it swaps the last two axes of a rank-`rank` tensor (kᵀ of k), else undefined. */
function untransposed(g: GraphProto, name: string, rank: number): string | undefined {
  const p = g.node[producerIndex(g, name)];
  const perm = p?.opType === 'Transpose' ? p.attribute.find((at) => at.name === 'perm')?.ints.map(Number) : undefined;
  return perm && perm.join() === swapLast(rank).join() ? p.input[0] : undefined;
}

/** MatMul(a, b) → com.microsoft FusedMatMul with transA or transB (an input transposed back), or neither. */
const fused = (on: 'logits' | 'out', trans: 'none' | 'A' | 'B') => (m: ModelProto, a: Anchor | null): ModelProto | null => {
  const mm = a && plainMatMul(m, a[on]);
  if (!mm) return null;
  const g = m.graph!;
  const [x, y] = mm.n.input;
  const nodes: NodeProto[] = [];
  let inputs = [x, y];
  const attrs: Record<string, number> = {};
  if (trans !== 'none') {
    const i = trans === 'A' ? 0 : 1;
    const src = inputs[i];
    // kᵀ written by a Transpose of the last two axes: read k itself, as exporters do.
    const k = trans === 'B' ? untransposed(g, src, mm.rank) : undefined;
    if (k) inputs = [x, k];
    else {
      const t = fresh(`${src}_t`);
      nodes.push(node('Transpose', [src], [t], { perm: swapLast(mm.rank) }, fresh('Transpose')));
      inputs = i === 0 ? [t, y] : [x, t];
    }
    attrs[`trans${trans}`] = 1;
  }
  needMs(m);
  replaceNode(g, mm.n, [...nodes, ms(node('FusedMatMul', inputs, mm.n.output, attrs, fresh('FusedMatMul')))]);
  return m;
};

/** The scalar a constant tensor of the main graph holds (an initializer or a Constant node's value), if it holds one. */
function scalarOf(m: ModelProto, name: string): number | undefined {
  const values = modelScopes(m)[0].graph.constValue(name)?.values;
  return values?.length === 1 ? Number(values[0]) : undefined;
}

/**
 * The batched Gemm-like form alpha·op(A)·op(B), as onnxruntime's MatMulScaleFusion and TransposeMatMul fusion write
 * it: the query·key MatMul and the constant scalar Div or Mul that follows it as one com.microsoft FusedMatMul with
 * alpha (and transB reading k itself where kᵀ is a Transpose). ONNX's own Gemm is 2-D only, and no site of fixtures/
 * or the corpus has a batch·heads product of 1, so this is the batched form. The product keeps the anchor's name;
 * the scaling's readers read it instead.
 */
const fusedAlpha = (m: ModelProto, a: Anchor | null): ModelProto | null => {
  const mm = a && plainMatMul(m, a.logits);
  if (!mm) return null;
  const g = m.graph!;
  const readers = consumers(g, a.logits);
  const scale = readers.length === 1 && ['Div', 'Mul'].includes(readers[0].opType) && readers[0].input[0] === a.logits ? readers[0] : undefined;
  const c = scale && scalarOf(m, scale.input[1]);
  if (!scale || !c || g.output.some((o) => o.name === scale.output[0])) return null;
  const alpha = scale.opType === 'Div' ? 1 / c : c;
  for (const n of consumers(g, scale.output[0])) n.input = n.input.map((i) => (i === scale.output[0] ? a.logits : i));
  g.node.splice(g.node.indexOf(scale), 1);
  const [x, y] = mm.n.input;
  const k = untransposed(g, y, mm.rank);
  needMs(m);
  const product = ms(node('FusedMatMul', [x, k ?? y], mm.n.output, k ? { transB: 1 } : {}, fresh('FusedMatMul')));
  // A float attribute even where alpha is whole (1/0.125): node() would write an integer.
  product.attribute.push({ name: 'alpha', type: 1, f: alpha, floats: [], ints: [], strings: [], tensors: [], graphs: [] });
  replaceNode(g, mm.n, [product]);
  return m;
};

/** MatMul → Einsum with the same batch letters (opset ≥ 12). */
const einsum = (on: 'logits' | 'out') => (m: ModelProto, a: Anchor | null): ModelProto | null => {
  const mm = a && plainMatMul(m, a[on]);
  if (!mm || opsetOf(m) < 12) return null;
  const batch = 'bhgf'.slice(0, mm.rank - 2);
  const equation = `${batch}ij,${batch}jk->${batch}ik`;
  replaceNode(m.graph!, mm.n, [node('Einsum', mm.n.input, mm.n.output, { equation }, fresh('Einsum'))]);
  return m;
};

/**
 * The value product on [B·H, S, T] · [B·H, T, D] views and its output viewed back to [B, H, S, D], the
 * probabilities through Expand (to their own shape) first: torch's matmul lowering (LLaMA, Phi by dynamo).
 */
const torchBmm = (m: ModelProto, a: Anchor | null): ModelProto | null => {
  const mm = a && plainMatMul(m, a.out);
  if (!mm || mm.rank !== 4) return null;
  const g = m.graph!;
  const [p, v] = mm.n.input;
  const view = (x: string, nodes: NodeProto[]): { view: string; shape: string } => {
    const [shape, last, vs, out] = [fresh('shape'), fresh('last2'), fresh('view_shape'), fresh(`${x}_view`)];
    nodes.push(node('Shape', [x], [shape], {}, fresh('Shape')), node('Gather', [shape, ints(g, [2, 3])], [last], { axis: 0 }, fresh('Gather')),
      node('Concat', [ints(g, [-1]), last], [vs], { axis: 0 }, fresh('Concat')), node('Reshape', [x, vs], [out], {}, fresh('Reshape')));
    return { view: out, shape };
  };
  const nodes: NodeProto[] = [];
  const [ps, pe] = [fresh('shape'), fresh(`${p}_expand`)];
  nodes.push(node('Shape', [p], [ps], {}, fresh('Shape')), node('Expand', [p, ps], [pe], {}, fresh('Expand')));
  const pv = view(pe, nodes);
  const vv = view(v, nodes);
  const [bmm, head, d, outShape] = [fresh('bmm'), fresh('head'), fresh('d'), fresh('out_shape')];
  nodes.push(node('MatMul', [pv.view, vv.view], [bmm], {}, fresh('MatMul')),
    node('Gather', [pv.shape, ints(g, [0, 1, 2])], [head], { axis: 0 }, fresh('Gather')),
    node('Gather', [vv.shape, ints(g, [3])], [d], { axis: 0 }, fresh('Gather')),
    node('Concat', [head, d], [outShape], { axis: 0 }, fresh('Concat')),
    node('Reshape', [bmm, outShape], mm.n.output, {}, fresh('Reshape')));
  replaceNode(g, mm.n, nodes);
  return m;
};

/** The Softmax as Exp / ReduceSum / Div over the last axis, optionally ReduceMax-subtracted first. */
const decomposed = (subtractMax: boolean) => (m: ModelProto, a: Anchor | null): ModelProto | null => {
  if (!a) return null;
  const g = m.graph!;
  const sm = g.node[producerIndex(g, a.probs)];
  if (!sm || sm.opType !== 'Softmax') return null;
  const opset = opsetOf(m);
  const rank = rankOf(m, sm.input[0]);
  const axis = Number(sm.attribute.find((at) => at.name === 'axis')?.i ?? (opset >= 13 ? -1 : 1));
  if (!(axis === -1 || (rank !== undefined && axis === rank - 1))) return null;
  const nodes: NodeProto[] = [];
  let x = sm.input[0];
  if (subtractMax) {
    const [max, shifted] = [fresh('max'), fresh('shifted')];
    nodes.push(withAxes(g, 'ReduceMax', [x], max, [-1], 18, opset, { keepdims: 1 }), node('Sub', [x, max], [shifted], {}, fresh('Sub')));
    x = shifted;
  }
  const [e, sum] = [fresh('exp'), fresh('sum')];
  nodes.push(node('Exp', [x], [e], {}, fresh('Exp')), withAxes(g, 'ReduceSum', [e], sum, [-1], 13, opset, { keepdims: 1 }),
    node('Div', [e, sum], sm.output, {}, fresh('Div')));
  replaceNode(g, sm, nodes);
  return m;
};

/** Every initializer of the main graph (not also a graph input) as a Constant node at the top of the graph. */
const constants = (m: ModelProto): ModelProto | null => {
  const g = m.graph!;
  const inputs = new Set(g.input.map((i) => i.name));
  const moved = g.initializer.filter((t) => !inputs.has(t.name) && !t.externalData?.length && t.dataLocation !== 1);
  if (moved.length === 0) return null;
  g.initializer = g.initializer.filter((t) => !moved.includes(t));
  const attr = (t: TensorProto): AttributeProto => ({ name: 'value', type: 4, t: { ...t, name: '' }, floats: [], ints: [], strings: [], tensors: [], graphs: [] });
  g.node.unshift(...moved.map((t) => ({ opType: 'Constant', domain: '', input: [], output: [t.name], name: fresh('Constant'), attribute: [attr(t)] })));
  return m;
};

/** The weights in external data: written with a data file beside the model and read back (the project's own writer). */
const external = (m: ModelProto): ModelProto | null => {
  if (!m.graph!.initializer.some((t) => (t.rawData?.length ?? 0) >= 1024)) return null;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-variant-'));
  const file = path.join(dir, 'model.onnx');
  // One byte under the model's size: every initializer of 1 kB or more goes to model.onnx.data.
  try {
    writeModel(file, m, { maxProtobufBytes: serializeModel(m).length - 1 });
  } catch {
    return null; // too little of the model is in large initializers for the writer to fit it under that size
  }
  return readModel(file);
};

/** The main graph's default-domain import written twice, at the same version (what onnxruntime then resolves). */
const duplicateImport = (m: ModelProto): ModelProto | null => {
  const v = opsetOf(m);
  if (!v) return null;
  m.opsetImport.push({ domain: '', version: v });
  return m;
};

/** Each domain's import in force (the last; '' and 'ai.onnx' are one domain), as a function body's own imports. */
const inForce = (imports: ModelProto['opsetImport']): ModelProto['opsetImport'] => {
  const key = (d: string | undefined): string => (isDefaultDomain(d) ? '' : d!);
  return imports.filter((o, i) => !imports.slice(i + 1).some((p) => key(p.domain) === key(o.domain))).map((o) => ({ ...o }));
};

/**
 * Another default-domain version ahead of the model's own, spelt 'ai.onnx' (deeploy's SleepViT imports 21 then 17):
 * onnxruntime reads imports in order and the last wins, so the model keeps its meaning, and every node the patch
 * and verify insert must take the form of the model's own version, not the first import's nor the highest.
 */
const duplicateImportVersions = (m: ModelProto): ModelProto | null => {
  const v = opsetOf(m);
  if (!v) return null;
  m.opsetImport.unshift({ domain: 'ai.onnx', version: v + 4 <= 23 ? v + 4 : v - 4 });
  return m;
};

/**
 * The block from the query·key product to the value product (with everything on the paths between) as a
 * model-local function called once: torch's dynamo writer and mobius make such functions.
 */
const localFunction = (m: ModelProto, a: Anchor | null): ModelProto | null => {
  if (!a) return null;
  const g = m.graph!;
  const from = producerIndex(g, a.logits);
  const to = producerIndex(g, a.out);
  if (from < 0 || to < from) return null;
  const block = blockBetween(g, from, to);
  const produced = new Set(block.flatMap((n) => n.output));
  if (block.some((n) => n.attribute.some((at) => at.g || at.graphs.length))) return null;
  const inputs = [...new Set(block.flatMap((n) => n.input).filter((i) => i && !produced.has(i)))];
  const rest = g.node.filter((n) => !block.includes(n));
  const used = new Set([...rest.flatMap((n) => n.input), ...g.output.map((o) => o.name)]);
  const outputs = [...produced].filter((o) => used.has(o));
  const domain = 'ssmax.variants';
  const fn: FunctionProto = {
    name: 'attention_block', domain, input: inputs, output: outputs, attribute: [], attributeProto: [], node: block,
    opsetImport: inForce(m.opsetImport.filter((o) => o.domain !== domain)), docString: '', valueInfo: [], metadataProps: [],
  } as unknown as FunctionProto;
  const call: NodeProto = { opType: 'attention_block', domain, input: inputs, output: outputs, name: fresh('call'), attribute: [] };
  const first = g.node.indexOf(block[0]);
  g.node = [...g.node.slice(0, first).filter((n) => !block.includes(n)), call, ...g.node.slice(first).filter((n) => !block.includes(n))];
  m.functions.push(fn);
  m.opsetImport.push({ domain, version: 1 });
  if (toNumber(m.irVersion ?? 0) < 8) m.irVersion = 8;
  return m;
};

/** The nodes between two node indices that the product at `to` depends on and that depend on the node at `from`. */
function blockBetween(g: GraphProto, from: number, to: number): NodeProto[] {
  const down = new Set<string>(g.node[from].output);
  const reached = new Set<NodeProto>([g.node[from]]);
  for (let i = from + 1; i <= to; i++) {
    const n = g.node[i];
    if (n.input.some((x) => down.has(x))) {
      reached.add(n);
      n.output.forEach((o) => down.add(o));
    }
  }
  const need = new Set<string>(g.node[to].input);
  const block: NodeProto[] = [g.node[to]];
  for (let i = to - 1; i >= from; i--) {
    const n = g.node[i];
    if (reached.has(n) && n.output.some((o) => need.has(o))) {
      block.unshift(n);
      n.input.forEach((x) => need.add(x));
    }
  }
  return block;
}

/**
 * A QuantizeLinear/DequantizeLinear pair (int8, scale 1/127, zero point 0) on the probabilities, as static
 * quantisation writes one on the Softmax output. Not exact, so the variant is held to the original with the same
 * pair, and its patch to the unrewritten patch with the pair on its probabilities (quantise-then-patch against
 * patch-then-quantise: the factor goes before the Softmax, the pair is untouched).
 */
const qdqProbs = (m: ModelProto, a: Anchor | null): ModelProto | null => {
  if (!a || opsetOf(m) < 13 || elemType(m, a.probs) !== DataType.FLOAT) return null;
  const g = m.graph!;
  const scale = addInit(g, makeTensor(fresh('scale'), DataType.FLOAT, [], [1 / 127]));
  const zero = addInit(g, { ...makeTensor(fresh('zero'), DataType.FLOAT, [], [0]), dataType: DataType.INT8, rawData: undefined, floatData: [], int32Data: [0] });
  const [q, out] = [fresh('q'), fresh(`${a.probs}_dq`)];
  const pair = [node('QuantizeLinear', [a.probs, scale, zero], [q], {}, fresh('QuantizeLinear')),
    node('DequantizeLinear', [q, scale, zero], [out], {}, fresh('DequantizeLinear'))];
  return onEdge(g, a.probs, out, pair) ? m : null;
};

/**
 * Outputs of a chain of a QDQ pair and classes that rewrite the float path: a float rounding of those can move a
 * probability across an int8 step (1/127), passed on through the values. A QDQ pair alone is held to the exact tolerance.
 */
export const QDQ_TOLERANCE = 0.05;

/**
 * The model's default-domain opset moved to another version in 9..`maxOpset`, each op written in that version's
 * form: Softmax's axis (before 13 it flattens from `axis` on: the last axis is then `axis = rank − 1`), axes of
 * Unsqueeze, Squeeze and the reductions as attribute or input. Only models whose every op has one form across the
 * range (or a form this function writes) are moved; null otherwise.
 */
const retarget = (maxOpset: number) => (m: ModelProto, _a: Anchor | null, rnd: () => number): ModelProto | null => {
  const now = opsetOf(m);
  const g = m.graph!;
  if (!now || m.functions.length || g.node.some((n) => n.attribute.some((at) => at.g || at.graphs.length))) return null;
  const low = Math.max(9, ...g.node.filter((n) => !n.domain || n.domain === 'ai.onnx').map((n) => SINCE[n.opType] ?? 99));
  if (low > maxOpset) return null;
  const target = low + Math.floor(rnd() * (maxOpset - low + 1));
  if (target === now) return null;
  const ranks = modelScopes(m)[0].shapes;
  const axesValue = (n: NodeProto, inputFrom: number): number[] | null | undefined => {
    if (now >= inputFrom) return n.input[1] ? constInts(g, n.input[1]) : undefined;
    return n.attribute.find((at) => at.name === 'axes')?.ints.map(Number);
  };
  for (const n of [...g.node]) {
    if (n.domain && n.domain !== 'ai.onnx') continue;
    if (n.opType === 'Softmax' || n.opType === 'LogSoftmax') {
      const at = n.attribute.find((x) => x.name === 'axis');
      const axis = Number(at?.i ?? (now >= 13 ? -1 : 1));
      const rank = ranks.rank(n.input[0]);
      const last = axis === -1 || (rank !== undefined && axis === rank - 1);
      if (!last) return null; // another axis has no one-to-one form across 13
      if (target < 13 && rank === undefined) return null;
      n.attribute = [{ name: 'axis', type: 2, i: target >= 13 ? -1 : rank! - 1, floats: [], ints: [], strings: [], tensors: [], graphs: [] }];
    }
    const from = AXES_INPUT_FROM[n.opType];
    if (from && (now >= from) !== (target >= from)) {
      const axes = axesValue(n, from);
      if (axes === null) return null; // axes computed at run time: no attribute form
      const keep = n.attribute.filter((at) => at.name !== 'axes');
      if (target >= from) {
        n.input = [n.input[0], axes ? ints(g, axes) : ''].filter((x, i) => i === 0 || x);
        n.attribute = keep;
      } else {
        n.input = [n.input[0]];
        n.attribute = axes ? [...keep, { name: 'axes', type: 7, ints: axes, floats: [], strings: [], tensors: [], graphs: [] }] : keep;
      }
    }
  }
  // The spread drops a decoded import's absent domain (it lives on the prototype): an import with no domain field,
  // which ONNX reads as the default domain. Kept so: the tool once took such a model for one without a default import.
  m.opsetImport = m.opsetImport.map((o) => (isDefaultDomain(o.domain) ? { ...o, version: target } : o));
  return m;
};

function constInts(g: GraphProto, name: string): number[] | null {
  const t = g.initializer.find((x) => x.name === name);
  if (!t) return null;
  if (t.int64Data?.length) return t.int64Data.map(Number);
  if (t.rawData?.length) {
    const b = Buffer.from(t.rawData);
    return Array.from({ length: b.length / 8 }, (_v, i) => Number(b.readBigInt64LE(i * 8)));
  }
  return null;
}

/** The opset from which each op has had one form up to 24 (ops with a form this file converts: their first version ≤ 9). */
const SINCE: Record<string, number> = {
  MatMul: 9, Add: 9, Sub: 9, Mul: 9, Div: 9, Transpose: 9, Reshape: 9, Cast: 9, Identity: 9, Shape: 9, Gather: 9, Concat: 9,
  Where: 9, Softmax: 9, Unsqueeze: 9, Squeeze: 9, ReduceSum: 9, ReduceMax: 9, ReduceMean: 9, Expand: 9, Einsum: 12,
  Constant: 9, Sqrt: 9, Tanh: 9, Exp: 9, Equal: 11, Not: 9, Range: 11, ConstantOfShape: 9, Slice: 10, Neg: 9, Pow: 9,
  Erf: 9, LayerNormalization: 17, Relu: 9, Sigmoid: 9, Less: 9, Greater: 9, And: 9, Or: 9, Trilu: 14, Gemm: 9, Abs: 9,
  Reciprocal: 9, Max: 9, Min: 9, Tile: 9, Flatten: 9, CumSum: 11, IsNaN: 9, Gelu: 20,
};
const AXES_INPUT_FROM: Record<string, number> = { Unsqueeze: 13, Squeeze: 13, ReduceSum: 13, ReduceMax: 18, ReduceMean: 18 };

/**
 * onnxruntime's CPU provider runs an fp16 model's attention ops that lack fp16 kernels (MatMul, Div, Softmax) in
 * float32, with Casts around the run; an op inserted inside the run that has an fp16 kernel (Expand, Reshape,
 * Unsqueeze, Squeeze) splits it, and the logits (or the probabilities, on the value path) are rounded to fp16 there
 * (about 1e-3 relative), which moves peaked probabilities by more than 1e-2.
 */
const FP16_ROUNDING = 'an fp16 op inside the attention rounds its values to fp16 where onnxruntime kept the run in float32';

/** Every rewrite class, one function each. */
export const REWRITES: readonly RewriteClass[] = [
  { name: 'identity-probs', owner: 'detect', site: true, apply: identity('probs') },
  { name: 'identity-logits', owner: 'detect', site: true, apply: identity('logits') },
  { name: 'cast-same-probs', owner: 'detect', site: true, apply: castSame('probs') },
  { name: 'cast-same-logits', owner: 'detect', site: true, apply: castSame('logits') },
  { name: 'expand-same-probs', owner: 'detect', site: true, apply: expandSame('probs') },
  { name: 'expand-same-logits', owner: 'detect', site: true, apply: expandSame('logits'), inexactFp16: FP16_ROUNDING },
  { name: 'reshape-roundtrip-probs', owner: 'detect', site: true, apply: reshapeRoundTrip('probs') },
  { name: 'reshape-roundtrip-logits', owner: 'detect', site: true, apply: reshapeRoundTrip('logits'), inexactFp16: FP16_ROUNDING },
  { name: 'unsqueeze-squeeze-probs', owner: 'detect', site: true, apply: unsqueezeSqueeze('probs') },
  { name: 'unsqueeze-squeeze-logits', owner: 'detect', site: true, apply: unsqueezeSqueeze('logits'), inexactFp16: FP16_ROUNDING },
  { name: 'bh-view-probs', owner: 'detect', site: true, apply: bhView('probs') },
  { name: 'bh-view-logits', owner: 'detect', site: true, apply: bhView('logits'), inexactFp16: FP16_ROUNDING },
  { name: 'torch-bmm-values', owner: 'detect', site: true, apply: torchBmm, inexactFp16: FP16_ROUNDING },
  { name: 'fusedmatmul-qk', owner: 'detect', site: true, apply: fused('logits', 'none') },
  { name: 'fusedmatmul-qk-transB', owner: 'detect', site: true, apply: fused('logits', 'B') },
  { name: 'fusedmatmul-qk-transA', owner: 'detect', site: true, apply: fused('logits', 'A') },
  { name: 'fusedmatmul-values-transB', owner: 'detect', site: true, apply: fused('out', 'B') },
  { name: 'fusedmatmul-qk-alpha', owner: 'detect', site: true, apply: fusedAlpha },
  { name: 'einsum-qk', owner: 'detect', site: true, apply: einsum('logits') },
  { name: 'einsum-values', owner: 'detect', site: true, apply: einsum('out') },
  { name: 'softmax-decomposed', owner: 'detect', site: true, apply: decomposed(false), inexact: 'Exp of unshifted logits overflows on large logits' },
  { name: 'softmax-decomposed-max', owner: 'detect', site: true, apply: decomposed(true) },
  { name: 'local-function', owner: 'detect', site: true, apply: localFunction },
  { name: 'initializers-as-constants', owner: 'detect', site: false, apply: constants },
  { name: 'external-data', owner: 'detect', site: false, apply: external },
  { name: 'opset-retarget', owner: 'emit', site: false, apply: retarget(23) },
  { name: 'duplicate-opset-import', owner: 'emit', site: false, apply: duplicateImport },
  { name: 'duplicate-opset-import-versions', owner: 'emit', site: false, apply: duplicateImportVersions },
  { name: 'qdq-probs', owner: 'qdq', site: true, apply: qdqProbs },
];

/** Applies the chain to a copy of `m`; null when a class of it does not apply. */
export function applyChain(m: ModelProto, anchor: Anchor | null, chain: readonly RewriteClass[], seed: number): ModelProto | null {
  const rnd = seeded(seed);
  let out: ModelProto | null = cloneModel(m);
  for (const r of chain) {
    out = r.apply(out, anchor, rnd);
    if (!out) return null;
  }
  return out;
}

/**
 * The shortest sub-chain (in order) for which `fails` still holds: elements are dropped one at a time while the
 * rest still fails (a 1-minimal chain, as delta debugging's last stage gives).
 */
export async function shrink<T>(chain: readonly T[], fails: (c: readonly T[]) => Promise<boolean>): Promise<T[]> {
  let cur = [...chain];
  for (let i = 0; i < cur.length && cur.length > 1;) {
    const next = [...cur.slice(0, i), ...cur.slice(i + 1)];
    if (await fails(next)) cur = next;
    else i++;
  }
  return cur;
}
