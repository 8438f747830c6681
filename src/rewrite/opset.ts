/**
 * The opset the inserted ops need. Every op the patch inserts exists from opset 11 (Range, Slice with inputs); a
 * model below it gets its default-domain opset import raised to 11 when every node it has means the same there,
 * through the journal (revert lowers it again). Otherwise the patch is refused with what the user can do.
 */
import { InputError } from '../errors';
import { nodeLabel, subgraphsOf } from '../graph/graph';
import { defaultImport, Scope } from '../graph/scopes';
import { GraphProto, isDefaultDomain, ModelProto, NodeProto, toNumber } from '../io/onnx';
import { Journal } from './journal';

export const PATCH_OPSET = 11;

/**
 * Default-domain ops whose nodes, valid at an older opset, are invalid or mean something else at opset 11: the
 * opset that changed them (onnx/docs/Changelog.md). Slice and TopK took inputs for attributes at 10; Pad and Clip
 * at 11; Dropout's mask became bool at 10; Resize changed its default coordinate mode at 11; Upsample and Scatter
 * were removed; BatchNormalization lost `spatial` at 9; Scan changed its signature at 9.
 */
const CHANGED: Record<string, number> = {
  Slice: 10, TopK: 10, Dropout: 10, Upsample: 10, Resize: 11, Pad: 11, Clip: 11, Scatter: 11, BatchNormalization: 9, Scan: 9,
  MaxUnpool: 11, Split: 2, Reshape: 5, Concat: 4, Mean: 8, Max: 8, Min: 8, Sum: 8,
};

/** Raises the model's default-domain opset to PATCH_OPSET once, or refuses; `why` names what needs it. */
export class OpsetGuard {
  /** What was done, for the report. */
  readonly notes: string[] = [];

  constructor(private readonly model: ModelProto, private readonly scopes: Scope[], private readonly journal: Journal) {}

  ensure(scope: Scope, why: string): void {
    if (scope.opset >= PATCH_OPSET) return;
    if (scope.kind === 'function') {
      throw new InputError(`${why} needs opset ≥ ${PATCH_OPSET}, and function '${scope.fn!.name}' imports opset ${scope.opset}: convert the model to opset ${PATCH_OPSET} or later (onnx.version_converter) and patch that`, 'cannot-patch');
    }
    this.raise(why, scope.opset);
  }

  private raise(why: string, from: number): void {
    const entry = defaultImport(this.model.opsetImport);
    if (!entry) {
      this.importDefault(why);
      return;
    }
    const blocking = changedNodes(this.model.graph!, from);
    if (blocking.length) {
      const ops = [...new Set(blocking.map((n) => n.opType))].join(', ');
      throw new InputError(`${why} needs opset ≥ ${PATCH_OPSET}; the model imports opset ${from}, and raising it would change what its `
        + `${ops} node(s) mean (e.g. '${nodeLabel(blocking[0])}'): convert the model to opset ${PATCH_OPSET} or later (onnx.version_converter) and patch that`, 'cannot-patch');
    }
    this.journal.raiseOpset(from, PATCH_OPSET);
    this.notes.push(`the default opset import was raised from ${from} to ${PATCH_OPSET}: ${why} needs ops of opset ${PATCH_OPSET}, and every node of the model means the same there (revert lowers it again)`);
    entry.version = PATCH_OPSET;
    this.raised();
  }

  /** A model of contrib ops alone imports no default domain: the import is added (from 0 in the journal: none). */
  private importDefault(why: string): void {
    this.journal.raiseOpset(0, PATCH_OPSET);
    this.notes.push(`a default-domain opset import (${PATCH_OPSET}) was added: ${why} needs ops of the default domain, which the model did not import (revert removes it again)`);
    this.model.opsetImport.push({ domain: '', version: PATCH_OPSET });
    this.raised();
  }

  private raised(): void {
    for (const s of this.scopes) if (s.kind !== 'function') s.opset = PATCH_OPSET;
  }
}

/** Nodes of the default domain, in the graph and its subgraphs, that opset 11 would read differently. */
function changedNodes(g: GraphProto, from: number): NodeProto[] {
  const out: NodeProto[] = [];
  for (const n of g.node) {
    const changed = CHANGED[n.opType];
    if (isDefaultDomain(n.domain) && changed !== undefined && changed > from && changed <= PATCH_OPSET) out.push(n);
    for (const sub of subgraphsOf(n)) out.push(...changedNodes(sub, from));
  }
  return out;
}

/** The opset a journal entry raised from, restored by revert (from 0: the import the patch added is removed). */
export function lowerOpset(model: ModelProto, from: number): void {
  const entry = defaultImport(model.opsetImport);
  const i = entry ? model.opsetImport.indexOf(entry) : -1;
  if (i < 0 || toNumber(model.opsetImport[i].version) !== PATCH_OPSET) return;
  if (from === 0) model.opsetImport.splice(i, 1);
  else model.opsetImport[i].version = from;
}
