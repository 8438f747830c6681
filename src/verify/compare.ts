/** Per-output error statistics, Polygraphy style. */
import { Outputs } from './run';

export interface OutputStats {
  name: string;
  maxAbs: number;
  meanAbs: number;
  maxRel: number;
  finite: boolean;
}

export function compareOutputs(actual: Outputs, expected: Outputs): OutputStats[] {
  return Object.keys(expected).map((name) => {
    const a = actual[name]?.data;
    const e = expected[name].data;
    if (!a || a.length !== e.length) return { name, maxAbs: Infinity, meanAbs: Infinity, maxRel: Infinity, finite: false };
    let maxAbs = 0, sum = 0, maxRel = 0, finite = true;
    for (let i = 0; i < e.length; i++) {
      if (!Number.isFinite(a[i])) finite = false;
      const d = Math.abs(a[i] - e[i]);
      if (Number.isNaN(d)) maxAbs = NaN;
      else if (d > maxAbs) maxAbs = d;
      sum += d;
      const rel = d / Math.max(Math.abs(e[i]), 1e-6);
      if (rel > maxRel) maxRel = rel;
    }
    return { name, maxAbs, meanAbs: e.length ? sum / e.length : 0, maxRel, finite };
  });
}

export function allFinite(outputs: Outputs): boolean {
  return Object.values(outputs).every((o) => o.data.every(Number.isFinite));
}
