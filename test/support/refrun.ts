/** Running a fixture model against its reference file (fixtures/ms_attention, fixtures/onnx_attention). */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { readModel } from '../../src/io/model-file';
import { ModelProto } from '../../src/io/onnx';
import { patchModel } from '../../src/rewrite/patch';
import { Outputs, Runner } from '../../src/verify/run';
import { withUnitFactor } from '../../src/verify/verify';
import { decode, feedsOf, loadRef, RefCase } from './ref';

export async function outputsOf(m: ModelProto, c: RefCase): Promise<Outputs> {
  const runner = await Runner.fromModel(m, 'test');
  try {
    return await runner.run(feedsOf(c));
  } finally {
    await runner.release();
  }
}

/** Runs of one model share its onnxruntime session, which costs more than the runs of a small model. */
export class Sessions {
  private readonly runners = new Map<ModelProto, Promise<Runner>>();

  async outputs(m: ModelProto, c: RefCase): Promise<Outputs> {
    let runner = this.runners.get(m);
    if (!runner) {
      runner = Runner.fromModel(m, 'test');
      this.runners.set(m, runner);
    }
    return (await runner).run(feedsOf(c));
  }

  async release(): Promise<void> {
    for (const runner of this.runners.values()) await (await runner).release();
    this.runners.clear();
  }
}

/** Largest |got − want| over the case's expected outputs (equal infinities count as equal). */
export function refError(got: Outputs, c: RefCase): number {
  let worst = 0;
  for (const [name, t] of Object.entries(c.outputs)) {
    const want = decode(t);
    const a = got[name].data;
    // Integer outputs (lengths) count their differences too: Number() also reads int64 values.
    const b = want.type === 'float16' ? Float32Array.from(want.data as Uint16Array, decodeHalf) : (want.data as ArrayLike<number | bigint>);
    assert.equal(a.length, b.length, `${name}: ${a.length} values, expected ${b.length}`);
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) worst = Math.max(worst, Math.abs(Number(a[i]) - Number(b[i])));
  }
  return worst;
}

/** Largest difference between two runs' outputs. */
export function runsDiffer(a: Outputs, b: Outputs, names: string[]): number {
  let m = 0;
  for (const n of names) for (let i = 0; i < a[n].data.length; i++) if (a[n].data[i] !== b[n].data[i]) m = Math.max(m, Math.abs(a[n].data[i] - b[n].data[i]));
  return m;
}

function decodeHalf(h: number): number {
  const exp = (h >> 10) & 0x1f, frac = h & 0x3ff, sign = h & 0x8000 ? -1 : 1;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return exp === 0 ? sign * 2 ** -14 * (frac / 1024) : sign * 2 ** (exp - 15) * (1 + frac / 1024);
}

export const scaleOf = (s: number | number[]) => (Array.isArray(s) ? { s } : { s });

/**
 * Every case of a fixture against its reference: plain cases run the original on onnxruntime (unless `cpuCannot`:
 * its CPU kernel does not run it) and the patched model with its factor at 1, both against the reference and each
 * other; SSMax cases run the patched model with the case's s. Returns one line of errors per case.
 */
export async function checkFixture(dir: string, name: string, kind: string, options: { cpuCannot?: boolean; tol: number }): Promise<string> {
  const original = readModel(path.join(dir, `${name}.onnx`));
  const errors: string[] = [];
  for (const c of loadRef(name, dir).cases) {
    const label = `${c.name}${c.patch ? ` s=${JSON.stringify(c.patch.s)}` : ''}`;
    if (!c.patch) {
      const unit = await outputsOf(withUnitFactor(patchModel(original, { s: 0.45 }).model), c);
      const e = refError(unit, c);
      assert.ok(e < options.tol, `${label}: the expansion with factor 1 is ${e} from the operator's reference`);
      if (!options.cpuCannot) {
        const plain = await outputsOf(original, c);
        assert.ok(refError(plain, c) < options.tol, `${label}: onnxruntime's kernel is ${refError(plain, c)} from the reference: the reference is wrong`);
        const d = runsDiffer(unit, plain, Object.keys(c.outputs));
        assert.ok(d < options.tol, `${label}: factor-1 parity with the original node: ${d}`);
      }
      errors.push(`${label} factor 1: ${e.toExponential(1)}`);
      continue;
    }
    const { model, report } = patchModel(original, scaleOf(c.patch.s as number | number[]));
    assert.equal(report.sites[0].kind, kind);
    assert.match(report.sites[0].expanded ?? '', /expanded into its definition/);
    const e = refError(await outputsOf(model, c), c);
    assert.ok(e < options.tol, `${label}: patched output is ${e} from the SSMax reference (n ${report.sites[0].n}: ${report.sites[0].nReason})`);
    errors.push(`${label}: ${e.toExponential(1)}`);
  }
  return `${name}: max abs error vs reference: ${errors.join('; ')}`;
}
