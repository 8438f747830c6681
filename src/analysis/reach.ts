/**
 * What a model's attention lengths can be, read from the graph alone: each site's key count Tk and query count Tq
 * as polynomials over the inputs' dims (the shape pass), whether every length is fixed (the inputs have no dynamic
 * axis but the batch, or every site's counts are constants of the graph), and the cap a learned position table puts
 * on them. From these and the patch's factor: what the patch can change at the lengths the model can run. Patch
 * time reports it (a patch that changes nothing anywhere is refused), and verification plans its runs and says
 * which checks cannot apply to this model by construction.
 */
import type { Detection } from '../detect/find-attention';
import { inputOf, opSpec, Term } from '../graph/attention-ops';
import { constantOf, Poly, sym } from '../graph/poly';
import { Scope } from '../graph/scopes';
import { factorValue, Preset } from '../policy/factor';
import { countsMasks } from '../policy/n-mode';
import { LengthLimit, positionLimit } from './limits';
import { describeInputs, InputSpec, resolveDim, RunShape } from './signature';

/** One attention site's key and query counts, where the graph's shapes tell them. */
export interface SiteLengths {
  scope: string;
  layer: number;
  keys?: Poly;
  queries?: Poly;
}

export interface ModelLengths {
  /** Why no attention length of the model can change, or null when some can. */
  fixed: string | null;
  /** A learned position table: no length beyond its rows. */
  cap: LengthLimit | null;
  sites: SiteLengths[];
}

/** Value inputs of a fused operator (past_sequence_length, say) enter the polynomials as `value:<input>`. */
const VALUE = 'value:';

export function modelLengths(scopes: Scope[], detection: Detection, specs: readonly InputSpec[] = describeInputs(scopes[0].graph)): ModelLengths {
  const main = scopes[0];
  const sites = siteLengths(scopes, detection);
  const constant = sites.length > 0 && sites.every((s) => s.keys && constantOf(s.keys) !== undefined);
  const fixed = fixedInputs(specs) ? 'the model\'s inputs have no dynamic axis but the batch'
    : constant ? 'every attention site\'s key count is a constant of the graph' : null;
  return { fixed, cap: positionLimit(main.graph, specs), sites };
}

/** Every input dim is a number or the batch: nothing the runs could vary changes a length. */
function fixedInputs(specs: readonly InputSpec[]): boolean {
  const probe: RunShape = { batch: 2, seq: 5, past: 3 };
  return specs.every((s) => !s.unshaped && s.dims.every((d, axis) => 'value' in d || resolveDim(s, axis, probe, new Map()).source === 'batch'));
}

function siteLengths(scopes: Scope[], d: Detection): SiteLengths[] {
  const byPath = new Map(scopes.map((s) => [s.path, s]));
  const out: SiteLengths[] = [];
  for (const s of d.sites) {
    const shapes = byPath.get(s.scope)?.shapes;
    // The group of axes an opset < 13 Softmax normalises is read at run time: no length from the shapes.
    const logits = s.groupAxis === undefined ? s.softmax.input[0] : '';
    out.push({ scope: s.scope, layer: s.layer, keys: shapes?.dim(logits, -1), queries: shapes?.dim(logits, -2) });
  }
  for (const f of d.fused) {
    const scope = byPath.get(f.scope);
    if (!scope) continue;
    const spec = opSpec(f.op);
    const term = (t: Term): Poly | undefined => {
      const name = inputOf(spec, f.node, t.role);
      if (!('value' in t)) return scope.shapes.dim(name, t.axis);
      const c = scope.graph.constValue(name);
      return c?.values.length === 1 ? new Map([['', Number(c.values[0])]]) : scope.graph.inputs.has(name) ? sym(`${VALUE}${name}`) : undefined;
    };
    const n = f.n;
    const terms = n.kind === 'lengths' ? (n.promptTotal ? [{ role: n.promptTotal, value: true as const }] : n.keys ?? []) : n.tk;
    const parts = terms.map(term);
    const keys = parts.length && parts.every(Boolean) ? parts.reduce((a, b) => sum(a!, b!)) : undefined;
    out.push({ scope: f.scope, layer: f.layer, keys, queries: term(f.queryLength) });
  }
  for (const c of d.calls) out.push({ scope: c.scope, layer: c.layer });
  return out;
}

