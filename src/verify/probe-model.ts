/**
 * The probe copy of the patched model: for every site, what the factor multiplied and what the model computes
 * with instead, brought out as graph outputs from whichever graph holds the site (expose.ts):
 *   - a factor on the logits: the logits before it (the journal's rewired input) and what the rewired node reads;
 *   - a factor on the query of a plain MatMul: the QK product (its output) and the same product recomputed from
 *     the unscaled query, so the probe compares logits either way;
 *   - a fused operator: its query input before and after (and its bias, where the patch folded the query part of
 *     it into the query), plus the shapes and values of the inputs its n is read from;
 *   - sites whose n is counted from masks: the logits their Softmax reads.
 * `rows: 'last'` brings out only the last row of logits, for runs too long to read whole attention matrices.
 */
import { softmaxNamed } from '../detect/softmax';
import { inputAt, inputOf, NPlan, opSpec, Term } from '../graph/attention-ops';
import { nodeLabel } from '../graph/graph';
import { Scope } from '../graph/scopes';
import { DataType, ModelProto, NodeProto } from '../io/onnx';
import { nodeKey } from '../rewrite/journal';
import { countsMasks, NMode } from '../policy/n-mode';
import { planFor } from '../rewrite/fused';
import { Exposer, Unexposable } from './expose';
import { constant, lastRows, node, PREFIX } from './nodes';
import { readsLogits, VerifySite } from './sites';
import { STRONG_MASK } from '../detect/mask-form';
import type { WindowSpec } from '../policy/window';
import { setWindows } from './runtime-model';
import { ropeLabel, RopeSiteRecord } from '../rewrite/rope';
import { SHORT_SEQ } from './plan';

export interface ProbeOutputs {
  before: string;
  after: string;
  masked?: string;
  /**
   * A factor on the query: the content logits the masks are added to (the QK product after its constant scalings),
   * so the masks' terms are read as the patch counts them: masked − content.
   */
  content?: string;
  /** Where a Where fills hidden keys with a mild constant (jolt_minigpt's −10): 1 where a key is hidden, else 0, logits-shaped. */
  hidden?: string;
  /** A factor on the query: the shape of the QK product, whose last axis is the key count. */
  keys?: string;
  bias?: { before: string; after: string };
  /** Fused operators: graph outputs holding the shapes and values of the inputs n is read from, by role. */
  shapes?: Map<string, string>;
  values?: Map<string, string>;
  /** Element type of what the probe reads after the factor, for its rounding tolerance. */
  type?: number;
  /** The positional prior: what its Add read (absent: nothing, a fused operator without a bias) and what it made. */
  prior?: { before?: string; after: string; type?: number };
  /** The sliding window: what its Add read and made, and the W and S this copy runs it with (probeWindow). */
  window?: { before: string; after: string; type?: number; spec: WindowSpec };
}

/** Per site: its outputs, why the site cannot be seen (`unprobed`), or what is wrong with it (`problem`). */
export type ProbeWiring = ProbeOutputs | { unprobed: string } | { problem: string };

/**
 * The window the copy of all rows runs: the model's when its short runs (SHORT_SEQ keys) outrun it, else one they
 * do, so the rows it reads have keys hidden and sinks kept whatever W the model has. The window's nodes read W and
 * S at run time, so the nodes probed are the model's own. The last-row copy (runs beyond L) keeps the model's window.
 */
const PROBE_WINDOW: WindowSpec = { size: 4, sinks: 2 };

export function probeWindow(w: WindowSpec, rows: 'all' | 'last'): WindowSpec {
  if (rows === 'last' || w.size < SHORT_SEQ) return w;
  return { size: PROBE_WINDOW.size, sinks: Math.min(w.sinks, PROBE_WINDOW.sinks) };
}

/** A rescaled RoPE constant in the probe copy: its rescaled frequencies, and YaRN's Cos and Sin before and after its factor. */
export type RopeWiring = { label: string; scaled: string; pairs: { before: string; after: string }[] }
  | { label: string; unprobed: string } | { label: string; problem: string };

export function addProbeOutputs(model: ModelProto, sites: readonly VerifySite[], rows: 'all' | 'last', rope: readonly RopeSiteRecord[] = []): { sites: ProbeWiring[]; rope: RopeWiring[] } {
  const x = new Exposer(model);
  setWindows(x.scopes, sites.map((s) => s.record), (w) => probeWindow(w, rows));
  const wirings = sites.map((site) => wire(x, site, rows));
  const ropes = rope.map((r) => ropeWiring(x, r));
  x.finish();
  return { sites: wirings, rope: ropes };
}

