/**
 * Choices that are allowed but probably not meant: an explicit n mode that contradicts the masks the graph
 * applies, and an s whose factor at the stated training length is far from 1 (the patched model then does not
 * reproduce the original at the length it was trained for), and a model whose attention lengths are fixed (or
 * capped below L), where the patch changes the outputs at every length the model can run or none of them. They are
 * warnings, not errors: each has a use.
 */
import { NOption } from './n-mode';
import { LayerScale } from './scale';

export interface Warning {
  code:
    | 'n-causal-on-bidirectional'
    | 'n-keys-on-causal'
    | 's-far-from-train-len'
    | 'external-data-reference'
    | 'external-data-link'
    | 'force-site-none'
    | 'fixed-lengths'
    | 'no-op'
    | 'original-does-not-load'
    | 'load-not-checked';
  /** One line, for stderr and CI logs. */
  message: string;
  /** The attention sites concerned (node names), when the warning is about sites. */
  sites?: string[];
}

/** What detection found about one attention site's masks. */
export interface SiteCausality {
  node: string;
  causal: boolean;
  /** Why detection called it causal or not. */
  reason: string;
}

/**
 * s·ln L outside this range warns: at n = L the logits are scaled by more than 25 % (up or down), so the
 * patched model no longer reproduces the original at its training length.
 */
export const TRAIN_LEN_FACTOR_RANGE: readonly [number, number] = [0.8, 1.25];

const ROW_N = 'n_i = Tk − Tq + i + 1';
/** The probe reads the n of mask-counted modes off the masked logits, i.e. the keys every mask leaves visible. */
const PROBE_NOTE = " (verify's semantic probe counts the keys the masks leave visible, so it fails this patch)";

/** Explicit --n modes whose rows disagree with the masks: causal n on bidirectional attention, and the reverse. */
export function nModeWarnings(option: NOption, sites: SiteCausality[]): Warning[] {
  const causal = option === 'causal' || option === 'causal-padding';
  if (!causal && option !== 'keys' && option !== 'padding') return [];
  const off = sites.filter((s) => s.causal !== causal);
  if (off.length === 0) return [];
  const example = `e.g. ${off[0].node}: ${off[0].reason}`;
  return [causal ? {
    code: 'n-causal-on-bidirectional', sites: off.map((s) => s.node),
    message: `--n ${option} on ${count(off)} whose masks are not causal (${example}): every row sees every (unpadded) key there, but row i gets ${ROW_N}; use --n auto${option === 'causal-padding' ? PROBE_NOTE : ''}`,
  } : {
    code: 'n-keys-on-causal', sites: off.map((s) => s.node),
    message: `--n ${option} on ${count(off)} with a causal mask (${example}): row i sees i + 1 keys (more with a cache), but every row gets n = ${option === 'keys' ? 'Tk' : 'the unpadded keys'}; use --n auto${option === 'padding' ? PROBE_NOTE : ''}`,
  }];
}

/**
 * With s given (--s, --s-file) and a training length L stated, the factor at n = L should be about 1. Sites
 * without s (no factor: a prior alone) have nothing to check.
 */
export function trainLenWarnings(trainLen: number, sites: { node: string; s?: LayerScale | null }[]): Warning[] {
  const lnL = Math.log(trainLen);
  const [lo, hi] = TRAIN_LEN_FACTOR_RANGE;
  const factors = sites.flatMap((site) => (site.s === null || site.s === undefined ? [] : Array.isArray(site.s) ? site.s : [site.s])
    .map((s) => ({ node: site.node, f: s * lnL })));
  const off = factors.filter((x) => x.f < lo || x.f > hi);
  if (off.length === 0) return [];
  const fs = off.map((x) => x.f);
  const [low, high] = [Math.min(...fs).toPrecision(3), Math.max(...fs).toPrecision(3)];
  const range = low === high ? low : `${low} to ${high}`;
  const nodes = [...new Set(off.map((x) => x.node))];
  return [{
    code: 's-far-from-train-len', sites: nodes,
    message: `s·ln ${trainLen} is ${range} for ${off.length} of ${factors.length} s values (outside ${lo}–${hi}): at the training length L = ${trainLen} the patched model scales the logits by that much instead of reproducing the original (s = 1/ln L = ${(1 / lnL).toPrecision(4)} gives 1)`,
  }];
}

const count = (sites: SiteCausality[]): string => `${sites.length} attention site${sites.length === 1 ? '' : 's'}`;

/**
 * A model whose every attention length is fixed (or capped by a position table below L): what the factor does at the
 * lengths it can run and what to do. A patch that changes nothing there is refused unless --allow-no-op, which
 * this warns about instead.
 */
export function lengthWarnings(report: { effect: 'none' | 'changed' | 'unknown'; message: string } | undefined): Warning[] {
  if (!report) return [];
  if (report.effect === 'none') return [{ code: 'no-op', message: `written anyway (--allow-no-op): ${report.message.replace(/; (re-export the model|give )[^;]*$/, '')}` }];
  return [{ code: 'fixed-lengths', message: report.message }];
}