function sum(a: Poly, b: Poly): Poly {
  const out = new Map(a);
  for (const [k, v] of b) out.set(k, (out.get(k) ?? 0) + v);
  return out;
}

/** What synthesis feeds a value input (past_sequence_length, say), when it knows. */
type ValueOf = (input: string) => number | undefined;

/**
 * A polynomial's value for a run: each dim name by the input dim that carries it, each `input:axis` by that dim,
 * each value input by what synthesis feeds it. Undefined when a symbol is none of these.
 */
export function evaluate(p: Poly, specs: readonly InputSpec[], shape: RunShape, fixed: ReadonlyMap<string, number>, values: ValueOf): number | undefined {
  let total = 0;
  for (const [mono, coefficient] of p) {
    let term = coefficient;
    for (const symbol of mono ? mono.split('*') : []) {
      const v = symbolValue(symbol, specs, shape, fixed, values);
      if (v === undefined) return undefined;
      term *= v;
    }
    total += term;
  }
  return total;
}

function symbolValue(symbol: string, specs: readonly InputSpec[], shape: RunShape, fixed: ReadonlyMap<string, number>, values: ValueOf): number | undefined {
  if (symbol.startsWith(VALUE)) return values(symbol.slice(VALUE.length));
  for (const spec of specs) {
    const axis = spec.dims.findIndex((d) => 'param' in d && d.param === symbol);
    if (axis >= 0) return resolveDim(spec, axis, shape, fixed).size;
    const m = /^(.*):(\d+)$/.exec(symbol);
    if (m && m[1] === spec.name && Number(m[2]) < spec.dims.length) return resolveDim(spec, Number(m[2]), shape, fixed).size;
  }
  return undefined;
}

/** The n a site's rows can have when its counts are constants: [Tk, Tk] for keys, from Tk − Tq + 1 for causal, from 1 when counted from masks. */
export function fixedRange(site: SiteLengths, mode: string): [number, number] | null {
  const tk = site.keys && constantOf(site.keys);
  if (tk === undefined) return null;
  if (mode === 'causal' || mode === 'causal-padding') {
    const tq = site.queries && constantOf(site.queries);
    if (tq === undefined) return null;
    return [countsMasks(mode) ? 1 : Math.max(1, tk - tq + 1), tk];
  }
  return [countsMasks(mode) ? 1 : tk, tk];
}

/** The factor's smallest and largest value over n in [lo, hi] and every head's s (each preset's factor is monotone in n). */
export function factorRange(preset: Preset, s: number[], [lo, hi]: [number, number]): [number, number] {
  const values = s.flatMap((v) => [factorValue(preset, v, lo), factorValue(preset, v, hi)]);
  return [Math.min(...values), Math.max(...values)];
}

/** What the patch report says of a model whose attention lengths are fixed or capped. */
export interface LengthReport {
  /** fixed: no attention length can change; capped: none exceeds `cap` (a position table). */
  kind: 'fixed' | 'capped';
  why: string;
  cap?: number;
  /** What lifts the cap (LengthLimit.lift). */
  lift?: string;
  /** Per patched site: the n its rows can have (null: the graph does not tell) and the factor's range there. */
  sites: { node: string; layer: number; scope: string; n: [number, number] | null; factor: [number, number] | null }[];
  /** What the patch does at the lengths the model can run: nothing, something, or unknown (a length the graph does not tell). */
  effect: 'none' | 'changed' | 'unknown';
  /** One line for the warning or the refusal: the situation, its consequence for the factor, what to do. */
  message: string;
}

