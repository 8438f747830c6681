/**
 * Sites inside a graph attribute of an operator other than If, Loop and Scan (the decoders of com.microsoft
 * GreedySearch and BeamSearch) cannot be brought out as outputs: the operator defines its outputs. Such a graph
 * that reads nothing from the graph around it is a model of its own: it is lifted out of both models (the
 * patched one with its record's sites and journal entries for that graph), and verified on inputs synthesised from
 * its own signature: the probe, retrofit parity and sharpness of its sites are judged on the lifted pair, in memory.
 */
import { InputError } from '../errors';
import { nodeLabel } from '../graph/graph';
import { modelScopes, Scope } from '../graph/scopes';
import { readsOf } from '../graph/toposort';
import { GraphProto, isDefaultDomain, ModelProto } from '../io/onnx';
import { cloneModel } from '../rewrite/patch';
import { PatchRecord, readRecord, removeRecord, writeRecord } from '../rewrite/record';
import { CheckId } from './plan';
import { ProbeSiteResult } from './probe';
import { CheckResult } from './report';
import type { FileVerifyOptions as VerifyOptions } from './options';
import type { VerifyReport } from './report';

/** The checks a lifted graph is verified with: those that read its sites' tensors, which the model cannot bring out. */
export const LIFTED_CHECKS: readonly CheckId[] = ['probe', 'retrofit', 'sharpness'];

export interface Lifted {
  /** Per site index: the lifted probe's result, or why the site could not be probed that way. */
  probes: Map<number, ProbeSiteResult | string>;
  /** Per site index: the graph it was lifted out of, with the verdicts of its verification. */
  graphs: Map<number, LiftedGraph>;
}

export interface LiftedGraph {
  /** How messages name it: `the decoder graph of BeamSearch 'X'`. */
  where: string;
  /** The site indices of the outer verification in it. */
  sites: number[];
  /** The lifted pair's verdict per check it ran (retrofit, sharpness), or why it could not run. */
  checks: Map<CheckId, CheckResult> | string;
}

type Verify = (original: ModelProto, patched: ModelProto, options: VerifyOptions) => Promise<VerifyReport>;

const controlFlow = (s: Scope): boolean => ['If', 'Loop', 'Scan'].includes(s.owner!.node.opType) && isDefaultDomain(s.owner!.node.domain);

/** The outermost graph attribute of a non-control-flow operator the scope is in, if any. */
function rootOf(scope: Scope | undefined): Scope | null {
  let root: Scope | null = null;
  for (let s = scope; s?.owner; s = s.owner.scope) if (!controlFlow(s)) root = s;
  return root;
}

/** A record site in a lifted graph: its index in the outer record, its scope there and in the lifted model. */
interface KeptSite { index: number; layer: number; outer: string | undefined; inner: string }

/** A graph the sites of some record entries are in, lifted out of both models into a pair of its own. */
export interface LiftedPair {
  /** How messages name it: `the decoder graph of BeamSearch 'X'`. */
  where: string;
  /** The indices of the record's sites in it. */
  sites: number[];
  /** The two models, or why the graph cannot be lifted. */
  pair: { original: ModelProto; patched: ModelProto; kept: KeptSite[] } | string;
}

/**
 * Every graph of an operator other than If, Loop and Scan that holds patched sites, lifted out of both models (the
 * patched one with its record's sites and journal entries for that graph): the subjects verified besides the main pair.
 */
export function liftedPairs(original: ModelProto, patched: ModelProto): LiftedPair[] {
  const record = readRecord(patched);
  if (!record) return [];
  const scopes = new Map(modelScopes(patched).map((s) => [s.path, s]));
  const groups = new Map<Scope, number[]>();
  record.sites.forEach((site, i) => {
    const root = rootOf(scopes.get(site.scope ?? 'main'));
    if (root) groups.set(root, [...(groups.get(root) ?? []), i]);
  });
  return [...groups].map(([root, sites]) => {
    const where = `the ${root.path.split('.').pop()} graph of ${root.owner!.node.opType} '${nodeLabel(root.owner!.node)}'`;
    return { where, sites, pair: liftPair(original, patched, record, root, where) };
  });
}

/** `labels`: how the outer verification names each site (its results keep those names). */
export async function liftedChecks(original: ModelProto, patched: ModelProto, options: VerifyOptions, verify: Verify, labels: string[],
  selected: ReadonlySet<CheckId>): Promise<Lifted> {
  const out: Lifted = { probes: new Map(), graphs: new Map() };
  const record = readRecord(patched);
  const checks = LIFTED_CHECKS.filter((c) => selected.has(c));
  if (!record || !checks.length) return out;
  for (const { where, sites, pair } of liftedPairs(original, patched)) {
    const results = typeof pair === 'string' ? pair : await verifyLifted(pair, { where, checks }, options, verify, labels);
    const missing = (i: number): string => (record.sites[i].expanded
      ? 'expanded into its definition; the probe does not read the expanded nodes (wiring parity covers it)'
      : 'the lifted graph\'s probe did not reach it');
    const graph: LiftedGraph = { where, sites, checks: typeof results === 'string' ? results : results.checks };
    for (const i of sites) {
      out.probes.set(i, typeof results === 'string' ? results : results.probes.get(i) ?? missing(i));
      out.graphs.set(i, graph);
    }
  }
  return out;
}

