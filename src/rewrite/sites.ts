/**
 * Patching one site, through the journal: a Softmax (the factor on the query or the logits, n from shapes or
 * masks), a fused operator (the factor on its query input), or a call of a model-local function whose body
 * holds attention (the body patched once, with s coming in through a new function input).
 */
import { siteNodeLabel } from '../detect/site';
import { AttentionSite, CallSite, Detection, SkippedSoftmax } from '../detect/find-attention';
import { FusedSite } from '../detect/fused';
import { inputOf, MS_ATTENTION, opSpec, queryInput } from '../graph/attention-ops';
import { HIDDEN_GAP, maskUses } from '../detect/mask-uses';
import { InputError, opt, prefixed } from '../errors';
import { Graph, nodeLabel } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { DataType, ModelProto, NodeProto, OperatorSetId } from '../io/onnx';
import { Preset, presetNeedsPositions } from '../policy/factor';
import { chooseN, countsMasks, NChoice, NOption, positionN } from '../policy/n-mode';
import { LayerTheta, PriorSpec, THETAS, thetasForLayers } from '../policy/prior';
import { LayerScale, ScaleSpec, scalesForLayers } from '../policy/scale';
import type { WindowSpec } from '../policy/window';
import { Builder } from './builder';
import { addFusedPrior, describePlan, insertFused, InsertedFused, modeOf, planFor } from './fused';
import { insertGroupScale, insertScale, ScaleContext, Target } from './insert-scale';
import { CacheSplit, EXPANSION_COST, ExpansionParams, ExpansionShared, expandMsAttention, SPLIT_COST, unsplittable } from './ms-attention';
import { expandOnnxAttention, ONNX_EXPANSION_COST } from './onnx-attention';
import { FUSED_DOMAIN_OWNER, FUSED_NOTE, fuseBlock, fusableBlock, FusableBlock, fusedOwner, layoutOwner, onlyInside } from './fuse-attention';
import { callInputName, namePrefix, PART } from '../identity';
import { Journal, ScopeEdits } from './journal';
import { memo } from '../memo';
import { NSources } from './n-source';
import { OpsetGuard } from './opset';
import { insertPrior, thetaConstants, ThetaTensors } from './prior';
import { insertWindow } from './window';
import { insertRope, recomputeTables, RopeSiteRecord, tableRows } from './rope';
import { findRope } from '../detect/rope';
import type { RopeSpec } from '../policy/rope';
import { callSiteLabel, SiteRecord } from './record';
import { PatchedSite } from './report';

/** Whether plain-op attention that onnxruntime fuses is written as a fused operator (auto) or kept in plain ops (off). */
export type FusedAttention = 'auto' | 'off';
/** A stacked KV cache kept as it is (default), or split into key and value halves (an interface change, asked for). */
export type CacheLayout = 'stacked' | 'split';

export type AnySite = { kind: 'softmax'; site: AttentionSite } | { kind: 'fused'; site: FusedSite } | { kind: 'call'; site: CallSite };

interface SiteResult { site: PatchedSite; record: SiteRecord }
interface PatchedBody extends SiteResult { inputs: BodyInputs }

/** What a site gets: s for its factor (absent for the none preset) and θ for its prior (if any). */
export interface SiteParams { s?: LayerScale; theta?: LayerTheta }
/** Inside a function body s and θ come in through function inputs, one set of constants per call. */
interface BodyInputs { s?: string; theta?: ThetaTensors }

/** What patching a fused site did: n, where the factor went, and what replaced the node when it was replaced. */
interface FusedOutcome { n: string; nReason: string; logits: string; target: Target; inserted?: InsertedFused; expanded?: string }

/** Per graph: the shared builder for n and the context every Softmax site of the graph shares. */
interface PatchContext { ctx: ScaleContext; expansion: ExpansionShared }