/** A patched site as the patch report gives it. */
export interface PatchedLengthSite { node: string; layer: number; scope: string; n: string; s: number | number[] | null }

/**
 * The report for a model whose lengths are fixed or capped (undefined otherwise, and for the none preset, whose
 * prior is no factor of n). A row that sees one key (n = 1) is not changed by any factor: n counts from 2.
 */
export function lengthReport(lengths: ModelLengths, patched: PatchedLengthSite[], preset: Preset, trainLen: number | undefined): LengthReport | undefined {
  if (preset.kind === 'none' || (!lengths.fixed && !lengths.cap)) return undefined;
  const kind = lengths.fixed ? 'fixed' : 'capped';
  const cap = lengths.cap?.length;
  // A capped model whose table reaches L runs where the factor is 1 and beyond: nothing to say.
  if (kind === 'capped' && trainLen !== undefined && cap! > trainLen) return undefined;
  const sites = patched.map((p) => {
    const at = lengths.sites.find((l) => l.scope === p.scope && l.layer === p.layer);
    const fixed = at ? fixedRange(at, p.n) : null;
    const range: [number, number] | null = fixed ?? (kind === 'capped' ? [1, cap!] : null);
    const s = p.s === null ? [] : Array.isArray(p.s) ? p.s : [p.s];
    const visible: [number, number] | null = range && range[1] >= 2 ? [Math.max(2, range[0]), range[1]] : null;
    const factor: [number, number] | null = !range || !s.length ? null : visible ? factorRange(preset, s, visible) : [1, 1];
    return { node: p.node, layer: p.layer, scope: p.scope, n: range, factor };
  });
  // With s given directly, a table that reaches past the factor's 1 runs on both sides of it: nothing to say either.
  if (kind === 'capped' && sites.every((x) => x.factor && x.factor[0] <= 1 && x.factor[1] > 1)) return undefined;
  const unchanged = sites.every((x) => x.factor && isOne(x.factor));
  const effect = unchanged ? 'none' : sites.some((x) => x.factor && !isOne(x.factor)) ? 'changed' : 'unknown';
  const why = lengths.fixed ?? lengths.cap!.reason;
  const lift = lengths.cap?.lift;
  const report: LengthReport = { kind, why, ...(cap !== undefined ? { cap } : {}), ...(lift ? { lift } : {}), sites, effect, message: '' };
  report.message = lengthMessage(report, preset, trainLen);
  return report;
}

/** A factor range that is 1 throughout (to float32 rounding): the patch changes nothing there. */
const isOne = ([lo, hi]: [number, number]): boolean => Math.abs(lo - 1) <= 1e-6 && Math.abs(hi - 1) <= 1e-6;

const span = ([a, b]: [number, number], digits = 0): string => {
  const f = (x: number): string => (digits ? x.toFixed(digits) : String(x));
  return a === b ? f(a) : `${f(a)} … ${f(b)}`;
};

/** `n = 7 at every site`, or per layer when they differ. */
function lengthsText(r: LengthReport): string {
  const texts = r.sites.map((x) => (x.n ? span(x.n) : '?'));
  if (new Set(texts).size === 1) return `n = ${texts[0]} at every site`;
  return `n = ${r.sites.slice(0, 3).map((x, i) => `${texts[i]} (layer ${x.layer})`).join(', ')}${r.sites.length > 3 ? ', …' : ''}`;
}

function factorText(r: LengthReport): string {
  const all = r.sites.flatMap((x) => x.factor ?? []);
  return all.length ? span([Math.min(...all), Math.max(...all)], 3) : '?';
}