interface LiftResult { probes: Map<number, ProbeSiteResult>; checks: Map<CheckId, CheckResult> }

function liftPair(original: ModelProto, patched: ModelProto, record: PatchRecord, root: Scope, where: string): Exclude<LiftedPair['pair'], string> | string {
  // Weights the graph shares with the one around it (initializers there) come along; activations cannot.
  const captured = capturedNames(root.graph.proto).filter((name) => !root.graph.initializers.has(name));
  if (captured.length) return `${where} reads '${captured[0]}' from the graph around it: it cannot run on its own`;
  const liftedOriginal = lifted(original, root.path);
  const liftedPatched = lifted(patched, root.path);
  if (!liftedOriginal || !liftedPatched) return `${where} is not in both models`;
  const inner = (path: string | undefined): string | null => {
    const p = path ?? 'main';
    return p === root.path ? 'main' : p.startsWith(`${root.path}/`) ? `main${p.slice(root.path.length)}` : null;
  };
  const kept = record.sites.map((s, i) => ({ s, i })).filter(({ s }) => inner(s.scope) !== null);
  writeRecord(liftedPatched, {
    ...record, sites: kept.map(({ s }) => ({ ...s, scope: inner(s.scope)! })),
    journal: record.journal.flatMap((e) => (e.scope.startsWith('function ') ? [e] : inner(e.scope) !== null ? [{ ...e, scope: inner(e.scope)! }] : [])),
  });
  const sites = kept.map(({ s, i }) => ({ index: i, layer: s.layer, outer: s.scope, inner: inner(s.scope)! }));
  return { original: liftedOriginal, patched: liftedPatched, kept: sites };
}

async function verifyLifted(pair: Exclude<LiftedPair['pair'], string>, target: { where: string; checks: CheckId[] }, options: VerifyOptions,
  verify: Verify, labels: string[]): Promise<LiftResult | string> {
  const { where } = target;
  let report: VerifyReport;
  try {
    // L and the lengths are the outer verification's; dims and inputs name the outer model's inputs.
    const progress = options.progress && ((line: string): void => options.progress!(`${line} (${where}, run on its own)`));
    const own = { checks: target.checks, strict: false, progress, dims: undefined, inputFiles: undefined, inputs: undefined };
    report = await verify(pair.original, pair.patched, { ...options, ...own });
  } catch (e) {
    if (e instanceof InputError) return `${where}, lifted into a model of its own, cannot run on synthesised inputs: ${e.message}`;
    throw e;
  }
  const probe = report.checks.find((c) => c.id === 'probe');
  const results = new Map<number, ProbeSiteResult>();
  for (const r of probe?.sites ?? []) {
    const k = pair.kept.find((s) => s.layer === r.layer && s.inner === (r.scope ?? 'main'));
    if (!k) continue;
    const label = labels[k.index];
    results.set(k.index, { ...r, scope: k.outer, site: label, ...(r.message ? { message: `${label}${r.message.slice(r.site.length)} (lifted out of ${where} into a model of its own)` } : {}) });
  }
  return { probes: results, checks: new Map(report.checks.filter((c) => c.id !== 'probe' && target.checks.includes(c.id)).map((c) => [c.id, c])) };
}

/**
 * A model holding only the graph at `path` (its opsets and functions kept, and the initializers of the graphs
 * around it that it reads), or null when it has no such graph.
 */
function lifted(model: ModelProto, path: string): ModelProto | null {
  const copy = cloneModel(model);
  const scope = modelScopes(copy).find((s) => s.path === path);
  if (!scope) return null;
  const g = scope.graph.proto;
  for (const name of capturedNames(g)) {
    const t = scope.graph.initializers.get(name);
    if (t) scope.graph.addInitializer(t);
  }
  copy.graph = g;
  removeRecord(copy);
  return copy;
}

/** Names the graph's nodes read (at any depth) that it does not define: what it takes from around it. */
function capturedNames(g: GraphProto): string[] {
  const defined = new Set<string>([...g.input.map((v) => v.name), ...g.initializer.map((t) => t.name), ...g.node.flatMap((n) => n.output)]);
  return [...new Set(g.node.flatMap((n) => readsOf(n)))].filter((name) => !defined.has(name));
}
