/**
 * In-memory copies of the models that verification runs: the patch with its factor forced to 1, extra graph
 * outputs for the semantic probe (logits before and after each factor) and for attention sharpness (the largest
 * probability of each attention row), and bf16 inputs/outputs carried as float32 because onnxruntime-node has
 * no bfloat16 tensors. The files on disk are never touched.
 */
import { Graph } from '../graph/graph';
import { makeTensor } from '../graph/tensor';
import { readsOf, topoSort } from '../graph/toposort';
import { Shapes } from '../graph/shapes';
import { findValueMatMul } from '../detect/trace';
import { defaultOpset } from '../detect/find-attention';
import { AttributeProto, AttributeType, DataType, GraphProto, ModelProto, NodeProto, TensorProto } from '../io/onnx';
import { cloneModel } from '../rewrite/patch';
import { SiteRecord } from '../rewrite/record';
import { countsMasks } from '../policy/n-mode';

/** The Mul that applies a factor (not the Casts around it, named apply_in / apply_out). */
const APPLY = /^ssmax\/L\d+\/apply(_\d+)?$/;
const PREFIX = 'ssmax_verify/';

/** The patched model with every inserted factor replaced by 1: the wiring alone. A deep copy. */
export function withUnitFactor(patched: ModelProto): ModelProto {
  return forceUnitFactor(cloneModel(patched));
}

/**
 * Replaces, in `model` itself, the factor input of every apply node by 1, in the main graph, its subgraphs and
 * the model's functions (apply nodes are copied first). The 1 takes the type of what it multiplies.
 */
export function forceUnitFactor(model: ModelProto): ModelProto {
  const g = model.graph!;
  const shapes = new Shapes(new Graph(g));
  const opset = defaultOpset(model);
  for (const list of nodeLists(model)) {
    for (let i = list.length - 1; i >= 0; i--) {
      if (!APPLY.test(list[i].name)) continue;
      const apply = { ...list[i], input: [...list[i].input] };
      const one = `${apply.name}/unit_factor`;
      const type = list === g.node ? shapes.type(apply.input[1]) ?? shapes.type(apply.input[0]) : undefined;
      const ones: NodeProto[] = type !== undefined || opset < 15
        ? [constantNode(one, makeTensor('', type ?? DataType.FLOAT, [], [1]))]
        : [constantNode(`${one}_f`, makeTensor('', DataType.FLOAT, [], [1])), plainNode('CastLike', [`${one}_f`, apply.input[0]], one, [])];
      apply.input[1] = one;
      list.splice(i, 1, ...ones, apply);
    }
  }
  dropDeadFactorNodes(g);
  return model;
}

/** Every node list of a model: the main graph, every subgraph (recursively), every function body. */
function nodeLists(model: ModelProto): NodeProto[][] {
  const lists: NodeProto[][] = [];
  const visit = (nodes: NodeProto[]): void => {
    lists.push(nodes);
    for (const n of nodes) for (const a of n.attribute) for (const sub of [...(a.g ? [a.g] : []), ...(a.graphs ?? [])]) visit(sub.node);
  };
  visit(model.graph!.node);
  for (const fn of model.functions) visit(fn.node);
  return lists;
}

function constantNode(output: string, value: TensorProto): NodeProto {
  return { opType: 'Constant', domain: '', input: [], output: [output], name: output, attribute: [{ name: 'value', type: AttributeType.TENSOR, t: value, floats: [], ints: [], strings: [], tensors: [], graphs: [] }] };
}

/**
 * Removes the inserted nodes nothing reads any more (the factor computation once the factor is 1). Left in,
 * onnxruntime's optimizer can fuse away a tensor they still read and then reject the model.
 */