function lengthMessage(r: LengthReport, preset: Preset, L: number | undefined): string {
  const formula = preset.kind === 'qwen-logn' ? 'max(1, ln n / ln L)' : preset.kind === 'llama4' ? 'ln(⌊n / floor_scale⌋ + 1)·attn_scale + 1' : 's·ln n';
  const where = r.kind === 'fixed' ? `every attention length of this model is fixed (${r.why}): ${lengthsText(r)}`
    : `no attention length of this model can exceed ${r.cap} (${r.why})${L !== undefined ? `, below L = ${L}` : ''}`;
  const longest = r.kind === 'fixed' ? Math.max(0, ...r.sites.map((x) => x.n?.[1] ?? 0)) : r.cap!;
  if (r.effect === 'none') {
    const oneKey = r.sites.every((x) => x.n && x.n[1] < 2);
    const unchanged = oneKey ? 'and a row that sees one key is the same whatever its factor' : `and the factor ${formula} is 1 at every n the model can run`;
    const other = preset.kind === 'qwen-logn' && longest > 2 ? `give --train-len below ${longest}, or ` : '';
    return `the patch can never change any output: ${where}, ${unchanged}; `
      + `${r.kind === 'fixed' ? 're-export the model with dynamic axes, or ' : ''}${other}give --allow-no-op to write it anyway (s stays a trainable initializer)`;
  }
  if (r.effect === 'unknown') {
    return `${where}: the factor there is not known from the graph (verification reads it); the patched model runs nowhere else, so it shows no gain of SSMax at longer lengths${r.kind === 'fixed' ? '; re-export the model with dynamic axes for that' : ''}`;
  }
  const reached = L !== undefined && L <= longest;
  const train = L === undefined ? 'the patched model differs from the original wherever the factor is not 1, and never runs at other lengths'
    : reached ? `the patched model equals the original only at rows with n = L = ${L} and never runs beyond L`
      : `the patched model differs from the original at every length it can run (never n = L = ${L}) and never runs beyond L`;
  const fit = !reached && longest >= 2 ? `give --train-len ${longest} to reproduce the original at n = ${longest}` : '';
  const longer = r.kind === 'fixed' ? `re-export the model with dynamic axes to see SSMax at longer lengths${fit ? `, or ${fit}` : ''}`
    : `${r.lift ? `the cap is the model's own: ${r.lift}` : 'the cap is the model\'s own, which no option lifts'}${fit ? `; ${fit}` : ''}`;
  return `${where}, where the factor ${formula} is ${factorText(r)}: ${train}; ${longer}`;
}

/** The most keys any attention row of a model can see, when the model bounds it: every length fixed, or a position table. */
export interface LengthBound {
  /** The most keys any row can see (undefined: fixed, but the graph does not tell the count). */
  longest?: number;
  kind: 'fixed' | 'capped';
  why: string;
  /** What lifts the cap (LengthLimit.lift). */
  lift?: string;
}

/**
 * What would let a bounded model run longer, to do `goal`: re-exporting it with dynamic axes where its inputs fix
 * the lengths; nothing where a table of positions caps them (no option of this tool and no re-export adds rows).
 */
export function longerAdvice(bound: Pick<LengthBound, 'kind' | 'lift'>, goal: string): string {
  if (bound.kind === 'fixed') return `re-export it with dynamic axes ${goal}`;
  return bound.lift ? `the model's own cap: ${bound.lift}` : 'the model\'s own cap, which no option lifts';
}

/** The model's bound from its lengths, read at one run's shape (a fixed model's counts do not depend on it). */
export function lengthBound(lengths: ModelLengths, specs: readonly InputSpec[], shape: RunShape): LengthBound | null {
  if (lengths.fixed) {
    const keys = lengths.sites.map((s) => (s.keys ? evaluate(s.keys, specs, shape, new Map(), () => undefined) : undefined));
    const known = keys.every((k) => k !== undefined);
    return { kind: 'fixed', why: lengths.fixed, ...(known && keys.length ? { longest: Math.max(...(keys as number[])) } : {}) };
  }
  return lengths.cap ? { kind: 'capped', why: lengths.cap.reason, longest: lengths.cap.length, ...(lengths.cap.lift ? { lift: lengths.cap.lift } : {}) } : null;
}