/** Patches sites one by one into the scopes of one model, and keeps the journal of every edit. */
export class SitePatcher {
  private readonly journal = new Journal();
  private readonly contexts = new Map<string, PatchContext>();
  /** Patched function bodies by scope and node: every call of one function shares its body (site objects differ per call). */
  private readonly bodies = new Map<string, PatchedBody>();
  private readonly byPath: Map<string, Scope>;
  private readonly originals: Map<Scope, NodeProto[]>;
  private readonly opset: OpsetGuard;
  /** Caches split (`--cache-layout split`), and the sites whose cache stays stacked, with the reason. */
  readonly splits: CacheSplit[] = [];
  readonly unsplit: string[] = [];

  constructor(private readonly model: ModelProto, private readonly scopes: Scope[], private readonly preset: Preset, private readonly option: NOption,
    private readonly irVersion: number, private readonly fusion: FusedAttention = 'auto', private readonly window?: WindowSpec,
    private readonly layout: CacheLayout = 'stacked') {
    this.opset = new OpsetGuard(model, scopes, this.journal);
    this.byPath = new Map(scopes.map((s) => [s.path, s]));
    this.originals = new Map(scopes.map((s) => [s, [...s.graph.nodes]]));
  }

  patch(a: AnySite, params: SiteParams): SiteResult {
    const scope = this.byPath.get(a.site.scope)!;
    const b = this.builder(scope, a.site.layer);
    if (a.kind === 'softmax') return this.softmax(scope, b, a.site, params, this.constants(b, params));
    if (a.kind === 'fused') return this.fused(scope, b, a.site, params, this.constants(b, params));
    return this.call(b, a.site, params);
  }

  /**
   * RoPE rescaled in the main graph (rewrite/rope.ts), journalled under its own owner `rope`. Detection's
   * reason is the refusal where the graph holds no RoPE this reads.
   */
  rope(spec: RopeSpec): RopeSiteRecord[] {
    const scope = this.scopes[0];
    const found = findRope(scope);
    if (typeof found === 'string') throw new InputError(`${opt('rope', spec.method)}: ${found}`, 'cannot-patch');
    const b = new Builder(this.journal.editor(scope.path, scope.graph, 'rope'), namePrefix('rope'), this.irVersion, () => scope.opset);
    const tables = found.tables.map((t) => {
      const newRows = tableRows(t, spec);
      const table = { cos: t.cos, sin: t.sin, rows: t.rows, newRows, theta: t.theta };
      return { ...insertRope(b, recomputeTables(b, t, newRows), spec), table };
    });
    return [...found.frequencies.map((f) => insertRope(b, f, spec)), ...tables];
  }

  /** Sorts every scope and returns the journal; the original order is noted where the sort had to move a node. */
  finish(): { journal: ScopeEdits[]; nSources: number; notes: string[] } {
    for (const scope of this.scopes) {
      const before = this.originals.get(scope)!;
      scope.commit();
      this.journal.keepOrder(scope.path, scope.graph, before);
    }
    const nSources = [...this.contexts.values()].reduce((acc, c) => acc + c.ctx.sources.size + c.expansion.cache.size, 0);
    return { journal: this.journal.record(), nSources, notes: this.opset.notes };
  }

  private builder(scope: Scope, layer: number | 'shared', owner = layer === 'shared' ? layer : `L${layer}`): Builder {
    // Function bodies have no initializers; an IR < 4 subgraph would need each initializer declared as an input.
    const constantNodes = scope.kind === 'function' || (scope.kind === 'subgraph' && this.irVersion < 4);
    const prefix = namePrefix(layer);
    const editor = this.journal.editor(scope.path, scope.graph, owner);
    return new Builder(editor, prefix, scope.kind === 'main' ? this.irVersion : Math.max(this.irVersion, 4), () => scope.opset, constantNodes);
  }

