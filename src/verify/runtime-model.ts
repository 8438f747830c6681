/**
 * In-memory copies of the models that verification runs: the patch with its factor forced to 1, extra graph
 * outputs for the semantic probe (logits before and after each factor) and for attention sharpness (the largest
 * probability of each attention row), and bf16 inputs/outputs carried as float32 because onnxruntime-node has
 * no bfloat16 tensors. The files on disk are never touched.
 */
import { Graph } from '../graph/graph';
import { makeTensor } from '../graph/tensor';
import { inferElemTypes } from '../graph/types';
import { topoSort } from '../graph/toposort';
import { defaultOpset } from '../detect/find-attention';
import { AttributeProto, AttributeType, DataType, ModelProto, NodeProto } from '../io/onnx';
import { cloneModel } from '../rewrite/patch';
import { SiteRecord } from '../rewrite/record';

const APPLY = /^ssmax\/L\d+\/apply/;
const PREFIX = 'ssmax_verify/';

/** The patched model with every inserted factor replaced by 1: the wiring alone. A deep copy. */
export function withUnitFactor(patched: ModelProto): ModelProto {
  return forceUnitFactor(cloneModel(patched));
}

/**
 * A copy of `model` that shares its tensors and untouched nodes: enough to add nodes, outputs and
 * initializers, or to replace whole nodes, without copying hundreds of megabytes of weights.
 */
export function shallowCopy(model: ModelProto): ModelProto {
  const g = model.graph!;
  return {
    ...model,
    metadataProps: [...model.metadataProps],
    graph: { ...g, node: [...g.node], input: [...g.input], output: [...g.output], initializer: [...g.initializer], valueInfo: [...g.valueInfo] },
  };
}

/** Replaces, in `model` itself, the factor input of every apply node by a constant 1; apply nodes are copied first. */
export function forceUnitFactor(model: ModelProto): ModelProto {
  const g = model.graph!;
  g.node = g.node.map((n) => (APPLY.test(n.name) ? { ...n, input: [...n.input] } : n));
  const graph = new Graph(g);
  const types = inferElemTypes(graph);
  for (const node of graph.nodes.filter((n) => APPLY.test(n.name))) {
    const type = types.get(node.input[1]) ?? types.get(node.input[0]);
    const name = graph.uniqueName(`${node.name}/unit_factor`);
    graph.proto.initializer.push(makeTensor(name, type ?? DataType.FLOAT, [], [1]));
    node.input[1] = name;
  }
  return model;
}

/** Graph output names of the probe tensors of one site. */
export interface ProbeNames {
  layer: number;
  before: string;
  after: string;
}

/** Adds, for each site, the logits before and after its factor as float32 graph outputs. */
export function addProbeOutputs(model: ModelProto, sites: SiteRecord[]): { probes: ProbeNames[]; missing: string[] } {
  const graph = new Graph(model.graph!);
  const probes: ProbeNames[] = [];
  const missing: string[] = [];
  for (const site of sites) {
    const apply = graph.nodes.find((n) => n.name === site.apply);
    if (!apply) {
      missing.push(`layer ${site.layer}: apply node '${site.apply}' is not in the graph`);
      continue;
    }
    probes.push({
      layer: site.layer,
      before: floatOutput(graph, apply.input[0], `${PREFIX}L${site.layer}/before`),
      after: floatOutput(graph, apply.output[0], `${PREFIX}L${site.layer}/after`),
    });
  }
  topoSort(model.graph!);
  return { probes, missing };
}

/** Adds, for each attention Softmax (by node label), the maximum probability of every row as a float32 output. */
export function addRowMaxOutputs(model: ModelProto, softmaxLabels: { layer: number; softmax: string }[]): Map<number, string> {
  const graph = new Graph(model.graph!);
  const opset = defaultOpset(model);
  const out = new Map<number, string>();
  for (const { layer, softmax } of softmaxLabels) {
    const node = graph.nodes.find((n) => n.opType === 'Softmax' && (n.name === softmax || `Softmax(${n.output[0]})` === softmax));
    if (!node) continue;
    const rowMax = graph.uniqueName(`${PREFIX}L${layer}/row_max_raw`);
    const reduce: NodeProto = opset >= 18
      ? plainNode('ReduceMax', [node.output[0], axesInitializer(graph, layer)], rowMax, [intAttr('keepdims', 0)])
      : plainNode('ReduceMax', [node.output[0]], rowMax, [intAttr('keepdims', 0), intsAttr('axes', [-1])]);
    graph.proto.node.push(reduce);
    out.set(layer, floatOutput(graph, rowMax, `${PREFIX}L${layer}/row_max`));
  }
  topoSort(model.graph!);
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

function axesInitializer(graph: Graph, layer: number): string {
  const name = graph.uniqueName(`${PREFIX}L${layer}/last_axis`);
  graph.proto.initializer.push(makeTensor(name, DataType.INT64, [1], [-1]));
  return name;
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