/** What the probe reads of one rescaled RoPE constant: the Mul's output and, for YaRN, each Cos and Sin and what its readers read. */
function ropeWiring(x: Exposer, r: RopeSiteRecord): RopeWiring {
  const label = ropeLabel(r);
  const g = x.scope('main')!.graph;
  const apply = g.nodes.find((n) => n.name === r.apply);
  if (!apply) return { label, problem: `its Mul '${r.apply}' is not in the graph` };
  // The Mul's value can be right while the angles still read the original constant: then nothing was rescaled.
  const stale = g.consumersOf(r.constant).find((n) => n !== apply);
  if (stale) return { label, problem: `'${nodeLabel(stale)}' still reads the original frequencies '${r.constant}': the rescaling is bypassed` };
  const staleCache = r.table && [r.table.cos, r.table.sin].flatMap((c) => g.consumersOf(c).map((n) => ({ c, n })))[0];
  if (staleCache) return { label, problem: `'${nodeLabel(staleCache.n)}' still reads the original cache '${staleCache.c}': the rescaling is bypassed` };
  const trigs = (r.trig ?? []).map((t) => ({ label: t, node: g.nodes.find((n) => nodeLabel(n) === t) }));
  for (const t of trigs) {
    const other = t.node && g.consumersOf(t.node.output[0]).find((c) => c.input[1] !== r.mscale);
    if (other) return { label, problem: `'${nodeLabel(other)}' reads '${t.label}' without YaRN's factor` };
  }
  const out = (tensor: string, name: string): string => {
    const e = x.expose('main', tensor, `rope/${name}`);
    if (e instanceof Unexposable) throw e;
    return e;
  };
  try {
    const pairs = trigs.map((t, k) => {
      const after = t.node && g.consumersOf(t.node.output[0]).find((c) => c.input[1] === r.mscale);
      if (!t.node || !after) throw new Unexposable(`'${t.label}' and YaRN's factor on it are not in the graph`);
      return { before: out(t.node.output[0], `trig${k}`), after: out(after.output[0], `trig${k}_scaled`) };
    });
    return { label, scaled: out(apply.output[0], 'scaled'), pairs };
  } catch (e) {
    if (e instanceof Unexposable) return { label, unprobed: e.reason };
    throw e;
  }
}

class Problem extends Error {}

function wire(x: Exposer, site: VerifySite, rows: 'all' | 'last'): ProbeWiring {
  const t = site.tensors;
  if (!t) return { problem: site.problem ?? `${site.label}: not found` };
  const scope = x.scope(t.scope);
  const consumer = scope?.graph.nodes.find((n) => nodeKey(n) === t.consumer);
  if (!scope || !consumer) return { problem: `${site.label}: the node the patch rewired is not in the model` };
  const tag = `L${site.record.layer}${site.call ? `_${site.call.label}` : ''}`;
  const out = (tensor: string, name: string): string => {
    const r = x.expose(t.scope, tensor, `${tag}/${name}`, site.call);
    if (r instanceof Unexposable) throw r;
    return r;
  };
  try {
    if (!readsLogits(site)) return fusedOutputs(x, site, consumer, scope, out);
    return logitsOutputs(x, site, scope, consumer, rows, out);
  } catch (e) {
    if (e instanceof Unexposable) return { unprobed: `${site.label}: ${e.reason}` };
    if (e instanceof Problem) return { problem: `${site.label}: ${e.message}` };
    throw e;
  }
}

type Out = (tensor: string, name: string) => string;

/**
 * A plain-op site: the logits before and after the factor, or, for a factor on the query of the QK product, the
 * query before and after it (the product is linear in the query, so scaling its rows scales the logits' rows
 * exactly, and comparing queries has no rounding of two dot products to allow for) with the key count read off
 * the product's shape.
 */
function logitsOutputs(x: Exposer, site: VerifySite, scope: Scope, consumer: NodeProto, rows: 'all' | 'last', out: Out): ProbeOutputs {
  const t = site.tensors!;
  const g = scope.graph;
  const actual = t.after ?? consumer.input[t.input];
  const lastOf = (tensor: string): string => (rows === 'last' ? slice(x, scope, tensor) : tensor);
  const before = lastOf(t.before);
  const after = lastOf(actual);
  const prior = t.prior ? { before: out(lastOf(t.prior.before), 'prior_before'), after: out(lastOf(t.prior.after), 'prior_after'), type: scope.shapes.type(t.prior.after) } : undefined;
  const window = t.window && site.window ? {
    before: out(lastOf(t.window.before), 'window_before'), after: out(lastOf(t.window.after), 'window_after'), type: scope.shapes.type(t.window.after),
    spec: probeWindow(site.window, rows),
  } : undefined;
  let keys: string | undefined;
  if (site.record.target === 'query') {
    const shape = g.uniqueName(`${PREFIX}${nodeLabel(consumer)}/qk_shape`);
    x.add(scope, node('Shape', [consumer.output[0]], shape));
    keys = out(shape, 'qk_shape');
  }
  const softmax = t.softmax ? softmaxNamed(g, scope.shapes, t.softmax) : undefined;
  if (t.softmax && !softmax) throw new Problem(`its Softmax '${t.softmax}' is not in the graph`);
  const wantMasked = countsMasks(site.record.n) && softmax;
  const hidden = wantMasked ? mildFill(x, scope, softmax.input) : undefined;
  return {
    type: scope.shapes.type(actual), before: out(before, 'before'), after: out(after, 'after'), ...(keys ? { keys } : {}), ...(prior ? { prior } : {}),
    ...(window ? { window } : {}),
    ...(wantMasked ? { masked: out(lastOf(softmax.input), 'masked') } : {}),
    ...(hidden ? { hidden: out(lastOf(hidden), 'hidden') } : {}),
    ...(wantMasked && t.content ? { content: out(lastOf(t.content), 'content') } : {}),
  };
}

