/**
 * The probe of a rescaled RoPE (policy/rope.ts): in every short run, the frequencies the model computes after the
 * patch's Mul against the method's own formula applied to the original constant, and for YaRN every Cos and Sin
 * against what their readers read: their value times 0.1·ln(scale) + 1, entry by entry.
 */
import { DataType } from '../io/onnx';
import { ropeFrequencies, RopeSpec, ropeText } from '../policy/rope';
import { originalTheta, ropeLabel, RopeSiteRecord } from '../rewrite/rope';
import type { Graph } from '../graph/graph';
import { fmt } from './probe';
import type { RopeWiring } from './probe-model';
import type { Outputs } from './run';

export class RopeProbe {
  private entries = 0;
  private runs = 0;
  private worst = 0;
  private readonly problems: string[] = [];
  private readonly unprobed = new Set<string>();
  private readonly expected: Map<string, { theta: number[]; mscale: number; rtol: number }>;
  /** What the rescaled sites are: `1 constant(s)`, `1 cache pair(s)`. */
  private readonly where: string;

  /** `graph`: the original's, whose constants of frequencies the patch left as they were. */
  constructor(private readonly spec: RopeSpec, sites: readonly RopeSiteRecord[], graph: Graph) {
    this.expected = new Map(sites.map((r) => {
      const next = ropeFrequencies(spec, originalTheta(r, graph));
      const half = !r.table && graph.constValue(r.constant)?.dataType === DataType.FLOAT16;
      return [ropeLabel(r), { ...next, rtol: half ? 2e-3 : 2e-6 }];
    }));
    const tables = sites.filter((r) => r.table).length;
    this.where = [[sites.length - tables, 'constant(s)'], [tables, 'cache pair(s) recomputed']].filter(([k]) => k).map(([k, what]) => `${k} ${what}`).join(' and ');
  }

  observe(wirings: readonly RopeWiring[], out: Outputs, run: string): void {
    this.runs++;
    for (const w of wirings) {
      if ('unprobed' in w) { this.unprobed.add(`${w.label}: ${w.unprobed}`); continue; }
      if ('problem' in w) { this.problems.push(`${w.label}: ${w.problem}`); continue; }
      const want = this.expected.get(w.label);
      const got = out[w.scaled];
      if (!want || !got) { this.problems.push(`${w.label}: its rescaled frequencies were not produced (${run})`); continue; }
      if (got.data.length !== want.theta.length) { this.problems.push(`${w.label}: ${got.data.length} frequencies, the constant has ${want.theta.length}`); continue; }
      got.data.forEach((x, i) => this.compare(w.label, `frequency ${i}`, x, want.theta[i], want.rtol));
      for (const p of w.pairs) {
        const before = out[p.before], after = out[p.after];
        if (!before || !after || before.data.length !== after.data.length) { this.problems.push(`${w.label}: YaRN's cos and sin were not produced (${run})`); continue; }
        before.data.forEach((x, i) => this.compare(w.label, `cos/sin entry ${i} (${run})`, after.data[i], want.mscale * x, want.rtol));
      }
    }
  }

  private compare(label: string, what: string, got: number, want: number, rtol: number): void {
    this.entries++;
    const err = Math.abs(got - want) / Math.max(Math.abs(want), 1e-30);
    this.worst = Math.max(this.worst, err);
    if (!(Math.abs(got - want) <= rtol * Math.abs(want) + 1e-7)) {
      if (this.problems.length < 3) this.problems.push(`${label} ${what}: ${fmt(got)}, ${ropeText(this.spec)} gives ${fmt(want)}`);
    }
  }

  get failure(): string | undefined {
    return this.problems[0];
  }

  get notProbed(): string[] {
    return [...this.unprobed];
  }

  /** The PASSED line's part. */
  summary(): string {
    const yarn = this.spec.method === 'yarn' ? ' and cos, sin × (0.1 ln s + 1)' : '';
    return `RoPE frequencies = ${ropeText(this.spec)}'s${yarn} at ${this.where}, ${this.entries} values in ${this.runs} run(s), max rel error ${fmt(this.worst)}`;
  }
}
