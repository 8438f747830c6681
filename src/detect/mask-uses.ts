/**
 * How each term on a site's logits decides which keys a row may see, so that n can be counted from the masks
 * actually applied: additive masks hide a key with an entry far below the rest of its row (−inf, finfo.min, −10000,
 * Swin's −100), Where masks with their condition. Terms that are not masks are told apart and never counted: the
 * model's own normalisations (a row's max subtracted, computed from the logits themselves), position biases, and
 * terms with one value per row (they shift or hide whole rows, never single keys).
 */
import { constantOf, Poly } from '../graph/poly';
import { Graph } from '../graph/graph';
import { Shapes } from '../graph/shapes';
import { causalEvidence } from './mask';
import { HIDDEN_GAP, TermForms } from './mask-form';
import { Step } from './trace';

export { HIDDEN_GAP } from './mask-form';

export type MaskRule = 'additive' | 'subtractive' | 'keep-where' | 'drop-where';
export type MaskRole = 'causal' | 'padding' | 'combined' | 'other';

/**
 * mask: counted for n. bias: a position bias (T5's table, ALiBi's slopes × distance, Swin's relative bias).
 * from-logits: computed from the logits themselves (wav2vec2's `weights − weights.max(-1)`): a normalisation the
 * factor commutes with, since it is taken after the factor. per-row: one value for all the keys of a row (a key axis
 * of size 1), which hides no single key.
 */
export type MaskKind = 'mask' | 'bias' | 'from-logits' | 'per-row';

/**
 * `view`: the tensor on the logits' path the term is applied to, `viewRank` the rank of the result; `viewShape`: for
 * a view of another rank than 3 and 4, the shape input of the Reshape that made it, when its dims are known.
 */
export interface MaskUse { tensor: string; rule: MaskRule; role: MaskRole; kind: MaskKind; viewRank?: number; view: string; viewShape?: string }

/** The terms applied on a site's path after its content logits `logits` (the QK product's output `qk`). */
export function maskUses(graph: Graph, path: { steps: Step[]; qk: string }, shapes: Shapes): MaskUse[] {
  const uses: MaskUse[] = [];
  const forms = new TermForms(graph);
  for (const { node, index } of path.steps) {
    let use: Pick<MaskUse, 'tensor' | 'rule'> | undefined;
    if (node.opType === 'Add') use = { tensor: node.input[1 - index], rule: 'additive' };
    else if (node.opType === 'Sub' && index === 0) use = { tensor: node.input[1], rule: 'subtractive' };
    else if (node.opType === 'Where') use = { tensor: node.input[0], rule: index === 1 ? 'keep-where' : 'drop-where' };
    if (!use?.tensor) continue;
    const view = node.input[index];
    const role = roleOf(graph, use.tensor);
    const viewRank = shapes.rank(node.output[0]);
    const viewShape = viewRank === 3 || viewRank === 4 ? undefined : reshapeOf(graph, shapes, view);
    uses.push({ ...use, role, kind: kindOf(graph, forms, shapes, { ...use, role, view }, path.qk), viewRank, view, ...(viewShape ? { viewShape } : {}) });
  }
  return uses;
}

/**
 * The shape input of the Reshape that made `view`, when every dim it gives is a size (no 0 or −1, which would copy
 * or infer a dim): its constant pieces are positive and the others are computed from shapes. n counted in that view
 * can then be laid out back (n-source.ts).
 */
function reshapeOf(graph: Graph, shapes: Shapes, view: string): string | undefined {
  const node = graph.producer.get(view);
  const shape = node?.opType === 'Reshape' ? node.input[1] : undefined;
  if (!shape || !graph.query.isStatic(shape)) return undefined;
  const known = shapes.values(shape);
  if (known) return known.every((d) => constantOf(d) === undefined || constantOf(d)! > 0) ? shape : undefined;
  const concat = graph.producer.get(shape);
  const pieces = concat?.opType === 'Concat' ? concat.input : [shape];
  return pieces.every((p) => graph.constValue(p)?.values.every((v) => v > 0) ?? !graph.isConstant(p)) ? shape : undefined;
}