function dropDeadFactorNodes(g: GraphProto): void {
  for (let changed = true; changed;) {
    const read = new Set<string>(g.output.map((o) => o.name));
    // Names read inside a node's subgraphs count too (an If branch reading a shared mask).
    for (const n of g.node) for (const i of readsOf(n)) read.add(i);
    const kept = g.node.filter((n) => !n.name.startsWith('ssmax/') || n.output.some((o) => read.has(o)));
    changed = kept.length !== g.node.length;
    g.node = kept;
  }
}

/** Graph output names of the probe tensors of one site. */
export interface ProbeNames {
  layer: number;
  before: string;
  after: string;
  /** The logits the Softmax reads (masks applied), for n counted from masks. */
  masked?: string;
}

/** Sites the probe can read: plain-op sites of the main graph (fused kernels and nested graphs hide their logits). */
export function probeable(site: SiteRecord): boolean {
  return !site.kind && (site.scope ?? 'main') === 'main' && site.apply !== undefined;
}

/**
 * Adds, for each site, the logits before and after its factor as float32 graph outputs. A factor on the query
 * is read on the logits too: `after` is the QK product of the scaled query, `before` the same product recomputed
 * from the unscaled query.
 */
export function addProbeOutputs(model: ModelProto, sites: SiteRecord[]): { probes: ProbeNames[]; missing: string[] } {
  const graph = new Graph(model.graph!);
  const probes: ProbeNames[] = [];
  const missing: string[] = [];
  for (const site of sites.filter(probeable)) {
    const apply = graph.nodes.find((n) => n.name === site.apply);
    const qk = site.logits ? graph.producer.get(site.logits) : undefined;
    if (!apply || (site.target === 'query' && !qk)) {
      missing.push(`layer ${site.layer}: ${apply ? `QK product '${site.logits}'` : `apply node '${site.apply}'`} is not in the graph`);
      continue;
    }
    const added = graph.proto.node.length;
    let before = apply.input[0], after = apply.output[0], anchor = apply;
    if (site.target === 'query' && qk) {
      // The query as the model had it: before the Cast to fp32 that wraps a half-precision factor, if any.
      const widen = graph.producer.get(apply.input[0]);
      const query = widen && /\/apply_in(_\d+)?$/.test(widen.name) ? widen.input[0] : apply.input[0];
      before = graph.uniqueName(`${PREFIX}L${site.layer}/qk_unscaled`);
      graph.proto.node.push({ ...qk, name: graph.uniqueNodeName(`${PREFIX}L${site.layer}/qk_unscaled`), input: [query, ...qk.input.slice(1)], output: [before] });
      after = qk.output[0];
      anchor = qk;
    }
    const softmax = graph.nodes.find((n) => n.opType === 'Softmax' && (n.name === site.softmax || `Softmax(${n.output[0]})` === site.softmax));
    probes.push({
      layer: site.layer,
      before: floatOutput(graph, before, `${PREFIX}L${site.layer}/before`),
      after: floatOutput(graph, after, `${PREFIX}L${site.layer}/after`),
      ...(countsMasks(site.n) && softmax ? { masked: floatOutput(graph, softmax.input[0], `${PREFIX}L${site.layer}/masked`) } : {}),
    });
    placeAfter(graph.proto, anchor, added);
  }
  topoSort(graph.proto);
  return { probes, missing };
}

/** Rows per attention site whose largest probability is read: the last ROW_SAMPLE rows. */
export const ROW_SAMPLE = 64;

/**
 * Adds, for each attention Softmax (by node label), the largest probability of each of its last ROW_SAMPLE
 * rows as a float32 output. Reducing only a slice keeps the extra work and memory small at long lengths.
 */