  /** s and θ as constants of the site's own graph (the initializers a user fine-tunes). */
  private constants(b: Builder, p: SiteParams): BodyInputs {
    const s = p.s;
    return {
      s: s === undefined ? undefined : b.constant(PART.scale, DataType.FLOAT, Array.isArray(s) ? [s.length, 1, 1] : [], Array.isArray(s) ? s : [s]),
      theta: p.theta ? thetaConstants(b, p.theta) : undefined,
    };
  }

  private context(scope: Scope): PatchContext {
    const pc = memo(this.contexts, scope.path, () => {
      const shared = this.builder(scope, 'shared');
      const sources = new NSources(shared, scope.shapes, scope.opset, this.window);
      return { ctx: { graph: scope.graph, sources, preset: this.preset, opset: scope.opset, shapes: scope.shapes },
        expansion: { builder: shared, shapes: scope.shapes, opset: scope.opset, cache: new Map() } };
    });
    // The opset may have been raised since (opset.ts).
    pc.ctx.opset = pc.expansion.opset = scope.opset;
    return pc;
  }

  private softmax(scope: Scope, b: Builder, site: AttentionSite, p: SiteParams, inputs: BodyInputs): SiteResult {
    const uses = maskUses(scope.graph, { steps: site.afterLogits, qk: site.qkMatMul.output[0] }, scope.shapes);
    const n = this.preset.kind === 'none' ? { mode: 'none', reason: 'no factor (preset none)' }
      : site.groupAxis !== undefined ? groupN(site.groupAxis)
        : presetNeedsPositions(this.preset) ? positionN(this.option)
          : chooseN(this.option, uses, site.mask.reason, `layer ${site.layer}${site.scope === 'main' ? '' : ` of ${site.scope}`}`);
    if (n.mode === 'causal' || n.mode === 'causal-padding') this.opset.ensure(scope, `layer ${site.layer}: per-row n (Range, CumSum)`);
    if (this.window) this.windowFits(scope, site, n.mode === 'none' ? chooseN(this.option, uses, site.mask.reason).mode : n.mode);
    const ctx = this.context(scope).ctx;
    const block = this.fusion === 'auto' && !inputs.theta && !this.window && n.mode !== 'none' && site.groupAxis === undefined ? fusableBlock(scope, site) : undefined;
    const inserted = n.mode === 'none' ? undefined : site.groupAxis !== undefined ? insertGroupScale(ctx, b, site, p.s!, inputs.s!)
      : insertScale(ctx, b, site, p.s!, n as NChoice, uses, inputs.s!);
    const window = this.window ? ctx.sources.windowTensors() : undefined;
    if (window) insertWindow(ctx, b, site);
    if (inputs.theta) insertPrior(ctx, b, site, inputs.theta, inserted && { tensor: inserted.factor, perHead: inserted.perHead });
    const target = inserted?.target ?? 'logits';
    const fused = target === 'query' && block && typeof block !== 'string' ? this.fuse(scope, site, block) : undefined;
    const biases = uses.filter((u) => u.rule === 'additive' && (u.role === 'other' || gathersTable(scope.graph, u.tensor))).map((u) => `'${u.tensor}'`);
    const notes = inputs.theta && biases.length
      ? [`the model adds its own position bias (${biases.join(', ')}) after the content logits: the prior adds to it, and the factor scales content and prior only`] : [];
    return {
      site: {
        node: nodeLabel(site.softmax), layer: site.layer, scope: site.scope, kind: 'Softmax', n: n.mode, nReason: n.reason,
        heads: site.heads.heads ?? null, headAxis: site.heads.axis ?? null, headsReason: site.heads.reason, logitsRank: site.logitsRank ?? null,
        logits: site.logits, s: p.s ?? null, sInitializer: inputs.s ?? '', ...(site.forced ? { deviation: site.forced } : {}), rule: site.rule,
        ...(inputs.theta ? { prior: inputs.theta } : {}), ...(this.window ? { window: this.window } : {}), target, nShared: inserted?.nKey ?? 'none', ...(notes.length ? { notes } : {}),
        ...(fused ? { fused } : {}),
      },
      record: {
        layer: site.layer, scope: site.scope, softmax: nodeLabel(site.softmax), n: n.mode, s: p.s, sInitializer: inputs.s,
        apply: inserted?.apply, factor: inserted?.factor, factorType: inserted?.factorType, target, logits: site.qkMatMul.output[0],
        ...(inputs.theta ? { prior: inputs.theta } : {}), ...(window ? { window } : {}),
      },
    };
  }

