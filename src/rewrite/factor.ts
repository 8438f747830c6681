/**
 * The factor c of a row from its n, by the preset's formula (see policy/factor.ts), as graph ops. s, n and ln n are
 * float tensors in whatever broadcast layout the site needs ([H,1,1] s against [Tq,1] n, [1,H,1,1] against
 * [B,1,S,1], ...); ln n is passed in so a shared computation of it is reused.
 */
import { DataType } from '../io/onnx';
import { Preset } from '../policy/factor';
import { Builder } from './builder';

export function presetFactor(b: Builder, preset: Preset, s: string, n: string, ln: string): string {
  const one = (): string => b.constant('one', DataType.FLOAT, [], [1]);
  if (preset.kind === 'llama4') {
    const steps = b.op('Floor', [b.op('Div', [n, b.constant('floor_scale', DataType.FLOAT, [], [preset.floorScale])], {}, 'n_over_floor')], {}, 'n_floor');
    const lnSteps = b.op('Log', [b.op('Add', [steps, one()], {}, 'n_floor_1')], {}, 'ln_floor');
    return b.op('Add', [b.op('Mul', [s, lnSteps], {}, 'temperature'), one()], {}, 'factor');
  }
  if (preset.kind === 'slope') {
    // ln(max(n, L) / L), not max(0, ln n − ln L): L / L is exactly 1 and ln 1 exactly 0, so every row with n ≤ L
    // gets a factor of exactly 1, where a difference of two rounded logarithms could leave an ulp.
    const L = b.constant('train_len', DataType.FLOAT, [], [preset.trainLen]);
    const ratio = b.op('Div', [b.op('Max', [n, L], {}, 'n_at_least_L'), L], {}, 'n_over_L');
    const lnRatio = b.op('Log', [ratio], {}, 'ln_n_over_L');
    return b.op('Add', [b.op('Mul', [s, lnRatio], {}, 's_ln_n_over_L'), one()], {}, 'factor');
  }
  if (preset.kind === 'none') throw new Error('the none preset has no factor');
  const plain = preset.kind === 'ssmax' && preset.b === undefined;
  const scaled = b.op('Mul', [s, ln], {}, plain ? 'factor' : 's_ln_n');
  if (preset.kind === 'qwen-logn') return b.op('Max', [scaled, one()], {}, 'factor');
  if (preset.b !== undefined) return b.op('Add', [scaled, b.constant('b', DataType.FLOAT, [], [preset.b])], {}, 'factor');
  return scaled;
}
