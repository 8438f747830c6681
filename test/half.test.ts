/** fp16 and bf16 conversions round to nearest, ties to even, everywhere the tool writes or predicts a half value. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { bfloat16ToNumber, float16ToNumber, float32ToBfloat16Bits, float32ToFloat16Bits, makeTensor, readTensor } from '../src/graph/tensor';
import { DataType } from '../src/io/onnx';

describe('half-precision rounding', () => {
  it('fp16: every finite value round-trips, and every midpoint goes to the even neighbour', () => {
    for (let h = 0; h < 0x7c00; h++) {
      const x = float16ToNumber(h);
      assert.equal(float32ToFloat16Bits(x), h);
      assert.equal(float32ToFloat16Bits(-x), h | 0x8000);
      const mid = (x + float16ToNumber(h + 1)) / 2;
      if (h + 1 < 0x7c00 && Math.fround(mid) === mid) assert.equal(float32ToFloat16Bits(mid), h & 1 ? h + 1 : h, `tie above ${h}`);
    }
  });

  it('fp16: overflow to infinity at 65520, underflow below half the smallest subnormal, NaN stays NaN', () => {
    assert.equal(float32ToFloat16Bits(65519), 0x7bff);
    assert.equal(float32ToFloat16Bits(65520), 0x7c00);
    assert.equal(float32ToFloat16Bits(2 ** -25), 0);
    assert.equal(float32ToFloat16Bits(2 ** -25 * 1.001), 1);
    assert.ok(Number.isNaN(float16ToNumber(float32ToFloat16Bits(NaN))));
  });

  it('bf16: ties to even, and makeTensor writes what readTensor reads back', () => {
    assert.equal(bfloat16ToNumber(float32ToBfloat16Bits(1 + 2 ** -8)), 1);
    assert.equal(bfloat16ToNumber(float32ToBfloat16Bits(1 + 3 * 2 ** -8)), 1 + 2 ** -6);
    assert.equal(bfloat16ToNumber(float32ToBfloat16Bits(Math.PI)), 3.140625);
    const t = makeTensor('x', DataType.BFLOAT16, [3], [Math.PI, -1 - 3 * 2 ** -8, 0.1]);
    assert.deepEqual(readTensor(t)!.values, [3.140625, -(1 + 2 ** -6), bfloat16ToNumber(float32ToBfloat16Bits(0.1))]);
  });
});
