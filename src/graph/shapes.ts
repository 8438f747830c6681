/**
 * Shapes and element types of a graph's tensors, known without running it: symbolic dims (polynomials over the
 * dynamic dims, see poly.ts) propagated in topological order by the rules of ops.ts, from declared shapes,
 * initializers and constants. Ranks come from the same pass (the length of a shape). Two sites whose query length
 * and key length have the same expression see the same n at run time, so they can share one ln(n) computation.
 * A dim no rule determines gets a fresh symbol named after its tensor and axis: still exact, never shared by
 * accident.
 */
import { DataType, NodeProto, toNumber } from '../io/onnx';
import { Graph } from './graph';
import { OpInfo, opInfo } from './ops';
import { DimOverflow, num, Poly, sym } from './poly';
import { OutSym, Sym } from './shape-rules';
import { topoOrder } from './toposort';

const INTEGERS = new Set<number>([
  DataType.INT64, DataType.INT32, DataType.INT16, DataType.INT8, DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64,
]);

/**
 * The outputs of a call of a model-local function, from its body read through the call (scopes.ts); undefined when
 * the node calls none.
 * @internal
 */
export type CallShapes = (node: NodeProto, caller: Shapes) => { shape?: Poly[]; type?: number }[] | undefined;

/**
 * `given`: the shapes of a bound function body's inputs (undefined: unknown). `calls`: how to read the calls of
 * model-local functions. `prefix`: of the fresh symbols, so that a body's unknown dims at one call are not taken
 * for the same dims at another.
 * @internal
 */
export interface ShapeOptions { given?: ReadonlyMap<string, Poly[] | undefined>; calls?: CallShapes; prefix?: string }

/** @internal */
export class Shapes {
  private readonly syms = new Map<string, Sym>();
  private readonly types = new Map<string, number>();

  private readonly calls?: CallShapes;
  private readonly prefix: string;

  /** `outer`: the enclosing scope's pass, for the names a subgraph (or a function body bound to a call) reads from it. */
  constructor(private readonly graph: Graph, private readonly outer?: Shapes, options: ShapeOptions = {}) {
    this.calls = options.calls;
    this.prefix = options.prefix ?? '';
    for (const [name, shape] of options.given ?? []) this.syms.set(name, { shape });
    for (const v of graph.proto.input) {
      const dims = v.type?.tensorType?.shape?.dim;
      if (dims && !graph.initializers.has(v.name)) {
        this.syms.set(v.name, {
          shape: dims.map((d, i) => (d.dimParam ? sym(d.dimParam) : toNumber(d.dimValue) > 0 ? num(toNumber(d.dimValue)) : sym(`${v.name}:${i}`))),
        });
      }
    }
    for (const node of topoOrder(graph.proto)) this.visit(node);
  }

  /**
   * The graph this pass is of.
   * @internal
   */
  graphOf(): Graph {
    return this.graph;
  }

  shape(name: string): Poly[] | undefined {
    return this.get(name).shape;
  }

  rank(name: string): number | undefined {
    return this.shape(name)?.length;
  }

  /** Symbolic size of one axis (negative axes count from the end). */
  dim(name: string, axis: number): Poly | undefined {
    const s = this.shape(name);
    return s?.[axis < 0 ? s.length + axis : axis];
  }

  /** The values of a small integer tensor (a shape being built), when the pass knows them. */
  values(name: string): Poly[] | undefined {
    return this.get(name).value;
  }

  /** The ONNX element type, declared or inferred. */
  type(name: string): number | undefined {
    return this.graph.elemType(name) ?? this.types.get(name) ?? (this.graph.definesLocally(name) ? undefined : this.outer?.type(this.graph.outerName(name)));
  }

  private get(name: string): Sym {
    if (!name) return {};
    const known = this.syms.get(name);
    if (known) return known;
    if (!this.graph.definesLocally(name) && this.outer) return this.outer.get(this.graph.outerName(name));
    const producer = this.graph.producer.get(name);
    const init = producer?.opType === 'Constant' || this.graph.initializers.has(name) ? this.graph.constantTensor(name) : undefined;
    // Values only of the small integer tensors shapes are built from: weights (maybe external data) stay unread.
    const small = (t: { dims: unknown[]; dataType: number }): boolean => t.dims.length <= 1 && INTEGERS.has(t.dataType)
      && t.dims.reduce((a: number, d) => a * toNumber(d as number), 1) <= 16;
    const c = init && !small(init) ? undefined : this.graph.constValue(name);
    const dims = init ? init.dims.map(toNumber) : c?.dims;
    if (!dims) return {};
    const entry: Sym = { shape: dims.map(num) };
    if (c && small(c)) entry.value = c.values.map(num);
    this.syms.set(name, entry);
    return entry;
  }

  private visit(node: NodeProto): void {
    const called = this.calls?.(node, this);
    if (called) {
      node.output.forEach((o, i) => {
        if (!o) return;
        const shape = this.declaredOr(o, called[i]?.shape);
        this.syms.set(o, { shape: shape?.map((d, a) => d ?? sym(`${this.prefix}${o}:${a}`)) });
        if (called[i]?.type !== undefined) this.types.set(o, called[i].type!);
      });
      return;
    }
    const info = opInfo(node);
    // A Constant's shape and values are read lazily from its tensor (get), like an initializer's.
    if (node.opType !== 'Constant') this.inferShapes(node, info);
    const t = info.type;
    const inferred = t === 'bool' ? DataType.BOOL : t === 'int64' ? DataType.INT64 : t ? t(node, (n) => this.type(n), this.graph) : this.type(node.input[0]);
    const typed = info.typed ?? [0];
    node.output.forEach((o, i) => {
      if (o && inferred !== undefined && (typed === 'all' || typed.includes(i))) this.types.set(o, inferred);
    });
  }

  private inferShapes(node: NodeProto, info: OpInfo): void {
    let out: OutSym[] = [];
    try {
      out = info.shape ? info.shape(node, node.input.map((i) => this.get(i)), this.graph) : [];
    } catch (e) {
      // A dim grew too large (poly.ts): unknown, not wrong. Anything else is a bug in the rule, not an unknown shape.
      if (!(e instanceof DimOverflow)) throw e;
      out = [];
    }
    node.output.forEach((o, i) => {
      if (!o) return;
      const shape = this.declaredOr(o, out[i]?.shape);
      this.syms.set(o, { shape: shape?.map((d, a) => d ?? sym(`${this.prefix}${o}:${a}`)), value: out[i]?.value });
    });
  }

  /** The rule's shape, unless the file declares another rank; declared static dims fill what the rule left open. */
  private declaredOr(name: string, ruled: (Poly | undefined)[] | undefined): (Poly | undefined)[] | undefined {
    const dims = this.graph.valueInfo.get(name)?.type?.tensorType?.shape?.dim;
    if (!dims) return ruled;
    const declared = dims.map((d) => (toNumber(d.dimValue) > 0 ? num(toNumber(d.dimValue)) : undefined));
    if (!ruled || ruled.length !== declared.length) return declared;
    return ruled.map((d, i) => d ?? declared[i]);
  }
}
