/**
 * Audio inputs: a float waveform [B, samples] (or [B, 1, samples]) that a stack of strided 1-D convolutions turns
 * into the frames attention runs over (wav2vec2's and HuBERT's feature extractor: 400 samples per frame, one frame
 * every 320). Runs are planned in frames; the waveform gets the fewest samples that make exactly that many frames.
 * Images whose width sets the tokens (PaddleOCR's recogniser: [B, 3, 48, W]) are planned the same way along W.
 */
import { Graph } from '../graph/graph';
import { attrInt, attrInts, attrString } from '../graph/node';
import { NodeProto, toNumber } from '../io/onnx';

/** One convolution along the sample axis: kernel, stride, dilation and the padding of both ends together. */
export interface ConvStep { kernel: number; stride: number; dilation: number; pad: number }

/** Where the walk from the waveform to its convolutions stops: attention or a projection has begun. */
const STOP = new Set(['MatMul', 'Gemm', 'Softmax', 'Attention', 'MultiHeadAttention', 'LSTM', 'GRU', 'RNN']);

/**
 * The convolutions the input reaches before any MatMul, in graph order, each with its geometry along the samples
 * (`axis` 'samples': 1-D convolutions of a waveform) or along the width of an image (`axis` 'width': the last axis
 * of 2-D convolutions and average or max pools, as a text recogniser's tokens follow the image width); empty when it
 * reaches none or one whose geometry the graph does not tell.
 */
export function convStack(graph: Graph, input: string, axis: 'samples' | 'width' | 'height' = 'samples'): ConvStep[] {
  const seen = new Set<string>([input]);
  const convs = new Set<NodeProto>();
  const queue = [input];
  const steps = axis === 'samples' ? ['Conv'] : WINDOW_STEPS;
  while (queue.length) {
    const name = queue.shift()!;
    for (const node of graph.consumersOf(name)) {
      if (STOP.has(node.opType)) continue;
      if (steps.includes(node.opType) && node.input[0] === name) convs.add(node);
      for (const out of node.output) {
        if (out && !seen.has(out)) {
          seen.add(out);
          queue.push(out);
        }
      }
    }
  }
  const ordered = graph.nodes.filter((n) => convs.has(n));
  const found = ordered.map((n) => (axis === 'samples' ? convStep(graph, n) : imageStep(graph, n, axis === 'width' ? 1 : 0)));
  return found.every((s): s is ConvStep => s !== undefined) ? found : [];
}

function convStep(graph: Graph, node: NodeProto): ConvStep | undefined {
  const weight = graph.initializers.get(node.input[1]);
  const kernel = attrInts(node, 'kernel_shape')?.[0] ?? (weight && weight.dims.length === 3 ? toNumber(weight.dims[2]) : undefined);
  const rank = attrInts(node, 'kernel_shape')?.length ?? weight?.dims.length;
  // Only 1-D convolutions run along the samples; auto_pad makes the output length depend on more than this.
  const autoPad = attrString(node, 'auto_pad') ?? '';
  if (kernel === undefined || (rank !== undefined && rank !== 1 && rank !== 3) || (autoPad !== '' && autoPad !== 'NOTSET')) return undefined;
  const pads = attrInts(node, 'pads') ?? [0, 0];
  return { kernel, stride: attrInts(node, 'strides')?.[0] ?? 1, dilation: attrInts(node, 'dilations')?.[0] ?? 1, pad: pads[0] + (pads[1] ?? 0) };
}

/** The ops that change an image's side by a window: convolutions and pools (global pools make 1 × 1 and end a branch). */
const WINDOW_STEPS = ['Conv', 'AveragePool', 'MaxPool'];

/** A 2-D convolution's or pool's geometry along an image axis (0 the height, 1 the width, of its kernel, strides and dilations). */
function imageStep(graph: Graph, node: NodeProto, axis: 0 | 1): ConvStep | undefined {
  const weight = node.opType === 'Conv' ? graph.initializers.get(node.input[1]) : undefined;
  const kernel = attrInts(node, 'kernel_shape')?.[axis] ?? (weight && weight.dims.length === 4 ? toNumber(weight.dims[2 + axis]) : undefined);
  const autoPad = attrString(node, 'auto_pad') ?? '';
  const rank = attrInts(node, 'kernel_shape')?.length ?? weight?.dims.length;
  if (kernel === undefined || (rank !== 2 && rank !== 4) || (autoPad !== '' && autoPad !== 'NOTSET') || attrInt(node, 'ceil_mode')) return undefined;
  const pads = attrInts(node, 'pads') ?? [0, 0, 0, 0];
  return { kernel, stride: attrInts(node, 'strides')?.[axis] ?? 1, dilation: attrInts(node, 'dilations')?.[axis] ?? 1, pad: (pads[axis] ?? 0) + (pads[axis + 2] ?? 0) };
}

/** The fewest samples the stack turns into `frames` frames (each step inverted: in = (out − 1)·stride + dilation·(kernel − 1) + 1 − pad). */
export function samplesFor(stack: ConvStep[], frames: number): number {
  let n = Math.max(1, frames);
  for (const s of [...stack].reverse()) n = Math.max(1, (n - 1) * s.stride + s.dilation * (s.kernel - 1) + 1 - s.pad);
  return n;
}

/** The length a stack makes of `n` (each step: out = ⌊(n + pad − dilation·(kernel − 1) − 1) / stride⌋ + 1). */
export function framesOf(stack: ConvStep[], n: number): number {
  for (const s of stack) n = Math.floor((n + s.pad - s.dilation * (s.kernel - 1) - 1) / s.stride) + 1;
  return n;
}

/** How the report says it: `400 + 320·(frames − 1) samples`. */
export function describeStack(stack: ConvStep[], axis: 'samples' | 'width' = 'samples'): string {
  const one = samplesFor(stack, 1), step = samplesFor(stack, 2) - one;
  if (axis === 'width') return `an image width: ${stack.length} convolution(s) and pool(s) make one token of ${one} columns and one more every ${step}; runs are sized in tokens`;
  return `a waveform: ${stack.length} strided convolution(s) make one frame of ${one} samples and one more every ${step}; runs are sized in frames`;
}