  /**
   * A window is a causal one, on logits whose positions are known: a site that attends to every key, or whose
   * grouped Softmax has no rows and keys, cannot take it.
   */
  private windowFits(scope: Scope, site: AttentionSite, mode: string): void {
    const where = `layer ${site.layer}${site.scope === 'main' ? '' : ` of ${site.scope}`}`;
    if (site.groupAxis !== undefined) throw new InputError(`${where}: ${opt('window')} needs logits of known rank (rows and keys); this Softmax normalises a group of axes`, 'cannot-patch');
    if (mode === 'keys' || mode === 'padding') {
      const every = mode === 'keys' ? 'every key' : 'every key its padding leaves';
      throw new InputError(`${where}: ${opt('window')} is a causal sliding window, and this site attends to ${every} (no causal mask found): give ${opt('n', 'causal')} if the model is causal, or ${opt('layers')} without this layer`, 'cannot-patch');
    }
    this.opset.ensure(scope, `${where}: the sliding window (Range, Where)`);
  }

  /**
   * The site's block as MultiHeadAttention (fuse-attention.ts), when nothing the factor added reads inside it; the
   * model imports the com.microsoft domain for it (journalled, so revert removes an import it added).
   */
  private fuse(scope: Scope, site: AttentionSite, block: FusableBlock): string | undefined {
    if (!onlyInside(scope.graph, block)) return undefined;
    this.importFused(this.model.opsetImport, 'model');
    if (scope.fn) this.importFused(scope.fn.opsetImport, scope.path);
    fuseBlock(this.builder(scope, site.layer, fusedOwner(site.layer)), site, block);
    return FUSED_NOTE;
  }

  private importFused(imports: OperatorSetId[], scope: string): void {
    if (imports.some((o) => o.domain === 'com.microsoft')) return;
    imports.push({ domain: 'com.microsoft', version: 1 });
    this.journal.importDomain('com.microsoft', 1, FUSED_DOMAIN_OWNER, scope);
  }

  private fused(scope: Scope, b: Builder, site: FusedSite, p: SiteParams, inputs: BodyInputs): SiteResult {
    if (this.window) {
      throw new InputError(`${nodeLabel(site.node)} (${site.op}): ${opt('window')} is written on plain-op attention only; a fused operator's masking is its own (GroupQueryAttention has local_window_size)`, 'cannot-patch');
    }
    // Presets defined on positions take the causal n, as at Softmax sites.
    const option = presetNeedsPositions(this.preset) ? positionN(this.option).mode as NOption : this.option;
    const params: ExpansionParams = { preset: this.preset, s: p.s, sName: inputs.s, theta: inputs.theta };
    const done = site.expand ? this.expandedOnnx(scope, b, site, params) : this.onOperator(scope, b, site, params, option);
    const n = this.preset.kind === 'none' ? 'none' : done.n;
    return {
      site: {
        node: nodeLabel(site.node), layer: site.layer, scope: site.scope, kind: site.op, n,
        nReason: this.preset.kind === 'none' ? 'no factor (preset none)' : done.nReason,
        heads: site.heads.heads ?? null, headAxis: site.heads.axis ?? null, headsReason: site.heads.reason,
        logitsRank: 4, logits: done.logits, s: p.s ?? null, sInitializer: inputs.s ?? '', ...(site.forced ? { deviation: site.deviation } : {}),
        target: done.target, nShared: `site:${nodeLabel(site.node)}`, rule: site.rule, ...(done.expanded ? { expanded: done.expanded } : {}),
        ...(inputs.theta ? { prior: inputs.theta } : {}),
      },
      record: { layer: site.layer, scope: site.scope, softmax: nodeLabel(site.node), kind: site.op, n, ...factorRecord(p, inputs, done.inserted),
        ...(done.expanded ? { expanded: { heads: site.heads.heads } } : {}), ...(inputs.theta ? { prior: inputs.theta } : {}) },
    };
  }

