/**
 * Detection as named rules: each exporter pattern and fused operator is a rule whose `match` gives the site, or
 * the node where it stopped and why. The rules tried on a candidate make its trace; a candidate no rule matches is
 * reported with its closest rule (the one that passed most checks) and its stop. Adding a pattern means adding a
 * rule to RULES, its row in the rule table of docs/layout.md, and a test.
 */
import { nodeLabel } from '../graph/graph';
import { calledFunction } from '../graph/scopes';
import { FunctionProto, isDefaultDomain, NodeProto } from '../io/onnx';
import { fusedRules, unsupportedFused } from './fused';
import type { Found, Rule, RuleContext, Stop } from './site';
import { decomposedSoftmax, divOfExpSum, einsumQk, matmulQk, opset11Reshape } from './softmax';

export type { Found, Rule, RuleContext, Stop } from './site';

/** onnxruntime's fused Add + Softmax: the logits are inside the kernel with no query to scale. */
const biasSoftmax: Rule = {
  name: 'guard/bias-softmax',
  applies: (node) => node.opType === 'BiasSoftmax' && node.domain === 'com.microsoft',
  match: (_ctx, node) => ({ at: node, steps: 0, attention: true,
    reason: 'fused BiasSoftmax (onnxruntime-optimised Add + Softmax): not patched; patch the model before optimisation' }),
};

/** A call of a model-local function holding a Softmax (as an op or written out) or an attention operator; the body is its own scope. */
const callFunction: Rule = {
  name: 'call/function',
  applies: (node, ctx) => holdsCandidate(calledFunction(ctx.model, node)),
  match: (ctx, node) => ({ kind: 'call', node, fn: calledFunction(ctx.model, node)! }),
};

function holdsCandidate(fn: FunctionProto | undefined): boolean {
  if (!fn) return false;
  const producer = new Map(fn.node.flatMap((n) => n.output.map((o) => [o, n] as const)));
  return fn.node.some((n) => /^Softmax$|Attention$/.test(n.opType) || divOfExpSum(n, (t) => producer.get(t)));
}

/** Every rule, in the order they are tried on a node. */
export const RULES: readonly Rule[] = [matmulQk, einsumQk, opset11Reshape, decomposedSoftmax, ...fusedRules, unsupportedFused, biasSoftmax, callFunction];

export interface RuleAttempt { rule: string; matched: boolean; steps?: number; stoppedAt?: string; reason?: string }

/** `rule`: the rule that matched, or the closest one. */
export interface CandidateTrace { node: string; op: string; scope: string; rule: string; matched: boolean; attempts: RuleAttempt[] }

/** Tries the rules that apply to `node` in list order until one matches; null when none applies. */
export function runRules(rules: readonly Rule[], ctx: RuleContext, node: NodeProto): { trace: CandidateTrace; found?: Found; stop?: Stop } | null {
  const tried = rules.filter((r) => r.applies(node, ctx));
  if (tried.length === 0) return null;
  const op = isDefaultDomain(node.domain) ? node.opType : `${node.domain}.${node.opType}`;
  const trace: CandidateTrace = { node: nodeLabel(node), op, scope: ctx.scope.path, rule: '', matched: false, attempts: [] };
  let stop: Stop | undefined;
  for (const { name, match } of tried) {
    const r = match(ctx, node);
    const matched = 'kind' in r;
    trace.attempts.push(matched ? { rule: name, matched } : { rule: name, matched, steps: r.steps, stoppedAt: nodeLabel(r.at), reason: r.reason });
    if (matched) return { trace: { ...trace, rule: name, matched }, found: r };
    if (!stop || r.steps > stop.steps) [stop, trace.rule] = [r, name]; // ties go to the rule listed first
  }
  return { trace, stop };
}
