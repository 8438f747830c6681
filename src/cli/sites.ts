/**
 * What detection says about the original model, for the CLI's own needs: the refused attention sites (for JSON
 * refusals and --strict), each site's mask verdict (for warnings), and --force-site patterns expanded to names.
 */
import { Detection, SkippedSoftmax } from '../detect/find-attention';
import { InputError } from '../errors';
import { SiteCausality } from '../policy/warnings';
import { PatchedSite } from '../rewrite/patch';

export const refusedOf = (skipped: SkippedSoftmax[]): SkippedSoftmax[] => skipped.filter((k) => k.attention);

/** Each patched site's mask verdict from detection, matched by graph and layer (numbered alike in both). */
export function siteCausality(d: Detection, sites: PatchedSite[]): SiteCausality[] {
  const key = (scope: string, layer: number): string => `${scope}\u0000${layer}`;
  const verdicts = new Map([
    ...d.sites.map((s) => [key(s.scope, s.layer), s.mask] as const),
    ...d.fused.map((s) => [key(s.scope, s.layer), s.mask] as const),
    ...d.calls.map((c) => [key(c.scope, c.layer), c.inner.mask] as const),
  ]);
  return sites.flatMap((site) => {
    const v = verdicts.get(key(site.scope, site.layer));
    return v ? [{ node: site.node, causal: v.causal, reason: v.reason }] : [];
  });
}

const isPattern = (p: string): boolean => p === 'all' || /[*?]/.test(p);

/**
 * `--force-site all` forces every refused attention node, a glob (`*` any characters, `?` one) the refused nodes
 * whose names match (in `detection`, run without forcing). A glob that matches nothing is an error (probably a
 * typo); plain names pass through and are checked by patchModel. `empty` lists the patterns (`all`) that found
 * nothing to force.
 */
export function expandForceSites(patterns: string[], detection: Detection): { names: string[]; empty: string[] } {
  if (!patterns.some(isPattern)) return { names: patterns, empty: [] };
  const refusable = detection.skipped.filter((k) => k.forcible).map((k) => k.node);
  const names: string[] = [];
  const empty: string[] = [];
  for (const p of patterns) {
    if (!isPattern(p) || refusable.includes(p)) {
      names.push(p);
      continue;
    }
    const matched = p === 'all' ? refusable : refusable.filter((n) => glob(p).test(n));
    if (matched.length === 0 && p !== 'all') {
      throw new InputError(`--force-site ${p}: matches no refused attention node${refusable.length ? ` (refused: ${refusable.join(', ')})` : ' (none is refused)'}`, 'usage');
    }
    if (matched.length === 0) empty.push(p);
    names.push(...matched);
  }
  return { names: [...new Set(names)], empty };
}

function glob(pattern: string): RegExp {
  const body = pattern.split('').map((c) => (c === '*' ? '.*' : c === '?' ? '.' : c.replace(/[\\^$.+()|{}[\]]/g, '\\$&'))).join('');
  return new RegExp(`^${body}$`, 's');
}