  /** The factor on the operator's query (or weights); com.microsoft Attention expanded when n is counted from mask_index. */
  private onOperator(scope: Scope, b: Builder, site: FusedSite, params: ExpansionParams, option: NOption): FusedOutcome {
    const where = `${nodeLabel(site.node)} (${site.op})`;
    const plan = planFor(site, option === 'auto' ? modeOf(site.n) : option);
    if (countsMasks(option) && plan.kind !== 'mask-index') {
      throw new InputError(`${where}: ${opt('n', option)} needs the mask outside the kernel; use ${opt('n', 'auto')}, keys or causal`, 'usage');
    }
    const mode = modeOf(plan);
    this.opset.ensure(scope, `${where}: the factor on a fused operator's query`);
    const logits = inputOf(opSpec(site.op), site.node, queryInput(site.query));
    let inserted: InsertedFused | undefined;
    let split: CacheSplit | undefined;
    if (plan.kind === 'mask-index') {
      const done = expandMsAttention(b, this.context(scope).expansion, site, { ...params, split: this.splitter(scope, site) }, plan);
      ({ split, ...inserted } = done);
      if (split) this.splits.push(split);
    } else {
      // Only the expansion can split a cache: an Attention kept whole (its n from shapes) keeps its stacked one, and says so.
      if (this.layout === 'split' && site.op === MS_ATTENTION.id && inputOf(MS_ATTENTION, site.node, 'past')) {
        this.unsplit.push(`${nodeLabel(site.node)} keeps its stacked cache: the operator is kept whole (${describePlan(plan, MS_ATTENTION)}), not expanded`);
      }
      if (this.preset.kind !== 'none') inserted = insertFused(b, site, this.preset, params.s!, plan, scope.opset, params.sName!);
      const factor = { preset: this.preset, s: params.sName, perHead: Array.isArray(params.s), rows: inserted?.rows };
      if (params.theta) addFusedPrior(b, site, plan, factor, params.theta, scope.shapes);
    }
    const why = option === 'auto' ? `auto: ${site.mask.reason}` : `n mode ${option} as asked`;
    const nReason = `${why}; ${describePlan(plan, opSpec(site.op))}${option === 'causal' && mode === 'keys' ? ' (this operator cannot take a per-row n)' : ''}`;
    return { n: mode, nReason, logits, target: 'query', inserted, expanded: plan.kind === 'mask-index' ? (split ? SPLIT_COST : EXPANSION_COST) : undefined };
  }

  /** The builder that splits this site's stacked cache (journalled as its layout), where that was asked and can be done. */
  private splitter(scope: Scope, site: FusedSite): Builder | undefined {
    if (this.layout !== 'split') return undefined;
    const why = unsplittable(scope.graph, site.node, scope.kind === 'main');
    if (why) {
      this.unsplit.push(`${nodeLabel(site.node)} keeps its stacked cache: ${why}`);
      return undefined;
    }
    return this.builder(scope, site.layer, layoutOwner(site.layer));
  }

