/**
 * The attention statistic per row (largest probability or entropy, read by verification's row-max outputs over
 * every row), binned by the row's n per group: the whole model, a layer, or a head of a layer. A window "n ≈ X"
 * is the rows with 3X/4 < n ≤ X: the last quarter, as verification's sharpness check reads it.
 */
import { OutputTensor } from '../verify/run';

export type Granularity = 'global' | 'per-layer' | 'per-head';

/** How a site's rows and heads are laid out in its row statistics [..., rows]. */
export interface SiteLayout {
  layer: number;
  /** Row i of Tq rows sees Tk − Tq + i + 1 keys (causal) or all Tk (keys). */
  rows: 'causal' | 'keys';
  /** Heads and the axis they are on in the statistic's dims (for per-head groups). */
  heads?: number;
  headAxis?: number;
}

/** The group of a layer's head: `all`, `L3`, `L3 h1`. */
export function groupOf(granularity: Granularity, layer: number, head: number): string {
  if (granularity === 'global') return 'all';
  return granularity === 'per-layer' ? `L${layer}` : `L${layer} h${head}`;
}

/** The rows of a window n ≈ X. */
export function windowOf(x: number): { above: number; upTo: number } {
  return { above: Math.floor((3 * x) / 4), upTo: x };
}

type Bins = Map<number, { sum: number; count: number }>;

/** The mean over the rows of every group of bins in the window n ≈ x; NaN without any. */
function windowMean(groups: Iterable<Bins>, x: number): number {
  const { above, upTo } = windowOf(x);
  let sum = 0, count = 0;
  for (const bins of groups) {
    for (const [n, b] of bins) {
      if (n > above && n <= upTo) {
        sum += b.sum;
        count += b.count;
      }
    }
  }
  return count ? sum / count : NaN;
}

export class RowStats {
  /** group → n → sum and count of the statistic over rows with that n. */
  private readonly bins = new Map<string, Bins>();

  /** Adds every row of one site's statistics, over `keys` keys (the run's past + sequence, or as the site reports). */
  add(t: OutputTensor, site: SiteLayout, keys: number, granularity: Granularity): void {
    const rows = t.dims.length ? t.dims[t.dims.length - 1] : 1;
    if (rows === 0 || t.data.length === 0) return;
    const stride = site.headAxis === undefined ? 0 : t.dims.slice(site.headAxis + 1).reduce((a, b) => a * b, 1);
    for (let i = 0; i < t.data.length; i++) {
      const r = i % rows;
      const n = site.rows === 'keys' ? keys : keys - rows + r + 1;
      const head = stride && site.heads ? Math.floor(i / stride) % site.heads : 0;
      this.put(groupOf(granularity, site.layer, head), n, t.data[i]);
    }
  }

  /** The mean over the rows of `group` in the window n ≈ x; NaN without any. */
  mean(group: string, x: number): number {
    return windowMean([this.bins.get(group) ?? new Map()], x);
  }

  /** The mean over every group's rows in the window (the whole model's curve). */
  pooled(x: number): number {
    return windowMean(this.bins.values(), x);
  }

  groups(): string[] {
    return [...this.bins.keys()];
  }

  private put(group: string, n: number, v: number): void {
    let bins = this.bins.get(group);
    if (!bins) this.bins.set(group, bins = new Map());
    const b = bins.get(n);
    if (b) {
      b.sum += v;
      b.count++;
    } else bins.set(n, { sum: v, count: 1 });
  }
}
