/**
 * What an additive term on the logits is made of, read from how the graph builds it: a mask (a fill value chosen by
 * a condition, a 0/1 flag scaled by a large constant, a constant with entries far apart, a float mask input) or a
 * position bias (a learned table gathered by position, slopes times distances). Only masks are counted for n; which
 * of their entries hide keys is decided at run time by their effect (n-source.ts): an entry at least HIDDEN_GAP below
 * the row's largest, whatever its constant (Swin's −100, −10000, finfo.min, −inf).
 */
import { attr, Graph } from '../graph/graph';
import { readTensor } from '../graph/tensor';
import { DataType } from '../io/onnx';
import { memo } from '../memo';

/**
 * mask: can hide keys; flag: 0/1 values (a condition, a cast bool, 1 − flag); position: indices or distances (Range,
 * CumSum); bias: small smooth values (a table lookup, slopes × distance, a constant whose entries are close); unknown:
 * none of these can be told.
 */
export type TermForm = 'mask' | 'flag' | 'position' | 'bias' | 'unknown';

/** An additive entry this far below the largest of its row hides its key: e^−30 ≈ 1e-13 of a probability. */
export const HIDDEN_GAP = 30;

/** Masks at or below this (−10000, finfo.min, −inf) are far from any content logit: verification's probe reads them as strong. */
export const STRONG_MASK = -9000;

const VIEWS = new Set(['Cast', 'Identity', 'Reshape', 'Unsqueeze', 'Squeeze', 'Expand', 'Tile', 'Transpose', 'Slice', 'Flatten', 'Neg', 'Abs', 'Trilu']);
const FLAGS = new Set(['Equal', 'Less', 'Greater', 'LessOrEqual', 'GreaterOrEqual', 'Not', 'And', 'Or', 'Xor', 'IsNaN', 'IsInf']);
const INTEGER_OR_BOOL = new Set<number>([DataType.BOOL, DataType.INT64, DataType.INT32, DataType.INT16, DataType.INT8, DataType.UINT8]);
/** Mask-building chains are short; a deeper walk says unknown rather than recurse without bound. */
const MAX_DEPTH = 64;

/** The forms of a graph's tensors, each worked out once. */
export class TermForms {
  private readonly forms = new Map<string, TermForm>();

  constructor(private readonly graph: Graph) {}

  of(tensor: string, depth = 0): TermForm {
    if (depth > MAX_DEPTH) return 'unknown';
    return memo(this.forms, tensor, () => this.compute(tensor, depth + 1));
  }

  private compute(t: string, depth: number): TermForm {
    const g = this.graph;
    const c = g.constValue(t);
    if (c) return constantForm(c.values);
    if (g.inputs.has(t) && !g.initializers.has(t)) return INTEGER_OR_BOOL.has(g.elemType(t) ?? -1) ? 'flag' : 'mask';
    const node = g.producer.get(t);
    if (!node) return 'unknown';
    const input = (i: number): TermForm => this.of(node.input[i], depth);
    const op = node.opType;
    if (op === 'Cast' && g.elemType(node.input[0]) === DataType.BOOL) return 'flag';
    if (VIEWS.has(op)) return input(0);
    if (FLAGS.has(op)) return 'flag';
    if (op === 'Range' || op === 'CumSum') return 'position';
    if (op === 'ConstantOfShape') {
      const value = attr(node, 'value')?.t;
      return constantForm((value && readTensor(value)?.values) || [0]);
    }
    if (op === 'Gather') return g.initializers.has(node.input[0]) && !INTEGER_OR_BOOL.has(g.elemType(node.input[0]) ?? -1) ? 'bias' : input(0);
    if (op === 'Where') return this.where(node.input, depth);
    if (op === 'Concat') return combine(node.input.map((_, i) => input(i)));
    if (op === 'Mul') return this.product(node.input[0], node.input[1], depth);
    if (op === 'Add' || op === 'Sub') return combine([input(0), input(1)]);
    return 'unknown';
  }

  /** masked_fill: a constant branch is the fill, and the condition picks which entries get it. */
  private where([, a, b]: string[], depth: number): TermForm {
    const g = this.graph;
    if (g.constValue(a) || g.constValue(b)) return 'mask';
    return combine([this.of(a, depth), this.of(b, depth)]);
  }

  /** A flag times a large constant hides (BERT's (1 − mask)·−10000); slopes times distances is ALiBi, a bias. */
  private product(a: string, b: string, depth: number): TermForm {
    const [fa, fb] = [this.of(a, depth), this.of(b, depth)];
    if (fa === 'mask' || fb === 'mask') return 'mask';
    const big = (t: string): boolean => this.graph.constValue(t)?.values.some((v) => !Number.isFinite(v) || Math.abs(v) >= HIDDEN_GAP) ?? false;
    if ((fa === 'flag' && big(b)) || (fb === 'flag' && big(a))) return 'mask';
    if (fa === 'flag' && fb === 'flag') return 'flag';
    if (fa === 'position' || fb === 'position') return fa === 'unknown' || fb === 'unknown' ? 'unknown' : fa === 'flag' || fb === 'flag' ? 'position' : 'bias';
    return fa === 'bias' || fb === 'bias' ? 'bias' : 'unknown';
  }
}

function constantForm(values: number[]): TermForm {
  if (values.some((v) => !Number.isFinite(v))) return 'mask';
  if (values.every((v) => v === 0 || v === 1)) return 'flag';
  let lo = Infinity, hi = -Infinity;
  for (const v of values) [lo, hi] = [Math.min(lo, v), Math.max(hi, v)];
  return hi - lo >= HIDDEN_GAP ? 'mask' : 'bias';
}

/**
 * Several terms taken together (Concat, the branches of a Where, a sum): the strongest form any of them has. A sum
 * hides keys when one of its terms does (T5 adds its mask into the position bias).
 */
function combine(forms: TermForm[]): TermForm {
  for (const f of ['mask', 'unknown', 'bias', 'position', 'flag'] as TermForm[]) if (forms.includes(f)) return f;
  return 'unknown';
}
