/**
 * The documentation's command blocks, run as written: sections by heading (in the README or a docs/ page), fenced
 * blocks, expected output lines.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { BIN } from './io';

export const REPO = path.resolve(__dirname, '../../..');

/** The README and the docs/ pages it links to, by path from the repository root. */
export function docPages(): Map<string, string> {
  const pages = ['README.md', ...fs.readdirSync(path.join(REPO, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)];
  return new Map(pages.map((p) => [p, fs.readFileSync(path.join(REPO, p), 'utf8')]));
}

/**
 * The text under a heading (any level) of any page, up to the next heading of the same or a higher level (not in
 * code).
 */
export function section(heading: string): string {
  const lines = [...docPages().values()].join('\n').split('\n');
  let fenced = false;
  let level = 0;
  const out: string[] = [];
  for (const line of lines) {
    if (line.startsWith('```')) fenced = !fenced;
    const h = fenced ? null : /^(#+) (.*)$/.exec(line);
    if (level && h && h[1].length <= level) break;
    if (level) out.push(line);
    else if (h && h[2] === heading) level = h[1].length;
  }
  assert.ok(level, `neither the README nor docs/ has a heading '${heading}'`);
  return out.join('\n');
}

/** The fenced code blocks of a language in a piece of the README. */
export function blocks(text: string, lang: string): string[] {
  return [...text.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]);
}

/** Every expected line appears in the output, in order; `…` stands for any text. */
export function assertLines(output: string, expected: string): void {
  const lines = output.split('\n');
  let at = 0;
  for (const want of expected.trimEnd().split('\n')) {
    const re = new RegExp(`^${want.split('…').map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`);
    const found = lines.findIndex((l, i) => i >= at && re.test(l));
    assert.ok(found >= 0, `line not in the output (after line ${at}):\n${want}\n--- output:\n${output}`);
    at = found + 1;
  }
}

export interface ShellResult { code: number; stdout: string; stderr: string }

/**
 * Runs a shell block with bash -eo pipefail (as GitHub's runner does), `npx ssmax-patch` being this checkout's CLI
 * unless `realNpx` (in a project that installed the package).
 */
export function runShell(script: string, cwd: string, env: NodeJS.ProcessEnv = process.env, realNpx = false): ShellResult {
  const prelude = realNpx ? '' : `npx() { if [ "$1" = ssmax-patch ]; then shift; "${process.execPath}" "${BIN}" "$@"; else command npx "$@"; fi; }\n`;
  const r = spawnSync('bash', ['--noprofile', '--norc', '-eo', 'pipefail', '-c', prelude + script], { cwd, env, encoding: 'utf8' });
  return { code: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

export interface CodeBlock { page: string; heading: string; lang: string; code: string }

/**
 * Every fenced block of these languages (null: of any, or none) in the README and docs/, with its page and the
 * heading above it (dedented).
 */
export function codeBlocks(langs: string[] | null): CodeBlock[] {
  const out: CodeBlock[] = [];
  for (const [page, text] of docPages()) {
    let heading = '';
    let open: { lang: string; indent: number; lines: string[] } | null = null;
    for (const line of text.split('\n')) {
      const fence = /^( *)```(\w*)\s*$/.exec(line);
      if (open) {
        if (fence) {
          if (!langs || langs.includes(open.lang)) out.push({ page, heading, lang: open.lang, code: open.lines.join('\n') + '\n' });
          open = null;
        } else open.lines.push(line.slice(open.indent));
      } else if (fence) open = { lang: fence[2], indent: fence[1].length, lines: [] };
      else if (/^#+ /.test(line)) heading = line.replace(/^#+ /, '');
    }
  }
  return out;
}
