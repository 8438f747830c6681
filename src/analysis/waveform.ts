/**
 * Audio inputs: a float waveform [B, samples] (or [B, 1, samples]) that a stack of strided 1-D convolutions turns
 * into the frames attention runs over (wav2vec2's and HuBERT's feature extractor: 400 samples per frame, one frame
 * every 320). Runs are planned in frames; the waveform gets the fewest samples that make exactly that many frames.
 */
import { Graph } from '../graph/graph';
import { attrInts, attrString } from '../graph/node';
import { NodeProto, toNumber } from '../io/onnx';

/** One convolution along the sample axis: kernel, stride, dilation and the padding of both ends together. */
export interface ConvStep { kernel: number; stride: number; dilation: number; pad: number }

/** Where the walk from the waveform to its convolutions stops: attention or a projection has begun. */
const STOP = new Set(['MatMul', 'Gemm', 'Softmax', 'Attention', 'MultiHeadAttention', 'LSTM', 'GRU', 'RNN']);

/**
 * The 1-D convolutions the input reaches before any MatMul, in graph order, each with its geometry along the
 * samples; empty when it reaches none (not a waveform) or one whose geometry the graph does not tell.
 */
export function convStack(graph: Graph, input: string): ConvStep[] {
  const seen = new Set<string>([input]);
  const convs = new Set<NodeProto>();
  const queue = [input];
  while (queue.length) {
    const name = queue.shift()!;
    for (const node of graph.consumersOf(name)) {
      if (STOP.has(node.opType)) continue;
      if (node.opType === 'Conv' && node.input[0] === name) convs.add(node);
      for (const out of node.output) {
        if (out && !seen.has(out)) {
          seen.add(out);
          queue.push(out);
        }
      }
    }
  }
  const ordered = graph.nodes.filter((n) => convs.has(n));
  const steps = ordered.map((n) => convStep(graph, n));
  return steps.every((s): s is ConvStep => s !== undefined) ? steps : [];
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

/** The fewest samples the stack turns into `frames` frames (each step inverted: in = (out − 1)·stride + dilation·(kernel − 1) + 1 − pad). */
export function samplesFor(stack: ConvStep[], frames: number): number {
  let n = Math.max(1, frames);
  for (const s of [...stack].reverse()) n = Math.max(1, (n - 1) * s.stride + s.dilation * (s.kernel - 1) + 1 - s.pad);
  return n;
}

/** How the report says it: `400 + 320·(frames − 1) samples`. */
export function describeStack(stack: ConvStep[]): string {
  const one = samplesFor(stack, 1), step = samplesFor(stack, 2) - one;
  return `a waveform: ${stack.length} strided convolution(s) make one frame of ${one} samples and one more every ${step}; runs are sized in frames`;
}
