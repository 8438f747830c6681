/**
 * How each mask on a site's logits decides which keys a row may see, so that n can be counted from the mask
 * actually applied: additive masks hide a key with a large negative value (−inf, finfo.min, −10000), Where masks
 * with their condition.
 */
import { Graph } from '../graph/graph';
import { Shapes } from '../graph/shapes';
import { causalEvidence } from './mask';
import { Step } from './trace';

/**
 * Additive entries at or below this hide a key (−inf, finfo.min, −10000); position biases (ALiBi, T5) stay above it.
 * The one threshold: n from masks in the patch (n-source.ts, ONNX Attention's expansion) and in verification (views.ts).
 */
export const HIDDEN_BELOW = -9000;

export type MaskRule = 'additive' | 'subtractive' | 'keep-where' | 'drop-where';
export type MaskRole = 'causal' | 'padding' | 'combined' | 'other';

/** `viewRank`: the rank of the view of the logits the mask is applied to. */
export interface MaskUse { tensor: string; rule: MaskRule; role: MaskRole; viewRank?: number }

export function maskUses(graph: Graph, steps: Step[], shapes: Shapes): MaskUse[] {
  const uses: MaskUse[] = [];
  for (const { node, index } of steps) {
    let use: Omit<MaskUse, 'role'> | undefined;
    if (node.opType === 'Add') use = { tensor: node.input[1 - index], rule: 'additive' };
    else if (node.opType === 'Sub' && index === 0) use = { tensor: node.input[1], rule: 'subtractive' };
    else if (node.opType === 'Where') use = { tensor: node.input[0], rule: index === 1 ? 'keep-where' : 'drop-where' };
    if (use?.tensor) uses.push({ ...use, role: roleOf(graph, use.tensor), viewRank: shapes.rank(node.output[0]) });
  }
  return uses;
}

function roleOf(graph: Graph, tensor: string): MaskRole {
  const causal = causalEvidence(graph, tensor) !== null;
  // Values from a graph input (an attention mask), not only from shapes and constants.
  const fromInput = graph.query.dependsOnInput(tensor);
  if (causal) return fromInput ? 'combined' : 'causal';
  return fromInput ? 'padding' : 'other';
}