/**
 * Masks n can be counted from together: each in a 3-D [B·H, Tq, Tk] or 4-D [B, H, Tq, Tk] view, or all in one view
 * of another rank made by a Reshape of known dims.
 */
export function countable(counted: MaskUse[]): boolean {
  if (counted.every((u) => u.viewRank === 3 || u.viewRank === 4)) return true;
  return counted.every((u) => u.viewShape !== undefined && u.viewShape === counted[0].viewShape);
}

/** The masks n is counted from. */
export const masksOnly = (uses: MaskUse[]): MaskUse[] => uses.filter((u) => u.kind === 'mask');

function kindOf(graph: Graph, forms: TermForms, shapes: Shapes, u: Omit<MaskUse, 'kind' | 'viewRank'>, qk: string): MaskKind {
  if (graph.query.dependsOn(u.tensor, qk)) return 'from-logits';
  if (perRow(shapes.shape(u.tensor), shapes.dim(u.view, -1))) return 'per-row';
  if (u.rule === 'keep-where' || u.rule === 'drop-where' || u.role === 'causal' || u.role === 'combined') return 'mask';
  const form = forms.of(u.tensor);
  // A term from a model input is a mask unless it is built as a bias; any other one only when it is built as a mask.
  if (u.role === 'padding') return form === 'bias' || form === 'position' ? 'bias' : 'mask';
  return form === 'mask' ? 'mask' : 'bias';
}

/** A term whose key axis is 1 (or a scalar) on logits whose key axis may be longer: the same value for every key. */
function perRow(shape: Poly[] | undefined, keys: Poly | undefined): boolean {
  if (!shape) return false;
  const last = shape.length ? constantOf(shape[shape.length - 1]) : 1;
  return last === 1 && (keys === undefined || constantOf(keys) !== 1);
}

function roleOf(graph: Graph, tensor: string): MaskRole {
  const causal = causalEvidence(graph, tensor) !== null;
  // Values from a graph input (an attention mask), not only from shapes and constants.
  const fromInput = graph.query.dependsOnInput(tensor);
  if (causal) return fromInput ? 'combined' : 'causal';
  return fromInput ? 'padding' : 'other';
}

/**
 * The masks n is counted from in a mode. causal-padding reads only the padding masks (the causal part is
 * positional), so layers that slice their own causal mask still share one count.
 */
export function countedMasks(mode: string, uses: MaskUse[]): MaskUse[] {
  if (mode === 'mask') return masksOnly(uses);
  return mode === 'padding' || mode === 'causal-padding' ? masksOnly(uses).filter((u) => u.role === 'padding') : [];
}

/** What the report says of the terms on a site's logits: which entries of the counted masks hide keys, and which terms are not masks. */
export function describeUses(counted: MaskUse[], others: MaskUse[]): string {
  const hidden = counted.map((u) => `'${u.tensor}' ${hiddenBy(u)}${u.viewRank !== undefined && u.viewRank !== 3 && u.viewRank !== 4 ? ` (in a ${u.viewRank}-D view)` : ''}`);
  const not = others.map((u) => `'${u.tensor}' (${NOT_COUNTED[u.kind as Exclude<MaskKind, 'mask'>]})`);
  return [hidden.length ? `hidden: ${hidden.join('; ')}` : '', not.length ? `not masks: ${not.join('; ')}` : ''].filter(Boolean).join('; ');
}

function hiddenBy(u: MaskUse): string {
  switch (u.rule) {
    case 'additive': return `entries at least ${HIDDEN_GAP} below their row's largest`;
    case 'subtractive': return `entries at least ${HIDDEN_GAP} above their row's smallest`;
    case 'keep-where': return 'false entries';
    case 'drop-where': return 'true entries';
  }
}

const NOT_COUNTED: Record<Exclude<MaskKind, 'mask'>, string> = {
  'bias': 'a position bias',
  'from-logits': 'computed from the logits themselves: a normalisation, taken after the factor',
  'per-row': 'one value per row: hides no single key',
};