/**
 * Logits a Where writes with a constant fill above STRONG_MASK on one branch (Where(mask, −10, scores)): the masked
 * values cannot tell a hidden key from a low logit, so the probe counts keys as the patch does, by the condition.
 * Returns a float tensor of the logits' shape, 1 where the fill is taken.
 */
function mildFill(x: Exposer, scope: Scope, logits: string): string | undefined {
  const g = scope.graph;
  const where = g.producer.get(logits);
  if (where?.opType !== 'Where') return undefined;
  const fillAt = [1, 2].find((i) => {
    const c = g.constValue(where.input[i]);
    return c?.values.length === 1 && Number(c.values[0]) > STRONG_MASK && !g.isConstant(where.input[3 - i]);
  });
  if (fillAt === undefined) return undefined;
  const name = (base: string): string => g.uniqueName(`${PREFIX}${nodeLabel(where)}/${base}`);
  const one = constant(g, `${nodeLabel(where)}/one`, DataType.FLOAT, [], [1]), zero = constant(g, `${nodeLabel(where)}/zero`, DataType.FLOAT, [], [0]);
  const [hit, miss] = fillAt === 1 ? [one, zero] : [zero, one];
  const indicator = node('Where', [where.input[0], hit.output[0], miss.output[0]], name('hidden_indicator'));
  const shape = node('Shape', [logits], name('logits_shape'));
  const full = node('Expand', [indicator.output[0], shape.output[0]], name('hidden'));
  for (const n of [one, zero, indicator, shape, full]) x.add(scope, n);
  return full.output[0];
}


function slice(x: Exposer, scope: Scope, tensor: string): string {
  const r = lastRows(scope.graph, tensor, scope.opset, scope.shapes.rank(tensor), 1);
  if (!r) throw new Problem(`the last row of '${tensor}' cannot be sliced (opset ${scope.opset}, rank unknown)`);
  for (const n of r.nodes) x.add(scope, n);
  return r.out;
}

function fusedOutputs(x: Exposer, site: VerifySite, consumer: NodeProto, scope: Scope, out: Out): ProbeOutputs {
  const t = site.tensors!, f = site.fused!;
  const g = scope.graph;
  // The plan the patch used for the recorded n mode (keys on a causal operator reads other inputs than its own plan).
  const terms: Term[] = [...termsOf(planFor(f, site.record.n as NMode)), f.queryLength];
  const shapes = new Map<string, string>(), values = new Map<string, string>();
  // An expanded operator is gone; the inputs n is read from are the original node's, which its expansion reads.
  const op = site.record.expanded ? f.node : consumer;
  const spec = opSpec(f.op);
  for (const term of terms) {
    const input = inputOf(spec, op, term.role);
    // Named by position, as the operator's schema numbers its inputs.
    const at = inputAt(spec, term.role);
    if (!input) throw new Problem(`input ${at} of the operator, which n is read from, is empty`);
    if ('value' in term) {
      if (!values.has(term.role)) values.set(term.role, out(input, `value${at}`));
    } else if (!shapes.has(term.role)) {
      const shape = g.uniqueName(`${PREFIX}${nodeLabel(op)}/shape${at}`);
      x.add(scope, node('Shape', [input], shape));
      shapes.set(term.role, out(shape, `shape${at}`));
    }
  }
  const bias = t.bias ? { before: out(t.bias.from, 'bias_before'), after: out(consumer.input[t.bias.input], 'bias_after') } : undefined;
  const prior = t.prior ? {
    ...(t.prior.before ? { before: out(t.prior.before, 'prior_before') } : {}), after: out(t.prior.after, 'prior_after'), type: scope.shapes.type(t.prior.after),
  } : undefined;
  return {
    type: scope.shapes.type(t.after ?? consumer.input[t.input]),
    before: out(t.before || t.prior!.after, 'before'), after: out(t.after ?? consumer.input[t.input], 'after'), shapes, values, ...(bias ? { bias } : {}), ...(prior ? { prior } : {}),
  };
}

function termsOf(plan: NPlan): Term[] {
  switch (plan.kind) {
    case 'keys': case 'causal': return plan.tk;
    case 'causal-offset': return [...plan.tk, ...plan.offset];
    case 'lengths': return [{ role: plan.lengths, value: true }, ...(plan.promptTotal !== undefined ? [{ role: plan.promptTotal, value: true as const }] : [])];
    // The mask's values, and the past's shape or length through tk (P = Tk − S).
    case 'mask-index': return [...plan.tk, ...(plan.mask !== undefined ? [{ role: plan.mask, value: true as const }] : [])];
  }
}
