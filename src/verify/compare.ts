/**
 * Per-output error statistics, Polygraphy style. An element matches when |a − e| ≤ atol or |a − e| ≤ rtol·|e|;
 * the report gives the largest absolute and relative errors (each alone the smallest tolerance that passes),
 * the mean absolute error, and the smallest atol (with the given rtol) and rtol (with the given atol) that pass.
 */
import { Outputs } from './run';

export interface Tolerance {
  atol: number;
  rtol: number;
}

export interface OutputStats {
  name: string;
  dims: number[];
  maxAbs: number;
  meanAbs: number;
  maxRel: number;
  /** Largest finite |expected|: the output's scale. */
  scale: number;
  /** Smallest atol that passes with the given rtol. */
  neededAtol: number;
  /** Smallest rtol that passes with the given atol. */
  neededRtol: number;
  /** Elements outside the tolerance. */
  mismatches: number;
  /** NaN or ±Inf in the actual output where the expected value is finite. */
  newNonFinite: number;
  /** Largest |a − e| over the elements where both are finite: a difference that is a number. */
  maxAbsFinite: number;
  /** NaN or ±Inf in the expected (original) output: elements where equality says little. */
  expectedNonFinite: number;
  passed: boolean;
  /** Set when the output is missing or has another shape. */
  error?: string;
}

export function compareOutputs(actual: Outputs, expected: Outputs, tol: Tolerance = { atol: 1e-5, rtol: 1e-5 }): OutputStats[] {
  return Object.keys(expected).map((name) => compareOne(name, actual[name], expected[name], tol));
}

function compareOne(name: string, a: Outputs[string] | undefined, e: Outputs[string], tol: Tolerance): OutputStats {
  const base = {
    name, dims: e.dims, maxAbs: Infinity, meanAbs: Infinity, maxRel: Infinity, scale: 0, neededAtol: Infinity, neededRtol: Infinity,
    newNonFinite: 0, maxAbsFinite: 0, expectedNonFinite: 0, passed: false,
  };
  if (!a) return { ...base, mismatches: e.data.length, error: 'missing in the actual outputs' };
  if (a.dims.join() !== e.dims.join()) return { ...base, mismatches: e.data.length, error: `shape [${a.dims.join(', ')}] instead of [${e.dims.join(', ')}]` };
  let maxAbs = 0, sum = 0, maxRel = 0, neededAtol = 0, neededRtol = 0, mismatches = 0, newNonFinite = 0, scale = 0, finite = 0;
  let expectedNonFinite = 0;
  for (let i = 0; i < e.data.length; i++) {
    const x = a.data[i], y = e.data[i];
    if (!Number.isFinite(y)) expectedNonFinite++;
    else if (Math.abs(y) > scale) scale = Math.abs(y);
    if (x === y || (Number.isNaN(x) && Number.isNaN(y))) continue;
    if (!Number.isFinite(x) || !Number.isFinite(y)) {
      if (Number.isFinite(y)) newNonFinite++;
      mismatches++;
      maxAbs = maxRel = neededAtol = neededRtol = Infinity;
      continue;
    }
    const d = Math.abs(x - y);
    const rel = y === 0 ? Infinity : d / Math.abs(y);
    sum += d;
    if (d > maxAbs) maxAbs = d;
    if (d > finite) finite = d;
    if (rel > maxRel) maxRel = rel;
    if (rel > tol.rtol && d > neededAtol) neededAtol = d;
    if (d > tol.atol && rel > neededRtol) neededRtol = rel;
    if (d > tol.atol && rel > tol.rtol) mismatches++;
  }
  return {
    name, dims: e.dims, maxAbs, meanAbs: maxAbs === Infinity ? Infinity : e.data.length ? sum / e.data.length : 0, maxRel, scale, neededAtol, neededRtol,
    mismatches, newNonFinite, maxAbsFinite: finite, expectedNonFinite, passed: mismatches === 0,
  };
}
