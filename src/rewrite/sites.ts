/**
 * Patching one site, through the journal: a Softmax (the factor on the query or the logits, n from shapes or
 * masks), a fused operator (the factor on its query input), or a call of a model-local function whose body
 * holds attention (the body patched once, with s coming in through a new function input).
 */
import { AttentionSite, CallSite, Detection, PATCH_PREFIX, SkippedSoftmax } from '../detect/find-attention';
import { FusedSite } from '../detect/fused';
import { maskUses } from '../detect/mask-uses';
import { InputError, opt } from '../errors';
import { nodeLabel } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { DataType, NodeProto } from '../io/onnx';
import { Preset, presetNeedsPositions } from '../policy/factor';
import { chooseN, countsMasks, NMode, NOption, positionN } from '../policy/n-mode';
import { LayerScale, ScaleSpec, scalesForLayers } from '../policy/scale';
import { Builder } from './builder';
import { describePlan, insertFused, modeOf, planFor } from './fused';
import { insertScale, ScaleContext } from './insert-scale';
import { Journal, ScopeEdits } from './journal';
import { NSources } from './n-source';
import { SiteRecord } from './record';
import { PatchedSite } from './report';

export type AnySite = { kind: 'softmax'; site: AttentionSite } | { kind: 'fused'; site: FusedSite } | { kind: 'call'; site: CallSite };

interface SiteResult { site: PatchedSite; record: SiteRecord }
interface PatchedBody extends SiteResult { input: string }

/** Per graph: the shared builder for n and the context every Softmax site of the graph shares. */
interface PatchContext { scope: Scope; ctx: ScaleContext }

/** Patches sites one by one into the scopes of one model, and keeps the journal of every edit. */
export class SitePatcher {
  private readonly journal = new Journal();
  private readonly contexts = new Map<string, PatchContext>();
  private readonly bodies = new Map<object, PatchedBody>();
  private readonly byPath: Map<string, Scope>;
  private readonly originals: Map<Scope, NodeProto[]>;

  constructor(private readonly scopes: Scope[], private readonly preset: Preset, private readonly option: NOption,
    private readonly irVersion: number) {
    this.byPath = new Map(scopes.map((s) => [s.path, s]));
    this.originals = new Map(scopes.map((s) => [s, [...s.graph.nodes]]));
  }

  patch(a: AnySite, s: LayerScale): SiteResult {
    const scope = this.byPath.get(a.site.scope)!;
    const b = this.builder(scope, a.site.layer);
    if (a.kind === 'softmax') return this.softmax(scope, b, a.site, s);
    if (a.kind === 'fused') return this.fused(scope, b, a.site, s);
    return this.call(b, a.site, s);
  }

  /** Sorts every scope and returns the journal; the original order is noted where the sort had to move a node. */
  finish(): { journal: ScopeEdits[]; nSources: number } {
    for (const scope of this.scopes) {
      const before = this.originals.get(scope)!;
      scope.commit();
      this.journal.keepOrder(scope.path, scope.graph, before);
    }
    const nSources = [...this.contexts.values()].reduce((acc, c) => acc + c.ctx.sources.size, 0);
    return { journal: this.journal.record(), nSources };
  }

  private builder(scope: Scope, layer: number | 'shared'): Builder {
    // Function bodies have no initializers; an IR < 4 subgraph would need each initializer declared as an input.
    const constantNodes = scope.kind === 'function' || (scope.kind === 'subgraph' && this.irVersion < 4);
    const prefix = layer === 'shared' ? `${PATCH_PREFIX}shared/` : `${PATCH_PREFIX}L${layer}/`;
    const editor = this.journal.editor(scope.path, scope.graph, layer === 'shared' ? layer : `L${layer}`);
    return new Builder(editor, prefix, scope.kind === 'main' ? this.irVersion : Math.max(this.irVersion, 4), { constantNodes });
  }

  private context(scope: Scope): PatchContext {
    let pc = this.contexts.get(scope.path);
    if (!pc) {
      const sources = new NSources(this.builder(scope, 'shared'), scope.shapes, scope.opset);
      pc = { scope, ctx: { graph: scope.graph, sources, preset: this.preset, opset: scope.opset, shapes: scope.shapes } };
      this.contexts.set(scope.path, pc);
    }
    return pc;
  }

