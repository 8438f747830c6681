/**
 * What the tool knows about a model before it changes anything, computed once: the graph's structural findings, the
 * scopes (every graph and function body), and the attention detection over them. The command line analyses the
 * model it read once and hands the analysis to patchModel and verifyPatch; each of them analyses the model itself
 * when called alone.
 */
import { Detection, detectAttention } from '../detect/find-attention';
import { siteNodeLabel } from '../detect/site';
import type { Rule } from '../detect/rules';
import { modelScopes, Scope } from '../graph/scopes';
import { validateGraph } from '../graph/validate';
import type { ModelProto } from '../io/onnx';

/** What analyseModel takes: the same `force` and `rules` as patchModel's options. */
export interface AnalyseOptions {
  /** Node names whose refusal the user accepts (--force-site), as patchModel's `force`. */
  force?: readonly string[];
  /** The detection rules, in the order they are tried (default RULES). */
  rules?: readonly Rule[];
}

/** A model's analysis: valid for that model object only, and only until it is changed. */
export interface Analysis {
  /** The model analysed: the analysis holds its nodes, so it is of this object only. */
  readonly model: ModelProto;
  /** What the structural checks accepted and how (nodes out of order, constants defined twice). */
  readonly notes: readonly string[];
  /**
   * Every graph and function body of the model, indexed.
   * @internal
   */
  readonly scopes: Scope[];
  /** The attention found, and every Softmax skipped with its reason. */
  readonly detection: Detection;
  /** The names forced (--force-site) when detecting. */
  readonly force: readonly string[];
  /** The rules detection tried, when not the default RULES. */
  readonly rules?: readonly Rule[];
}

/**
 * Checks the graph before anything walks it. What onnxruntime accepts is accepted and said in notes: nodes out of
 * topological order (the patched model is written sorted, as ONNX requires, and revert restores their order) and
 * names defined by several constants (kept as they are; every reader sees the value onnxruntime uses).
 */
export function graphNotes(model: ModelProto): string[] {
  const { unsorted, duplicates } = validateGraph(model.graph!);
  return [...unsorted.map((u) => `nodes out of topological order in ${u}: written sorted, as onnxruntime sorts them on load; revert restores their order`),
    ...duplicates];
}

/** Checks, indexes and detects attention in `model`, once: hand the result to patchModel and verifyPatch. */
export function analyseModel(model: ModelProto, options: AnalyseOptions = {}): Analysis {
  const notes = graphNotes(model);
  const scopes = modelScopes(model);
  const force = options.force ?? [];
  return { model, notes, scopes, detection: detectAttention(model, scopes, { force, rules: options.rules }), force, rules: options.rules };
}

/**
 * The same analysis with other forced names: the structural checks and scopes are kept, detection runs again (a
 * forced node passes a rule where it stopped before).
 */
export function withForce(analysis: Analysis, force: readonly string[]): Analysis {
  if (sameNames(force, analysis.force)) return analysis;
  return { ...analysis, force, detection: detectAttention(analysis.model, analysis.scopes, { force, rules: analysis.rules }) };
}

/**
 * The analysis as detection with `names` forced would make it: the same one where forcing them changes no verdict
 * (every node it forced is among them, no node it refused as forcible is), else detection again with them.
 */
export function forcedAs(analysis: Analysis, names: readonly string[]): Analysis {
  const d = analysis.detection;
  const forced = [...d.sites, ...d.fused, ...d.calls.map((c) => c.inner)].filter((s) => s.forced).map(siteNodeLabel);
  const forcible = d.skipped.filter((k) => k.forcible).map((k) => k.node);
  const alike = forced.every((n) => names.includes(n)) && !forcible.some((n) => names.includes(n));
  return alike ? analysis : withForce(analysis, names);
}

/** The same names, in any order. */
export const sameNames = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && a.every((x) => b.includes(x));
