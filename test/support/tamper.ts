/**
 * Wrong patches made from right ones, for the tests that verification catches them: each edit changes the
 * patched graph's wiring (what the factor reads or where it goes), never only the record, and keeps the
 * journal telling where the factor is, as a patch that made that mistake would have written it.
 */
import { Graph } from '../../src/graph/graph';
import { modelScopes, Scope } from '../../src/graph/scopes';
import { makeTensor } from '../../src/graph/tensor';
import { topoSort } from '../../src/graph/toposort';
import { DataType, ModelProto, NodeProto } from '../../src/io/onnx';
import { nodeKey } from '../../src/rewrite/journal';
import { PatchRecord, readRecord, SiteRecord, writeRecord } from '../../src/rewrite/record';

const node = (opType: string, input: string[], output: string): NodeProto => ({ opType, domain: '', input, output: [output], name: output, attribute: [] });

/** A Constant node (tampering adds no initializer: the initializer set is what tells a pair of models apart). */
function constant(output: string, dataType: number, dims: number[], values: number[]): NodeProto {
  return { ...node('Constant', [], output), attribute: [{ name: 'value', type: 4, t: makeTensor('', dataType, dims, values), floats: [], ints: [], strings: [], tensors: [], graphs: [] }] };
}

function recordOf(m: ModelProto): PatchRecord {
  const r = readRecord(m);
  if (!r) throw new Error('no patch record');
  return r;
}

function scopeOf(m: ModelProto, path: string): Scope {
  const s = modelScopes(m).find((x) => x.path === path);
  if (!s) throw new Error(`no scope ${path}`);
  return s;
}

/** The site of `layer` (in the main graph unless `scope` says otherwise). */
export function siteOf(m: ModelProto, layer: number, scope = 'main'): SiteRecord {
  const site = recordOf(m).sites.find((s) => s.layer === layer && (s.scope ?? 'main') === scope);
  if (!site) throw new Error(`no site L${layer} in ${scope}`);
  return site;
}

/** Puts nodes between a tensor and every reader of it in one graph: `make` returns what the readers read instead. */
export function between(g: Graph, tensor: string, make: (add: (n: NodeProto) => void) => string): void {
  const readers = [...g.consumersOf(tensor)];
  const out = make((n) => g.insertNode(n));
  for (const r of readers) r.input.forEach((x, i) => { if (x === tensor) g.setInput(r, i, out); });
  topoSort(g.proto);
}

/** The s of layer `layer` reaches its factor reversed along the head axis (the initializer unchanged). */
export function reverseHeadsOfS(m: ModelProto, layer: number): void {
  const g = new Graph(m.graph!);
  const s = siteOf(m, layer).sInitializer!;
  between(g, s, (add) => {
    add(constant(`t/${s}/starts`, DataType.INT64, [1], [-1]));
    add(constant(`t/${s}/ends`, DataType.INT64, [1], [-(2 ** 53 - 1)]));
    add(constant(`t/${s}/axes`, DataType.INT64, [1], [0]));
    add(constant(`t/${s}/steps`, DataType.INT64, [1], [-1]));
    add(node('Slice', [s, `t/${s}/starts`, `t/${s}/ends`, `t/${s}/axes`, `t/${s}/steps`], `t/${s}/reversed`));
    return `t/${s}/reversed`;
  });
}

/** The s of layer `layer` is multiplied by `k` on its way to the factor (0: no factor at all). */
export function scaleS(m: ModelProto, layer: number, k: number): void {
  const g = new Graph(m.graph!);
  const s = siteOf(m, layer).sInitializer!;
  between(g, s, (add) => {
    add(constant(`t/${s}/k`, DataType.FLOAT, [], [k]));
    add(node('Mul', [s, `t/${s}/k`], `t/${s}/scaled`));
    return `t/${s}/scaled`;
  });
}