  private softmax(scope: Scope, b: Builder, site: AttentionSite, s: LayerScale, sInput?: string): SiteResult {
    const uses = maskUses(scope.graph, site.afterLogits, scope.shapes);
    const n = presetNeedsPositions(this.preset) ? positionN(this.option) : chooseN(this.option, uses, site.mask.reason, `layer ${site.layer}${site.scope === 'main' ? '' : ` of ${site.scope}`}`);
    const inserted = insertScale(this.context(scope).ctx, b, site, s, n, uses, sInput);
    return {
      site: { ...describeSoftmax(site, n.mode, n.reason, s, inserted.sName), target: inserted.target, nShared: inserted.nKey },
      record: { layer: site.layer, scope: site.scope, softmax: nodeLabel(site.softmax), n: n.mode, s, sInitializer: inserted.sName,
        apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType, target: inserted.target,
        logits: site.qkMatMul.output[0] },
    };
  }

  private fused(scope: Scope, b: Builder, site: FusedSite, s: LayerScale, sInput?: string): SiteResult {
    const { preset, option } = this;
    const where = `${nodeLabel(site.node)} (${site.op})`;
    if (preset.kind !== 'ssmax' || preset.b !== undefined) {
      throw new InputError(`${where}: ${opt('preset', preset.kind)}${preset.kind === 'ssmax' ? ` with ${opt('b')}` : ''} is not supported on fused attention operators yet`);
    }
    if (countsMasks(option)) throw new InputError(`${where}: ${opt('n', option)} needs the mask outside the kernel; use ${opt('n', 'auto')}, keys or causal`);
    const plan = planFor(site, option === 'auto' ? modeOf(site.n) : option);
    const mode = modeOf(plan);
    const logits = site.node.input[site.query.layout === 'weights' ? site.query.weights : site.query.input];
    const inserted = insertFused(b, site, s, plan, scope.opset, sInput);
    const why = option === 'auto' ? `auto: ${site.mask.reason}` : `n mode ${option} as asked`;
    const nReason = `${why}; ${describePlan(plan)}${option === 'causal' && mode === 'keys' ? ' (this operator cannot take a per-row n)' : ''}`;
    return {
      site: {
        node: nodeLabel(site.node), layer: site.layer, scope: site.scope, kind: site.op, n: mode, nReason,
        heads: site.heads.heads ?? null, headAxis: site.heads.axis ?? null, headsReason: site.heads.reason,
        logitsRank: 4, logits, s, sInitializer: inserted.sName, ...(site.forced ? { deviation: site.deviation } : {}),
        target: 'query', nShared: `site:${nodeLabel(site.node)}`, rule: site.rule,
      },
      record: { layer: site.layer, scope: site.scope, softmax: nodeLabel(site.node), kind: site.op, n: mode, s, sInitializer: inserted.sName,
        apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType },
    };
  }

  /** One function used by N layers gets N independent s values: each call passes its own. */
  private call(b: Builder, call: CallSite, s: LayerScale): SiteResult {
    const fnScope = this.byPath.get(call.inner.scope)!;
    const body = this.bodies.get(call.inner) ?? this.patchBody(fnScope, call, s);
    const position = fnScope.graph.proto.input.findIndex((v) => v.name === body.input);
    const perHead = Array.isArray(s);
    const sName = b.constant('s', DataType.FLOAT, perHead ? [s.length, 1, 1] : [], perHead ? s : [s]);
    b.rewire(call.call, position, sName);
    const node = `${nodeLabel(call.call)} → ${body.site.node}`;
    const site = { ...body.site, layer: call.layer, scope: call.scope, kind: `call ${call.fn.domain}:${call.fn.name}`, node, s, sInitializer: sName,
      rule: `call/function → ${body.site.rule}` };
    return { site, record: { ...body.record, layer: call.layer, scope: call.scope, softmax: node, s, sInitializer: sName } };
  }

