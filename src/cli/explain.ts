/** --explain NODE: the detection rules tried on a candidate node, each matched or stopped at a node with a reason. */
import { explainNode, Explanation } from '../detect/find-attention';
import { readModel } from '../io/model-file';

export const formatExplain = (list: Explanation[]): string[] => list.flatMap((e) => [
  `${e.node}  ${e.op}${e.scope === 'main' ? '' : `  [${e.scope}]`}: ${e.verdict}`,
  ...e.attempts.map((a) => (a.matched ? `  matched  ${a.rule}`
    : `  stopped  ${a.rule} at '${a.stoppedAt}' after ${a.steps} check(s): ${a.reason}${a.rule === e.rule ? '  (closest)' : ''}`)),
]);

/** Prints the traces of the candidates `name` names (a name, label or glob) and writes no file. */
export function explainCommand(input: string, name: string): number {
  process.stdout.write(formatExplain(explainNode(readModel(input), name)).join('\n') + '\n');
  return 0;
}
