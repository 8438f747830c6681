/**
 * The sharpness curve as a standalone SVG, written by hand: mean largest attention probability against context
 * length (log-scale x), original and patched, with L marked. The y axis is linear from 0 unless the values
 * span more than 20×, then logarithmic.
 */
import { SharpnessCurve } from './sharpness';

const W = 760, H = 460;
const M = { left: 78, right: 24, top: 56, bottom: 74 };
const COLORS = { original: '#5b6b82', patched: '#d9531e' };

export interface PlotLabels {
  title: string;
  subtitle?: string;
  caption?: string;
  /** The y axis (default: mean max attention probability) and the two series (default: original, patched). */
  yLabel?: string;
  series?: [string, string];
}

export function sharpnessSvg(curve: SharpnessCurve, labels: PlotLabels): string {
  const pts = curve.points;
  const xs = pts.map((p) => p.length);
  const values = pts.flatMap((p) => [p.original, p.patched]);
  const [x0, x1] = [Math.log(Math.min(...xs)), Math.log(Math.max(...xs))];
  const pad = (x1 - x0) * 0.04 || 0.5;
  const lo = Math.min(...values), hi = Math.max(...values);
  const yLog = hi / lo > 20;
  const yDomain = yLog ? [Math.log10(lo) - 0.1, Math.log10(hi) + 0.1] : [0, niceCeil(hi * 1.05)];
  const plotW = W - M.left - M.right, plotH = H - M.top - M.bottom;
  const px = (n: number): number => M.left + ((Math.log(n) - (x0 - pad)) / (x1 - x0 + 2 * pad)) * plotW;
  const py = (v: number): number => {
    const t = yLog ? Math.log10(v) : v;
    return M.top + plotH - ((t - yDomain[0]) / (yDomain[1] - yDomain[0])) * plotH;
  };
  const parts: string[] = [];
  parts.push(text(M.left, 26, labels.title, { size: 17, weight: 'bold' }));
  if (labels.subtitle) parts.push(text(M.left, 45, labels.subtitle, { size: 12, fill: '#555555' }));
  for (const t of yTicks(yDomain, yLog)) {
    const y = py(t);
    parts.push(`<line x1="${M.left}" y1="${r(y)}" x2="${W - M.right}" y2="${r(y)}" stroke="#e3e3e3" stroke-width="1"/>`);
    parts.push(text(M.left - 8, y + 4, formatTick(t), { size: 12, anchor: 'end' }));
  }
  for (const n of xs) {
    const x = px(n);
    parts.push(`<line x1="${r(x)}" y1="${M.top}" x2="${r(x)}" y2="${M.top + plotH}" stroke="#f0f0f0" stroke-width="1"/>`);
    parts.push(text(x, M.top + plotH + 18, String(n), { size: 12, anchor: 'middle' }));
  }
  parts.push(`<rect x="${M.left}" y="${M.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#888888" stroke-width="1"/>`);
  if (curve.trainLen >= Math.min(...xs) && curve.trainLen <= Math.max(...xs)) {
    const x = px(curve.trainLen);
    parts.push(`<line x1="${r(x)}" y1="${M.top}" x2="${r(x)}" y2="${M.top + plotH}" stroke="#333333" stroke-width="1" stroke-dasharray="5,4"/>`);
    parts.push(text(x + 6, M.top + 16, `L = ${curve.trainLen} (factor 1)`, { size: 12, fill: '#333333' }));
  }
  parts.push(series(pts.map((p) => [px(p.length), py(p.original)]), COLORS.original, 'circle'));
  parts.push(series(pts.map((p) => [px(p.length), py(p.patched)]), COLORS.patched, 'square'));
  parts.push(text(M.left + plotW / 2, H - 36, 'context length n (tokens, log scale)', { size: 13, anchor: 'middle' }));
  parts.push(`<text x="20" y="${r(M.top + plotH / 2)}" font-family="sans-serif" font-size="13" text-anchor="middle" transform="rotate(-90 20 ${r(M.top + plotH / 2)})">${escapeXml(labels.yLabel ?? 'mean max attention probability')}${yLog ? ' (log scale)' : ''}</text>`);
  parts.push(text(M.left, H - 12, labels.caption ?? `largest probability of the last quarter of the attention rows (at most ${curve.rows}), averaged over them, heads and layers (batch 1)`, { size: 11, fill: '#777777' }));
  parts.push(legend(W - M.right - 200, M.top + 12, labels.series ?? ['original (softmax)', 'patched (SSMax)']));
  return svgDocument(parts);
}

