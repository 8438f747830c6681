/**
 * Applying an fp32 factor to a tensor of any float type without losing precision: fp16 and bf16 tensors are
 * multiplied in fp32 and rounded once on the way back (a factor rounded to fp16 first would add a second
 * rounding, and onnxruntime's CPU provider has no bf16 Mul at all); doubles get the factor as a double.
 */
import { DataType } from '../io/onnx';
import { Builder } from './builder';
import { PART } from '../identity';

export interface Applied {
  output: string;
  /** Element type the factor is multiplied in. */
  factorType: number;
  /** Name of the Mul node that applies the factor (what verification resets to 1). */
  apply: string;
}

/** `Mul(x, factor)` in x's precision, the Mul named `<prefix>apply` (identity.ts); `factor` is fp32. */
export function applyFactor(b: Builder, x: string, factor: string, xType: number | undefined, opset: number): Applied {
  const mul = (lhs: string, rhs: string): { output: string; apply: string } => {
    const output = b.op('Mul', [lhs, rhs], {}, PART.apply);
    return { output, apply: b.last!.name };
  };
  if (xType === DataType.FLOAT16 || xType === DataType.BFLOAT16) {
    const wide = b.op('Cast', [x], { to: DataType.FLOAT }, PART.applyIn);
    const m = mul(wide, factor);
    return { output: b.op('Cast', [m.output], { to: xType }, PART.applyOut), factorType: DataType.FLOAT, apply: m.apply };
  }
  if (xType === DataType.DOUBLE) {
    return { ...mul(x, b.op('Cast', [factor], { to: DataType.DOUBLE }, 'factor_cast')), factorType: DataType.DOUBLE };
  }
  if (xType === undefined && opset >= 15) {
    // The graph does not declare the type: match it at run time.
    return { ...mul(x, b.op('CastLike', [factor, x], {}, 'factor_cast')), factorType: DataType.FLOAT };
  }
  return { ...mul(x, factor), factorType: DataType.FLOAT };
}
