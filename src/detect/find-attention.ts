/**
 * Finds the attention in a model with the rules of rules.ts: Softmax sites (softmax.ts), fused operators
 * (fused.ts) and calls of functions whose body holds attention (each call its own layer), and says for every
 * other Softmax why it was skipped. Every graph is searched: the main graph, If/Loop/Scan bodies and other graph
 * attributes at any depth, and function bodies. Layers are numbered in graph order within each graph.
 */
import { InputError } from '../errors';
import { nodeLabel } from '../graph/graph';
import { defaultOpsetOf, modelScopes, Scope } from '../graph/scopes';
import { topoOrder } from '../graph/toposort';
import { validateGraph } from '../graph/validate';
import { AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto } from '../io/onnx';
import { isPatchNode } from '../identity';
import { CandidateTrace, RULES, runRules } from './rules';
import type { AttentionSite, CallSite, FusedSite, Found, Rule } from './site';
import { siteNodeLabel } from './site';

export type { CandidateTrace, RuleAttempt } from './rules';
export type { AttentionSite, CallSite } from './site';

export interface SkippedSoftmax {
  node: string;
  reason: string;
  /** The graph it is in, when not the main graph. */
  scope?: string;
  /** True when --force-site NAME would patch it anyway. */
  forcible?: boolean;
  /** True when the node is attention that was refused (not a Softmax that is something else). */
  attention?: boolean;
  /** Refused attention keeps its layer number, so patched layers are numbered the same with or without it. */
  layer?: number;
  /** The closest detection rule (the one that got furthest) and the node where it stopped. */
  rule?: string; stoppedAt?: string;
}

/** `traces`: per candidate node, every rule tried and where each stopped. */
export interface Detection { sites: AttentionSite[]; fused: FusedSite[]; calls: CallSite[]; skipped: SkippedSoftmax[]; traces: CandidateTrace[] }

/**
 * `force`: node names whose refusal (a deviation from exact SSMax, an unprovable Softmax axis) the user accepts;
 * `rules`: the detection rules in the order they are tried (default RULES).
 */
export interface DetectOptions { force?: readonly string[]; rules?: readonly Rule[] }

export const defaultOpset = (model: ModelProto): number => defaultOpsetOf(model.opsetImport);

/** Detection over the whole model: every graph, subgraph and function body. */
export const findAttentionSoftmax = (model: ModelProto, options: DetectOptions = {}): Detection =>
  detectAttention(model, modelScopes(model), options);

type Entry = { kind: 'refused'; skip: SkippedSoftmax } | (Found & { rule: string });

/** Detection over the given scopes of `model` (modelScopes): analyseModel runs it once with the structural checks first. */
export function detectAttention(model: ModelProto, scopes: Scope[], options: DetectOptions = {}): Detection {
  const force = new Set(options.force ?? []);
  const rules = options.rules ?? RULES;
  const out: Detection = { sites: [], fused: [], calls: [], skipped: [], traces: [] };
  const bodies = new Map<FunctionProto, (AttentionSite | FusedSite)[]>();
  const called = new Set<FunctionProto>();
  // Function bodies first: each call of one is numbered as the layers of its body. Refused attention in a graph
  // keeps its layer number; in a function body it has none.
  for (const scope of [...scopes.filter((s) => s.kind === 'function'), ...scopes.filter((s) => s.kind !== 'function')]) {
    if (insideInserted(scope)) continue; // the branches of an expanded operator are the patch's own
    const fn = scope.fn;
    const inner: (AttentionSite | FusedSite)[] = [];
    let layer = 0;
    for (const e of scanScope(model, scope, { force, rules }, out)) {
      if (e.kind === 'refused') out.skipped.push(fn ? e.skip : { ...e.skip, layer: layer++ });
      else if (e.kind === 'softmax') (fn ? inner : out.sites).push({ ...e.site, rule: e.rule, scope: scope.path, layer: fn ? inner.length : layer++ });
      else if (e.kind === 'fused') (fn ? inner : out.fused).push({ ...e.site, rule: e.rule, scope: scope.path, layer: fn ? inner.length : layer++ });
      else if (fn) {
        out.skipped.push({ node: nodeLabel(e.node), scope: scope.path, attention: true, rule: e.rule, stoppedAt: nodeLabel(e.node),
          reason: `call of function '${e.fn.name}' (which holds attention) from inside another function: nested calls are not patched` });
      } else {
        called.add(e.fn);
        for (const s of bodies.get(e.fn) ?? []) out.calls.push({ layer: layer++, scope: scope.path, call: e.node, fn: e.fn, inner: s });
      }
    }
    if (fn) bodies.set(fn, inner);
  }
  for (const [fn, inner] of bodies) {
    if (called.has(fn)) continue;
    for (const s of inner) {
      const node = siteNodeLabel(s);
      out.skipped.push({ node, scope: s.scope, attention: true, reason: `inside function '${fn.name}', which no graph calls`, rule: s.rule });
    }
  }
  return out;
}