/**
 * The plot when there is no curve to draw: the title and why, so a CI job that uploads the file always has one
 * and whoever opens it reads the reason rather than a missing artifact.
 */
export function noCurveSvg(title: string, reason: string): string {
  const words = `no sharpness curve: ${reason}`.split(' ');
  const lines: string[] = [''];
  for (const w of words) {
    if (lines[lines.length - 1].length + w.length > 100) lines.push('');
    lines[lines.length - 1] += `${lines[lines.length - 1] ? ' ' : ''}${w}`;
  }
  return svgDocument([
    text(M.left, 26, title, { size: 17, weight: 'bold' }),
    ...lines.map((l, i) => text(M.left, 80 + i * 18, l, { size: 12, fill: '#555555' })),
  ]);
}

function svgDocument(parts: string[]): string {
  const background = `<rect x="0" y="0" width="${W}" height="${H}" fill="#ffffff"/>`;
  return `<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">\n${[background, ...parts].join('\n')}\n</svg>\n`;
}

function legend(x: number, y: number, names: [string, string]): string {
  const rows: [string, string, 'circle' | 'square'][] = [[names[0], COLORS.original, 'circle'], [names[1], COLORS.patched, 'square']];
  const out = [`<rect x="${x}" y="${y}" width="188" height="54" fill="#ffffff" fill-opacity="0.9" stroke="#cccccc"/>`];
  rows.forEach(([label, color, shape], i) => {
    const cy = y + 18 + i * 20;
    out.push(`<line x1="${x + 10}" y1="${cy}" x2="${x + 40}" y2="${cy}" stroke="${color}" stroke-width="2.5"/>`);
    out.push(marker(x + 25, cy, color, shape));
    out.push(text(x + 48, cy + 4, label, { size: 12 }));
  });
  return out.join('\n');
}

function series(points: [number, number][], color: string, shape: 'circle' | 'square'): string {
  const d = points.map(([x, y], i) => `${i ? 'L' : 'M'}${r(x)},${r(y)}`).join(' ');
  return [`<path d="${d}" fill="none" stroke="${color}" stroke-width="2.5" stroke-linejoin="round"/>`,
    ...points.map(([x, y]) => marker(x, y, color, shape))].join('\n');
}

function marker(x: number, y: number, color: string, shape: 'circle' | 'square'): string {
  return shape === 'circle'
    ? `<circle cx="${r(x)}" cy="${r(y)}" r="4" fill="${color}"/>`
    : `<rect x="${r(x - 4)}" y="${r(y - 4)}" width="8" height="8" fill="${color}"/>`;
}

function text(x: number, y: number, s: string, o: { size: number; anchor?: string; weight?: string; fill?: string }): string {
  return `<text x="${r(x)}" y="${r(y)}" font-family="sans-serif" font-size="${o.size}"${o.anchor ? ` text-anchor="${o.anchor}"` : ''}${o.weight ? ` font-weight="${o.weight}"` : ''} fill="${o.fill ?? '#222222'}">${escapeXml(s)}</text>`;
}

function escapeXml(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

const r = (v: number): string => (Math.round(v * 10) / 10).toString();

function niceCeil(v: number): number {
  const step = v > 0.5 ? 0.1 : v > 0.1 ? 0.05 : 10 ** Math.floor(Math.log10(v));
  return Math.ceil(v / step) * step;
}

function yTicks(domain: number[], log: boolean): number[] {
  if (log) {
    const out: number[] = [];
    for (let e = Math.ceil(domain[0]); e <= Math.floor(domain[1]); e++) for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      if (Math.log10(v) >= domain[0] && Math.log10(v) <= domain[1]) out.push(v);
    }
    return out;
  }
  const span = domain[1] - domain[0];
  const step = [0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5].find((s) => span / s <= 8) ?? 1;
  const out: number[] = [];
  for (let v = 0; v <= domain[1] + 1e-9; v += step) out.push(Math.round(v / step) * step);
  return out;
}

function formatTick(v: number): string {
  return v >= 0.01 || v === 0 ? String(Number(v.toFixed(3))) : v.toExponential(0);
}