  /** ONNX Attention whose factor cannot go on Q: expanded, the factor on the logits after the cap. */
  private expandedOnnx(scope: Scope, b: Builder, site: FusedSite, params: ExpansionParams): FusedOutcome {
    this.opset.ensure(scope, `${nodeLabel(site.node)} (${site.op})`);
    const keys = this.option === 'keys' && !presetNeedsPositions(this.preset);
    const inserted = expandOnnxAttention(b, scope.shapes, site, params, scope.opset, keys);
    const nReason = keys ? 'n mode keys as asked; n = Tk'
      : `${this.option === 'auto' ? 'auto' : `n mode ${this.option}`}: n = keys each row may see under the attention's mask, causal mask and nonpad lengths (bias entries less than ${HIDDEN_GAP} below the row's largest)`;
    const expanded = `${ONNX_EXPANSION_COST} (${site.expand})`;
    return { n: inserted.mode, nReason, logits: inserted.factor, target: 'logits', inserted, expanded };
  }

  /** One function used by N layers gets N independent s (and θ) values: each call passes its own. */
  private call(b: Builder, call: CallSite, p: SiteParams): SiteResult {
    const fnScope = this.byPath.get(call.inner.scope)!;
    const body = memo(this.bodies, `${call.inner.scope}\n${siteNodeLabel(call.inner)}`, () => this.patchBody(fnScope, call, p));
    const given = this.constants(b, p);
    const pass = (input: string | undefined, value: string | undefined): void => {
      if (input === undefined || value === undefined) return;
      b.editor.setInput(call.call, fnScope.graph.proto.input.findIndex((v) => v.name === input), value);
    };
    pass(body.inputs.s, given.s);
    for (const t of THETAS) pass(body.inputs.theta?.[t], given.theta?.[t]);
    const node = callSiteLabel(nodeLabel(call.call), body.site.node);
    const site = { ...body.site, layer: call.layer, scope: call.scope, kind: `call ${call.fn.domain}:${call.fn.name}`, node, s: p.s ?? null,
      sInitializer: given.s ?? '', rule: `call/function → ${body.site.rule}`, ...(given.theta ? { prior: given.theta } : {}) };
    const record = { ...body.record, layer: call.layer, scope: call.scope, softmax: body.site.node, call: nodeLabel(call.call), s: p.s, sInitializer: given.s };
    return { site, record: { ...record, ...(given.theta ? { prior: given.theta } : {}) } };
  }

  private patchBody(fnScope: Scope, call: CallSite, p: SiteParams): PatchedBody {
    const bb = this.builder(fnScope, call.inner.layer);
    const input = (name: string): string => {
      const v = fnScope.graph.uniqueName(callInputName(name, call.inner.layer));
      bb.editor.addInput({ name: v });
      return v;
    };
    const inputs: BodyInputs = {};
    if (p.s !== undefined) inputs.s = input(PART.scale);
    if (p.theta) inputs.theta = Object.fromEntries(THETAS.map((t) => [t, input(`theta_${t}`)])) as ThetaTensors;
    // Function inputs are untyped: a Reshape gives s its rank, so shapes downstream of the factor stay known.
    const ranked: BodyInputs = {
      ...inputs, s: inputs.s && bb.op('Reshape', [inputs.s, bb.int64('s_shape', Array.isArray(p.s) ? [-1, 1, 1] : [])], {}, 's_ranked'),
    };
    const inner = 'softmax' in call.inner
      ? this.softmax(fnScope, bb, call.inner, p, ranked)
      : this.fused(fnScope, bb, call.inner, p, ranked);
    return { inputs, ...inner };
  }
}

/** n of an opset < 13 Softmax over logits of unknown rank: the size of the group it normalises. */
function groupN(axis: number): NChoice {
  return { mode: 'keys', reason: `the Softmax (opset < 13, axis ${axis}, logits of unknown rank) normalises the axes from ${axis} on as one `
    + 'group: n = its size, read at run time (Tk for [Tq, Tk] logits)' };
}

/** T5-style position biases gather a learned [buckets, heads] table (ALiBi-style ones come from constants alone). */
function gathersTable(graph: Graph, tensor: string): boolean {
  return graph.query.first('bias-table', tensor, (_t, p) => {
    const table = p?.opType === 'Gather' ? graph.initializers.get(p.input[0]) : undefined;
    return table && table.dims.length === 2 && table.dataType !== DataType.INT64 ? true : undefined;
  }) ?? false;
}

