/**
 * What detection finds, as every part of it names it: a Softmax site, a fused operator's site, a call of a function
 * that holds attention, and the rules that find them (a rule's context, what it finds, where it stops). The rules
 * (rules.ts, softmax.ts, fused.ts) and the search over a model's graphs (find-attention.ts) import these; this file
 * imports none of them (only the graph's nodeLabel).
 */
import { nodeLabel } from '../graph/graph';
import type { AxisTerm, FusedOp, HeadInfo, MaskVerdict, NPlan, QueryPlan } from '../graph/attention-ops';
import type { Scope } from '../graph/scopes';
import type { FunctionProto, ModelProto, NodeProto } from '../io/onnx';
import type { Step } from './trace';

export interface AttentionSite {
  /** 0-based, in graph order within its scope. */
  layer: number;
  /** The graph the site is in (`main`, a subgraph path, or a function). */
  scope: string;
  /** The detection rule that matched (rules.ts). */
  rule: string;
  softmax: NodeProto; qkMatMul: NodeProto; valueMatMul: NodeProto;
  /** The content logits the factor multiplies: after any 1/√d scaling and Cast, before any mask. */
  logits: string;
  /** The node on the path that reads `logits`, and at which input. */
  consumer: Step;
  /** The steps from `consumer` up to and including the Softmax: where masks and biases are applied. */
  afterLogits: Step[];
  logitsRank?: number;
  /** ONNX element type of the logits, when known. */
  logitsType?: number;
  heads: HeadInfo; mask: MaskVerdict;
  /** Set when the site already carries an SSMax factor from an earlier run. */
  patchedBy?: NodeProto;
  /** Why the site was refused before --force-site accepted it. */
  forced?: string;
  /**
   * Opset < 13 Softmax on logits of unknown rank: it normalises the axes from this one on, flattened together, so n
   * is the size of that group, read at run time (Tk for [Tq, Tk] logits).
   */
  groupAxis?: number;
}

export interface FusedSite {
  /** 0-based, in graph order within its scope (shared with the Softmax sites). */
  layer: number;
  scope: string;
  /** The detection rule that matched (rules.ts). */
  rule: string;
  node: NodeProto; heads: HeadInfo; mask: MaskVerdict;
  /**
   * The operator's spec id (graph/attention-ops).
   * @internal
   */
  op: FusedOp;
  /**
   * Inputs by role in the operator's spec (graph/attention-ops): where the query is.
   * @internal
   */
  query: QueryPlan;
  /**
   * How n is read from the operator's inputs, by role.
   * @internal
   */
  n: NPlan;
  /** The query length S: a dimension of an input. */
  /** @internal */
  queryLength: AxisTerm;
  /** Element type of the query (or weights), when known. */
  queryType?: number;
  /** Why SSMax on the query is not exactly SSMax on the kernel's logits; set sites are refused unless forced. */
  deviation?: string;
  /** Set when a deviation was accepted with --force-site. */
  forced?: boolean;
  /** The inserted node that applies an earlier run's factor, when the site is already patched. */
  patchedBy?: NodeProto;
  /**
   * Why the factor cannot go on the operator's inputs, so the node is expanded into its definition and the factor
   * put on the logits there (ONNX Attention: softcap, a qk_matmul_output that shows the logits before the factor).
   */
  expand?: string;
}

export type FusedMatch = Omit<FusedSite, 'layer' | 'scope' | 'rule'>;

/** A call of a model-local function whose body holds attention (`inner`): the factor's s comes in through a new input. */
export interface CallSite { layer: number; scope: string; call: NodeProto; fn: FunctionProto; inner: AttentionSite | FusedSite }

/** The label of a site's own node: its Softmax, or its fused operator. */
export const siteNodeLabel = (s: AttentionSite | FusedSite): string => nodeLabel('softmax' in s ? s.softmax : s.node);

/** `forced`: the user accepts this node's refusal (--force-site). */
export interface RuleContext { model: ModelProto; scope: Scope; forced: boolean }

/** The site as detection reports it, before layers and scopes are numbered. */
export type Found =
  | { kind: 'softmax'; site: Omit<AttentionSite, 'layer' | 'scope' | 'rule'> }
  | { kind: 'fused'; site: FusedMatch }
  | { kind: 'call'; node: NodeProto; fn: FunctionProto };

/** `steps`: checks passed before the stop; `attention`: refused attention, not some other Softmax. */
export interface Stop { at: NodeProto; reason: string; steps: number; attention?: boolean; forcible?: boolean }

/** `name`: stable, a row of the rule table of docs/layout.md; `applies`: a cheap test on the node; `match`: the site or a stop. */
export interface Rule { name: string; applies(node: NodeProto, ctx: RuleContext): boolean; match(ctx: RuleContext, node: NodeProto): Found | Stop }
