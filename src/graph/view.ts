/**
 * What the op table, the shape rules and the ancestry queries read of a graph, as interfaces: Graph has them, and
 * it is built on those modules, which so need not import it.
 */
import type { NodeProto, TensorProto } from '../io/onnx';
import type { ConstTensor } from './tensor';

/**
 * A tensor's constant value, where the graph knows it.
 * @internal
 */
export interface ConstantReader {
  constValue(name: string): ConstTensor | null;
}

/**
 * Who produces each name, and which names are inputs, initializers and constants: what an ancestry walk asks.
 * @internal
 */
export interface AncestryReader {
  readonly producer: ReadonlyMap<string, NodeProto>;
  readonly initializers: ReadonlyMap<string, TensorProto>;
  readonly inputs: ReadonlySet<string>;
  isConstant(name: string): boolean;
  /** For a call of a model-local function: the arguments output `output`'s values are computed from (undefined: all it reads). */
  valueReads?(node: NodeProto, output: string): string[] | undefined;
}

/** @internal */
export type ValueReads = (node: NodeProto, output: string) => string[] | undefined;
