/**
 * The README as a newcomer reads it (issue 25): its three commands run as written and print what it shows, every
 * link of the README and the docs/ pages reaches a file (and a heading) that exists, and every shell example
 * calls the tool as `npx ssmax-patch`, which works in a clone and in a project that installed it.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { TORCH } from './support/ref';
import { removeScratch, tmpdir } from './support/io';
import { assertLines, blocks, docPages, REPO, runShell, section } from './support/readme';

after(removeScratch);

/** GitHub's anchor for a heading. */
const anchor = (heading: string): string => heading.toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').trim().replace(/\s/g, '-');

/** The headings of a page outside code blocks. */
function headings(text: string): string[] {
  let fenced = false;
  return text.split('\n').flatMap((l) => {
    if (l.startsWith('```')) fenced = !fenced;
    const h = fenced ? null : /^#+ (.*)$/.exec(l);
    return h ? [anchor(h[1])] : [];
  });
}

describe('the README front page', () => {
  it('the three commands run as written on a GPT-2 export, twice, print what the README shows, and revert exactly', () => {
    const dir = tmpdir('ssmax-readme-');
    fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'model.onnx'));
    const text = section('Three commands');
    const [sh] = blocks(text, 'sh');
    const [expected] = blocks(text, 'text');
    for (const run of [1, 2]) {
      const first = runShell(sh.split('\n')[0], dir);
      assert.equal(first.code, 0, `run ${run}: ${first.stderr}`);
      assertLines(first.stdout, expected);
      const rest = runShell(sh.split('\n').slice(1).join('\n'), dir);
      assert.equal(rest.code, 0, `run ${run}: ${rest.stdout}${rest.stderr}`);
      assert.match(rest.stdout, /\nstrict: PASSED\n/);
      assert.ok(fs.readFileSync(path.join(dir, 'model.reverted.onnx')).equals(fs.readFileSync(path.join(dir, 'model.onnx'))));
    }
  });

  it('every relative link reaches a file, and every #anchor a heading of its page', () => {
    const pages = docPages();
    const broken: string[] = [];
    for (const [page, text] of pages) {
      const prose = text.replace(/```[\s\S]*?```/g, '');
      for (const [, link] of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(link)) continue;
        const [file, hash] = link.split('#');
        const target = file ? path.normalize(path.join(path.dirname(page), file)) : page;
        if (!fs.existsSync(path.join(REPO, target))) broken.push(`${page}: ${link} (no file)`);
        else if (hash && target.endsWith('.md') && !headings(pages.get(target) ?? fs.readFileSync(path.join(REPO, target), 'utf8')).includes(hash)) {
          broken.push(`${page}: ${link} (no heading)`);
        }
      }
    }
    assert.deepEqual(broken, []);
  });

  it('every shell example calls the tool through npx', () => {
    const bare: string[] = [];
    for (const [page, text] of docPages()) {
      for (const block of [...blocks(text, 'sh'), ...blocks(text, 'bash')]) {
        for (const line of block.split('\n')) if (/(^|[;&|(]\s*|\$ )ssmax-patch /.test(line)) bare.push(`${page}: ${line}`);
      }
    }
    assert.deepEqual(bare, []);
  });

  it('fits a newcomer: at most 150 lines, every docs/ page linked from it', () => {
    const readme = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
    assert.ok(readme.split('\n').length <= 150, `README has ${readme.split('\n').length} lines`);
    const unlinked = [...docPages().keys()].filter((p) => p.startsWith('docs/') && !readme.includes(`](${p}`));
    assert.deepEqual(unlinked, []);
  });
});