export function addRowMaxOutputs(model: ModelProto, softmaxLabels: { layer: number; softmax: string }[]): Map<number, string> {
  const graph = new Graph(model.graph!);
  const opset = defaultOpset(model);
  const shapes = new Shapes(graph);
  const out = new Map<number, string>();
  for (const { layer, softmax } of softmaxLabels) {
    const node = graph.nodes.find((n) => n.opType === 'Softmax' && (n.name === softmax || `Softmax(${n.output[0]})` === softmax));
    if (!node) continue;
    const added = graph.proto.node.length;
    const rows = lastRows(graph, node.output[0], shapes.rank(node.output[0]), opset, layer);
    const rowMax = graph.uniqueName(`${PREFIX}L${layer}/row_max_raw`);
    const reduce: NodeProto = opset >= 18
      ? plainNode('ReduceMax', [rows, int64s(graph, `${PREFIX}L${layer}/last_axis`, [-1])], rowMax, [intAttr('keepdims', 0)])
      : plainNode('ReduceMax', [rows], rowMax, [intAttr('keepdims', 0), intsAttr('axes', [-1])]);
    graph.proto.node.push(reduce);
    out.set(layer, floatOutput(graph, rowMax, `${PREFIX}L${layer}/row_max`));
    placeAfter(graph.proto, node, added);
    orderBeforeValues(graph, node.output[0], rowMax, shapes, layer);
  }
  return out;
}

/**
 * Makes the attention's value MatMul wait for the row maximum by adding an exact zero computed from it to the
 * values (v + (m − m), with m finite whenever the probabilities are). Without this dependency onnxruntime
 * schedules the extra reductions after the whole graph and keeps every layer's attention matrix alive until
 * then: 12 GB instead of 3.5 GB for a 12-layer model at 4096 tokens.
 */
function orderBeforeValues(graph: Graph, probs: string, rowMax: string, shapes: Shapes, layer: number): void {
  const matmul = findValueMatMul(graph, probs);
  if (!matmul) return;
  const values = matmul.input[1];
  const m = graph.uniqueName(`${PREFIX}L${layer}/order_max`);
  const zero = graph.uniqueName(`${PREFIX}L${layer}/order_zero`);
  const dependent = graph.uniqueName(`${PREFIX}L${layer}/values_after_row_max`);
  const nodes = [plainNode('ReduceMax', [rowMax], m, [intAttr('keepdims', 0)]), plainNode('Sub', [m, m], zero, [])];
  const valueType = shapes.type(values);
  let zeroTyped = zero;
  if (valueType !== undefined && valueType !== shapes.type(probs)) {
    zeroTyped = graph.uniqueName(`${PREFIX}L${layer}/order_zero_cast`);
    nodes.push(plainNode('Cast', [zero], zeroTyped, [intAttr('to', valueType)]));
  }
  nodes.push(plainNode('Add', [values, zeroTyped], dependent, []));
  const index = graph.proto.node.indexOf(matmul);
  graph.proto.node[index] = { ...matmul, input: [matmul.input[0], dependent] };
  graph.proto.node.splice(index, 0, ...nodes);
}

/**
 * Moves the nodes appended from index `from` on to just after `anchor`, so onnxruntime runs them while the
 * tensor they read is alive instead of keeping every layer's attention matrix until the end of the graph.
 */
function placeAfter(g: GraphProto, anchor: NodeProto, from: number): void {
  const moved = g.node.splice(from);
  g.node.splice(g.node.indexOf(anchor) + 1, 0, ...moved);
}

/** The last ROW_SAMPLE rows (axis −2) of `probs`, or all of it where the opset and rank do not allow a Slice. */
function lastRows(graph: Graph, probs: string, rank: number | undefined, opset: number, layer: number): string {
  const out = graph.uniqueName(`${PREFIX}L${layer}/last_rows`);
  if (opset >= 10 && (opset >= 11 || rank !== undefined)) {
    const axis = opset >= 11 ? -2 : rank! - 2;
    const inputs = [probs, int64s(graph, `${PREFIX}L${layer}/rows_start`, [-ROW_SAMPLE]),
      int64s(graph, `${PREFIX}L${layer}/rows_end`, [2 ** 62]), int64s(graph, `${PREFIX}L${layer}/rows_axis`, [axis])];
    graph.proto.node.push(plainNode('Slice', inputs, out, []));
    return out;
  }
  if (rank === undefined) return probs;
  graph.proto.node.push(plainNode('Slice', [probs], out, [intsAttr('starts', [-ROW_SAMPLE]), intsAttr('ends', [2 ** 62]), intsAttr('axes', [rank - 2])]));
  return out;
}

