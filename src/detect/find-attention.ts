/**
 * Finds the attention in a model with the rules of rules.ts: Softmax sites (softmax.ts), fused operators
 * (fused.ts) and calls of functions whose body holds attention (each call its own layer), and says for every
 * other Softmax why it was skipped. Every graph is searched: the main graph, If/Loop/Scan bodies and other graph
 * attributes at any depth, and function bodies. Layers are numbered in graph order within each graph.
 */
import { InputError } from '../errors';
import { nodeLabel } from '../graph/graph';
import { constantOf } from '../graph/poly';
import { defaultOpsetOf, modelScopes, Scope } from '../graph/scopes';
import { topoOrder } from '../graph/toposort';
import { validateGraph } from '../graph/validate';
import { AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto } from '../io/onnx';
import { isPatchNode } from '../identity';
import { maskUses } from './mask-uses';
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
    const entries = scanScope(model, scope, { force, rules }, out);
    for (const e of scope.perCall ? agreedAcrossCalls(model, scope, entries, { force, rules }) : entries) {
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

/**
 * A function body called several times is patched once for all its calls, but each call binds its inputs to its
 * own arguments: a site is kept only where no two calls see it differently (its rule, its masks and their kinds,
 * heads, ranks; what one call cannot tell, as the shape of an earlier call's output, disagrees with nothing).
 * Where two calls differ (one passes a causal mask, another a padding mask), it is refused naming both.
 */
function agreedAcrossCalls(model: ModelProto, scope: Scope, entries: Entry[], using: { force: Set<string>; rules: readonly Rule[] }): Entry[] {
  const calls = scope.calls!;
  const views = scope.perCall!().map((s) => {
    const entries = scanScope(model, s, using, { sites: [], fused: [], calls: [], skipped: [], traces: [] });
    const found = new Map(entries.map((e) => [entryNode(e), describeEntry(s, e)]));
    return (node: string): Facts => found.get(node) ?? [['kind', 'not attention']];
  });
  return entries.map((e) => {
    if (e.kind !== 'softmax' && e.kind !== 'fused') return e;
    const node = entryNode(e);
    const seen = views.map((v) => v(node));
    const pair = firstDisagreement(seen);
    if (!pair) return e;
    const [i, j] = pair;
    const call = (k: number): string => `'${nodeLabel(calls[k].node)}'${calls[k].scope.kind === 'main' ? '' : ` (${calls[k].scope.path})`}`;
    const reason = `calls ${call(i)} and ${call(j)} of function '${scope.fn!.name}' see this attention differently (${said(seen[i])}; against ${said(seen[j])}): `
      + 'the body is patched once for all its calls, so no one n fits them; not patched';
    return { kind: 'refused', skip: { node, reason, scope: scope.path, attention: true, rule: e.rule, stoppedAt: node } };
  });
}

/** What one binding of a body tells of a candidate, fact by fact; `?` where it cannot tell. */
type Facts = [string, string][];

const said = (f: Facts): string => f.filter(([, v]) => v !== '?').map(([k, v]) => `${k} ${v}`).join(', ');

/** Two bindings disagree when they tell different facts, or both know a fact and differ on it. */
function disagree(a: Facts, b: Facts): boolean {
  if (a.length !== b.length) return true;
  return a.some(([k, v], i) => k !== b[i][0] || (v !== '?' && b[i][1] !== '?' && v !== b[i][1]));
}

function firstDisagreement(seen: Facts[]): [number, number] | null {
  for (let i = 0; i < seen.length; i++) for (let j = i + 1; j < seen.length; j++) if (disagree(seen[i], seen[j])) return [i, j];
  return null;
}

const entryNode = (e: Entry): string => (e.kind === 'refused' ? e.skip.node : e.kind === 'call' ? nodeLabel(e.node) : e.kind === 'softmax' ? nodeLabel(e.site.softmax) : nodeLabel(e.site.node));

/** What detection makes of a candidate in one binding of a body: what decides n and the heads, no tensor names. */
function describeEntry(scope: Scope, e: Entry): Facts {
  if (e.kind === 'refused') return [['kind', 'refused'], ['reason', e.skip.reason]];
  if (e.kind === 'call') return [['kind', 'a call']];
  const heads: Facts = [['heads', String(e.site.heads.heads ?? '?')], ['head axis', String(e.site.heads.axis ?? '?')]];
  if (e.kind === 'fused') {
    return [['rule', e.rule], ...heads, ['mask', e.site.mask.causal ? 'causal' : 'not causal'],
      ['plan', JSON.stringify({ n: e.site.n, query: e.site.query, deviation: e.site.deviation, expand: e.site.expand })]];
  }
  const site = e.site;
  const uses = maskUses(scope.graph, { steps: site.afterLogits, qk: site.qkMatMul.output[0] }, scope.shapes);
  const shape = (t: string): string => {
    const dims = scope.shapes.shape(t);
    return dims ? `[${dims.map((d) => constantOf(d) ?? '?').join(',')}]` : '?';
  };
  const terms = uses.flatMap((u, i): Facts => [[`term ${i}`, `${u.role} ${u.kind} (${u.rule})`], [`term ${i} shape`, shape(u.tensor)],
    [`term ${i} view rank`, String(u.viewRank ?? '?')], [`term ${i} view`, u.viewShape ? 'of known dims' : '?']]);
  return [['rule', e.rule], ['mask', site.mask.causal ? 'causal' : 'not causal'], ...terms, ...heads, ['logits rank', String(site.logitsRank ?? '?')],
    ['group axis', String(site.groupAxis ?? 'none')], ['forced', site.forced ?? 'no']];
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