/**
 * Integer polynomials over the graph's dynamic dims (`sequence`, `past_sequence+sequence`, ...): the algebra of
 * symbolic shapes. Two dims with the same polynomial are equal at run time.
 */

/**
 * Monomial key ('' for the constant term) → integer coefficient.
 * @internal
 */
export type Poly = ReadonlyMap<string, number>;

const mono = (symbols: string[]): string => [...symbols].sort().join('*');
const split = (key: string): string[] => (key ? key.split('*') : []);

/**
 * Past these sizes a dim is left unknown (a fresh symbol: still exact, only never shared): shape arithmetic in
 * real graphs is small, and a corrupt graph must not blow up.
 */
const MAX_TERMS = 32;
const MAX_DEGREE = 12;

/** A dim past those sizes: the shape pass leaves it unknown. */
export class DimOverflow extends RangeError {
  constructor() {
    super('symbolic dim too large');
  }
}

export const num = (n: number): Poly => new Map(n === 0 ? [] : [['', n]]);
export const sym = (name: string): Poly => new Map([[name, 1]]);

export function add(a: Poly, b: Poly, sign = 1): Poly {
  if (a.size + b.size > 4 * MAX_TERMS) throw new DimOverflow();
  const out = new Map(a);
  for (const [k, c] of b) {
    const v = (out.get(k) ?? 0) + sign * c;
    if (v === 0) out.delete(k);
    else out.set(k, v);
  }
  return out;
}

export function mul(a: Poly, b: Poly): Poly {
  if (a.size * b.size > MAX_TERMS) throw new DimOverflow();
  let out: Poly = new Map();
  for (const [ka, ca] of a) {
    for (const [kb, cb] of b) {
      const symbols = [...split(ka), ...split(kb)];
      if (symbols.length > MAX_DEGREE || !Number.isSafeInteger(ca * cb)) throw new DimOverflow();
      out = add(out, new Map([[mono(symbols), ca * cb]]));
    }
  }
  return out;
}

/** a / b when b is one monomial that divides every term of a exactly; undefined otherwise. */
export function div(a: Poly, b: Poly): Poly | undefined {
  if (b.size !== 1) return undefined;
  const [[kb, cb]] = [...b];
  const out = new Map<string, number>();
  for (const [ka, ca] of a) {
    if (ca % cb !== 0) return undefined;
    const rest = split(ka);
    for (const s of split(kb)) {
      const i = rest.indexOf(s);
      if (i < 0) return undefined;
      rest.splice(i, 1);
    }
    out.set(mono(rest), ca / cb);
  }
  return out;
}

export const constantOf = (p: Poly): number | undefined => (p.size === 0 ? 0 : p.size === 1 && p.has('') ? p.get('') : undefined);

export function show(p: Poly): string {
  if (p.size === 0) return '0';
  return [...p].sort(([a], [b]) => a.localeCompare(b)).map(([k, c]) => (k === '' ? `${c}` : c === 1 ? k : `${c}*${k}`)).join('+');
}

export const product = (dims: Poly[]): Poly => dims.reduce((acc, d) => mul(acc, d), num(1));

/** Numpy broadcasting: a 1 takes the other dim; otherwise the dims must agree, and the first is kept. */
export function broadcast(shapes: Poly[][]): Poly[] {
  const rank = Math.max(...shapes.map((s) => s.length));
  const out: Poly[] = [];
  for (let i = 0; i < rank; i++) {
    const dims = shapes.map((s) => s[s.length - rank + i]).filter((d): d is Poly => d !== undefined);
    out.push(dims.find((d) => constantOf(d) !== 1) ?? num(1));
  }
  return out;
}

const BIG = 2 ** 31;

/** Length of dim[start:end] (step 1), with negative and past-the-end bounds as Slice reads them. */
export function sliceLength(dim: Poly, start: Poly, end: Poly): Poly {
  const st = constantOf(start), en = constantOf(end);
  const norm = (v: Poly, c: number | undefined): Poly => (c !== undefined && c < 0 ? add(dim, num(c)) : c !== undefined && c >= BIG ? dim : v);
  return add(norm(end, en), norm(start, st), -1);
}