export function hasBf16Io(model: ModelProto): boolean {
  const g = model.graph!;
  return [...g.input, ...g.output].some((v) => v.type?.tensorType?.elemType === DataType.BFLOAT16);
}

/**
 * bf16 graph inputs become float32 inputs cast to bf16 inside the graph; bf16 outputs are cast to float32.
 * Edits nodes and value infos in place: give it a deep copy. Returns the names of the adapted inputs.
 */
export function carryBf16AsFloat(model: ModelProto): string[] {
  const graph = new Graph(model.graph!);
  const adapted: string[] = [];
  for (const input of graph.proto.input) {
    const t = input.type?.tensorType;
    if (!t || t.elemType !== DataType.BFLOAT16 || graph.initializers.has(input.name)) continue;
    const inner = graph.uniqueName(`${PREFIX}${input.name}/bf16`);
    for (const node of graph.consumersOf(input.name)) node.input = node.input.map((x) => (x === input.name ? inner : x));
    for (const o of graph.proto.output) if (o.name === input.name) o.name = inner;
    t.elemType = DataType.FLOAT;
    graph.proto.node.unshift(plainNode('Cast', [input.name], inner, [intAttr('to', DataType.BFLOAT16)]));
    adapted.push(input.name);
  }
  for (const output of graph.proto.output) {
    const t = output.type?.tensorType;
    if (!t || t.elemType !== DataType.BFLOAT16) continue;
    const inner = graph.uniqueName(`${PREFIX}${output.name}/bf16`);
    renameProduced(graph, output.name, inner);
    graph.proto.node.push(plainNode('Cast', [inner], output.name, [intAttr('to', DataType.FLOAT)]));
    t.elemType = DataType.FLOAT;
  }
  topoSort(model.graph!);
  return adapted;
}

function renameProduced(graph: Graph, from: string, to: string): void {
  const producer = graph.producer.get(from);
  if (producer) producer.output = producer.output.map((x) => (x === from ? to : x));
  for (const node of graph.consumersOf(from)) node.input = node.input.map((x) => (x === from ? to : x));
}

function floatOutput(graph: Graph, tensor: string, name: string): string {
  const out = graph.uniqueName(name);
  graph.proto.node.push(plainNode('Cast', [tensor], out, [intAttr('to', DataType.FLOAT)]));
  graph.proto.output.push({ name: out, type: { tensorType: { elemType: DataType.FLOAT } } });
  return out;
}

function int64s(graph: Graph, base: string, values: number[]): string {
  return addInitializer(graph, makeTensor(graph.uniqueName(base), DataType.INT64, [values.length], values));
}

/** Adds a constant; graphs of IR version < 4 also declare every initializer as an input. */
function addInitializer(graph: Graph, t: TensorProto): string {
  graph.proto.initializer.push(t);
  if (graph.proto.input.some((i) => graph.initializers.has(i.name))) {
    graph.proto.input.push({ name: t.name, type: { tensorType: { elemType: t.dataType, shape: { dim: t.dims.map((d) => ({ dimValue: d })) } } } });
  }
  return t.name;
}

function plainNode(opType: string, input: string[], output: string, attribute: AttributeProto[]): NodeProto {
  return { opType, domain: '', input, output: [output], name: `${PREFIX}${output}`, attribute };
}

function intAttr(name: string, i: number): AttributeProto {
  return { name, type: AttributeType.INT, i, floats: [], ints: [], strings: [], tensors: [], graphs: [] };
}

function intsAttr(name: string, ints: number[]): AttributeProto {
  return { name, type: AttributeType.INTS, ints, floats: [], strings: [], tensors: [], graphs: [] };
}