/** Layer `layer`'s factor reads layer `other`'s s initializer. */
export function useSOf(m: ModelProto, layer: number, other: number): void {
  const g = new Graph(m.graph!);
  const s = siteOf(m, layer).sInitializer!;
  const t = siteOf(m, other).sInitializer!;
  for (const r of [...g.consumersOf(s)]) r.input.forEach((x, i) => { if (x === s) g.setInput(r, i, t); });
}

/** Moves each site's factor from the query onto the logits (the QK product), as a logits-side patch would place it. */
export function moveFactorToLogits(m: ModelProto): void {
  const g = m.graph!;
  const record = recordOf(m);
  for (const site of record.sites) {
    const apply = g.node.find((n) => n.name === site.apply)!;
    const qk = g.node.find((n) => n.output[0] === site.logits)!;
    const scaled = apply.output[0];
    const readers = g.node.filter((n) => n !== apply && n.input.includes(qk.output[0]));
    qk.input[0] = apply.input[0];
    for (const n of readers) n.input = n.input.map((i) => (i === qk.output[0] ? scaled : i));
    apply.input[0] = qk.output[0];
    site.target = 'logits';
    // The journal says where the factor now is: the logits' reader reads the scaled logits.
    for (const e of record.journal ?? []) {
      e.rewired = e.rewired.filter((w) => !(w.node === nodeKey(qk) && w.input === 0));
      if (e.owner === `L${site.layer}` && e.scope === (site.scope ?? 'main')) {
        const reader = readers[0];
        e.rewired.push({ node: nodeKey(reader), input: reader.input.indexOf(scaled), from: qk.output[0], to: scaled, length: reader.input.length });
      }
    }
  }
  writeRecord(m, record);
  topoSort(g);
}

/** Puts `make` between every inserted Log in scope `path` and what it reads (n as the Log sees it). */
export function editN(m: ModelProto, make: (n: string, type: number, add: (x: NodeProto) => void) => string, path = 'main'): number {
  const scope = scopeOf(m, path);
  const inserted = new Set(recordOf(m).journal!.filter((e) => e.scope === path).flatMap((e) => e.nodes));
  const logs = scope.graph.nodes.filter((n) => n.opType === 'Log' && inserted.has(n.name));
  for (const log of logs) {
    const n = log.input[0];
    const out = make(n, scope.shapes.type(n) ?? DataType.FLOAT, (x) => scope.graph.insertNode(x));
    scope.graph.setInput(log, 0, out);
  }
  scope.commit();
  return logs.length;
}

/** `op`(n, value) before every ln n, named `t/<n>/<tag>`. */
function opOnN(m: ModelProto, op: 'Mul' | 'Add', value: number, tag: string, path: string): number {
  return editN(m, (n, type, add) => {
    add(constant(`t/${n}/${tag}_operand`, type, [], [value]));
    add(node(op, [n, `t/${n}/${tag}_operand`], `t/${n}/${tag}`));
    return `t/${n}/${tag}`;
  }, path);
}

/** n doubled before every ln n (the tampering: s·ln(2n)). */
export function doubleN(m: ModelProto, path = 'main'): number {
  return opOnN(m, 'Mul', 2, 'doubled', path);
}

/** n + 1 before every ln n. */
export function nPlusOne(m: ModelProto, path = 'main'): number {
  return opOnN(m, 'Add', 1, 'plus_one', path);
}

/**
 * Every main-graph site's factor bypassed in the model as written: what read the scaled query reads the query. The
 * journal is left as it was, so a plain-op form undone from it (fused sites) still has the factor.
 */
export function bypassFactors(m: ModelProto): void {
  const g = new Graph(m.graph!);
  for (const site of recordOf(m).sites.filter((s) => (s.scope ?? 'main') === 'main')) {
    const apply = g.nodes.find((n) => n.name === site.apply);
    if (!apply) throw new Error(`no apply node ${site.apply}`);
    const query = apply.input.find((i) => i !== site.factor)!;
    g.redirect(apply.output[0], query);
  }
}