/** The record's factor fields: absent for the none preset (no factor was inserted). */
function factorRecord(p: SiteParams, inputs: BodyInputs, inserted: InsertedFused | undefined): Partial<SiteRecord> {
  if (p.s === undefined || !inserted?.apply) return {};
  return { s: p.s, sInitializer: inputs.s, apply: inserted.apply, factor: inserted.factor, factorType: inserted.factorType };
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
 * One row per site from per-layer rows of each graph. Layers are numbered per graph, so a per-layer file gives row
 * k to layer k of every graph that holds attention (e.g. both branches of an If, or the init and step decoders of a
 * GreedySearch). Refused attention keeps its layer number: its row is read and not used.
 */
function rowsForSites<T>(sites: AnySite[], skipped: SkippedSoftmax[], rowsOf: (heads: (number | undefined)[]) => T[]): T[] {
  const heads = headsByScope(sites, skipped);
  const rows = new Map<string, T[]>();
  for (const [scope, list] of heads) {
    try {
      rows.set(scope, rowsOf(list));
    } catch (e) {
      if (e instanceof InputError && scope !== 'main') throw prefixed(`${scope}: `, e);
      throw e;
    }
  }
  return sites.map((a) => rows.get(a.site.scope)![a.site.layer]);
}

/**
 * Head counts per graph, indexed by layer: refused attention holds its layer's slot (undefined), and `more` adds
 * sites known otherwise (an expanded operator's, from its record).
 */
export function headsByScope(
  sites: AnySite[], skipped: SkippedSoftmax[], more: { scope: string; layer: number; heads?: number }[] = [],
): Map<string, (number | undefined)[]> {
  const heads = new Map<string, (number | undefined)[]>();
  const slot = (scope: string, layer: number, h: number | undefined): void => {
    const list = heads.get(scope) ?? [];
    while (list.length <= layer) list.push(undefined);
    list[layer] = h;
    heads.set(scope, list);
  };
  for (const k of skipped) if (k.layer !== undefined) slot(k.scope ?? 'main', k.layer, undefined);
  for (const a of sites) slot(a.site.scope, a.site.layer, headsOf(a));
  for (const m of more) slot(m.scope, m.layer, m.heads);
  return heads;
}

const headsReason = (a: AnySite): string => (a.kind === 'call' ? a.site.inner.heads.reason : a.site.heads.reason);
const where = (a: AnySite): string => `layer ${a.site.layer}${a.site.scope === 'main' ? '' : ` of ${a.site.scope}`}`;

/** s for every site, checked against each layer's head count where per-head s is given. */
export function scalesForSites(spec: ScaleSpec, sites: AnySite[], skipped: SkippedSoftmax[]): LayerScale[] {
  const rows = rowsForSites(sites, skipped, (heads) => scalesForLayers(spec, heads));
  return sites.map((a, i) => {
    const row = rows[i];
    if (Array.isArray(row) && row.length > 1 && headsOf(a) === undefined) {
      throw new InputError(`${where(a)}: per-head s given, but the head count is unknown (${headsReason(a)}); give one s for the layer`, 'cannot-patch');
    }
    return row;
  });
}

/** θ of a positional prior for every site: one value per head, so the head count must be known. */
export function thetasForSites(prior: PriorSpec, sites: AnySite[], skipped: SkippedSoftmax[]): LayerTheta[] {
  const rows = rowsForSites(sites, skipped, (heads) => thetasForLayers(prior, heads));
  return sites.map((a, i) => {
    if (!rows[i]) throw new InputError(`${where(a)}: a positional prior needs the head count (${headsReason(a)})`, 'cannot-patch');
    return rows[i]!;
  });
}