  private patchBody(fnScope: Scope, call: CallSite, s: LayerScale): PatchedBody {
    const input = fnScope.graph.uniqueName(`ssmax_s_${call.inner.layer}`);
    const bb = this.builder(fnScope, call.inner.layer);
    bb.editor.addInput({ name: input });
    // Function inputs are untyped: a Reshape gives s its rank, so shapes downstream of the factor stay known.
    const sRanked = bb.op('Reshape', [input, bb.int64('s_shape', Array.isArray(s) ? [-1, 1, 1] : [])], {}, 's_ranked');
    const inner = 'softmax' in call.inner
      ? this.softmax(fnScope, bb, call.inner, s, sRanked)
      : this.fused(fnScope, bb, call.inner, s, sRanked);
    const body = { input, ...inner };
    this.bodies.set(call.inner, body);
    return body;
  }
}

function describeSoftmax(site: AttentionSite, n: NMode, nReason: string, s: LayerScale, sInitializer: string): Omit<PatchedSite, 'target' | 'nShared'> {
  return {
    node: nodeLabel(site.softmax), layer: site.layer, scope: site.scope, kind: 'Softmax', n, nReason, heads: site.heads.heads ?? null,
    headAxis: site.heads.axis ?? null, headsReason: site.heads.reason, logitsRank: site.logitsRank ?? null,
    logits: site.logits, s, sInitializer, ...(site.forced ? { deviation: site.forced } : {}), rule: site.rule,
  };
}

export const siteNode = (a: AnySite): string => nodeLabel(a.kind === 'softmax' ? a.site.softmax : a.kind === 'fused' ? a.site.node : a.site.call);
export const headsOf = (a: AnySite): number | undefined => (a.kind === 'call' ? a.site.inner.heads.heads : a.site.heads.heads);

/** Every site in scope order, then layer order: the order of the report and of per-layer s rows. */
export function orderedSites(d: Detection, scopes: Scope[]): AnySite[] {
  const all: AnySite[] = [
    ...d.sites.map((site) => ({ kind: 'softmax' as const, site })),
    ...d.fused.map((site) => ({ kind: 'fused' as const, site })),
    ...d.calls.map((site) => ({ kind: 'call' as const, site })),
  ];
  const rank = new Map(scopes.map((s, i) => [s.path, i]));
  return all.sort((a, b) => (rank.get(a.site.scope)! - rank.get(b.site.scope)!) || a.site.layer - b.site.layer);
}

/**
 * s for every site. Layers are numbered per graph, so a per-layer s file gives row k to layer k of every graph
 * that holds attention (e.g. both branches of an If, or the init and step decoders of a GreedySearch).
 * Refused attention keeps its layer number: its row is read and not used.
 */
export function scalesForSites(spec: ScaleSpec, sites: AnySite[], skipped: SkippedSoftmax[]): LayerScale[] {
  const heads = new Map<string, (number | undefined)[]>();
  const slot = (scope: string, layer: number, h: number | undefined): void => {
    const list = heads.get(scope) ?? [];
    while (list.length <= layer) list.push(undefined);
    list[layer] = h;
    heads.set(scope, list);
  };
  for (const k of skipped) if (k.layer !== undefined) slot(k.scope ?? 'main', k.layer, undefined);
  for (const a of sites) slot(a.site.scope, a.site.layer, headsOf(a));
  const rows = new Map<string, LayerScale[]>();
  for (const [scope, list] of heads) {
    try {
      rows.set(scope, scalesForLayers(spec, list));
    } catch (e) {
      if (e instanceof InputError && scope !== 'main') throw new InputError(`${scope}: ${e.raw}`);
      throw e;
    }
  }
  return sites.map((a) => {
    const row = rows.get(a.site.scope)![a.site.layer];
    if (Array.isArray(row) && row.length > 1 && headsOf(a) === undefined) {
      const why = a.kind === 'call' ? a.site.inner.heads.reason : a.site.heads.reason;
      const where = a.site.scope === 'main' ? '' : ` of ${a.site.scope}`;
      throw new InputError(`layer ${a.site.layer}${where}: per-head s given, but the head count is unknown (${why}); give one s for the layer`);
    }
    return row;
  });
}