/** True for a graph held by a node the patch inserted (at any depth). */
function insideInserted(scope: Scope): boolean {
  for (let owner = scope.owner; owner; owner = owner.scope.owner) if (isPatchNode(owner.node)) return true;
  return false;
}

/** Runs the rules on every node of a scope, in topological order (a few files in the wild store nodes out of it). */
function scanScope(model: ModelProto, scope: Scope, using: { force: Set<string>; rules: readonly Rule[] }, out: Detection): Entry[] {
  const entries: Entry[] = [];
  for (const node of topoOrder(scope.graph.proto)) {
    const result = runRules(using.rules, { model, scope, forced: using.force.has(nodeLabel(node)) }, node);
    if (!result) continue;
    const { trace, stop } = result;
    out.traces.push(trace);
    if (!stop) {
      entries.push({ ...result.found!, rule: trace.rule });
      continue;
    }
    const skip: SkippedSoftmax = { node: trace.node, reason: stop.reason, ...(scope.kind === 'main' ? {} : { scope: scope.path }),
      ...(stop.forcible ? { forcible: true } : {}), ...(stop.attention ? { attention: true } : {}), rule: trace.rule, stoppedAt: nodeLabel(stop.at) };
    if (stop.attention) entries.push({ kind: 'refused', skip });
    else out.skipped.push(skip);
  }
  return entries;
}

/** A candidate's trace and what detection made of it: `attention (rule R)`, `skipped: reason` or `refused: reason`. */
export interface Explanation extends CandidateTrace { verdict: string }

/** The traces of the candidates whose name or label is `name` (`*` matches any text); none is an InputError. */
export function explainNode(model: ModelProto, name: string): Explanation[] {
  validateGraph(model.graph!);
  const d = findAttentionSoftmax(model);
  const pattern = new RegExp(`^${name.split('*').map((p) => p.replace(/[.+?^$()|[\]{}\\]/g, '\\$&')).join('.*')}$`, 's');
  const chosen = d.traces.filter((t) => pattern.test(t.node));
  const some = d.traces.slice(0, 5).map((t) => t.node).join(', ') + (d.traces.length > 5 ? `, … ${d.traces.length} in all` : '');
  if (chosen.length === 0) throw new InputError(`no attention candidate named '${name}' (${some ? `candidates: ${some}` : 'the model has none'})`, 'usage');
  return chosen.map((t) => {
    const k = d.skipped.find((s) => s.node === t.node && (s.scope ?? 'main') === t.scope);
    return { ...t, verdict: k ? `${k.attention ? 'refused' : 'skipped'}: ${k.reason}` : `attention (rule ${t.rule})` };
  });
}

/**
 * A detection of `from` as a detection of `to`, a copy of it (cloneModel): every node, graph and function it names
 * is replaced by its counterpart in the copy. Naming a node that is not `from`'s is an input error.
 */
export function rebindDetection(detection: Detection, from: ModelProto, to: ModelProto): Detection {
  const counterpart = new Map<object, object>();
  const pairNodes = (a: NodeProto[], b: NodeProto[]): void => a.forEach((n, i) => {
    counterpart.set(n, b[i]);
    n.attribute.forEach((at: AttributeProto, j) => {
      if (at.g) pairGraphs(at.g, b[i].attribute[j].g!);
      at.graphs?.forEach((g, k) => pairGraphs(g, b[i].attribute[j].graphs[k]));
    });
  });
  const pairGraphs = (a: GraphProto, b: GraphProto): void => {
    counterpart.set(a, b);
    pairNodes(a.node, b.node);
  };
  pairGraphs(from.graph!, to.graph!);
  from.functions.forEach((f, i) => {
    counterpart.set(f, to.functions[i]);
    pairNodes(f.node, to.functions[i].node);
  });
  const rebind = (v: unknown): unknown => {
    if (typeof v !== 'object' || v === null) return v;
    const mapped = counterpart.get(v);
    if (mapped) return mapped;
    if (Array.isArray(v)) return v.map(rebind);
    if ('opType' in v && 'input' in v && 'output' in v) throw new InputError('the detection given to patchModel names a node of another model: run detectAttention on this model', 'usage');
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, rebind(x)]));
  };
  return rebind(detection) as Detection;
}