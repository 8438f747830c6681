/**
 * No run-time import cycle in src/. In a cycle, the module loaded part-way hands the other one an exports object
 * still empty: ops.ts built its table from shape-rules.ts at load, shape-rules.ts loaded graph.ts, and graph.ts came
 * back to ops.ts, so a program that loaded shape-rules.ts first had every shape rule undefined. The compiled
 * requires are what runs (the compiler drops imports used only as types, which may go both ways).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, it } from 'node:test';
import { removeScratch, tmpdir } from './support/io';

const SRC = path.resolve(__dirname, '../src');

function jsFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? jsFiles(p) : e.name.endsWith('.js') ? [p] : [];
  });
}

/** Every module's relative requires, resolved to files. */
function requireGraph(dir: string): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of jsFiles(dir)) {
    const deps = [...fs.readFileSync(file, 'utf8').matchAll(/require\("(\.{1,2}\/[^"]*)"\)/g)].map((m) => {
      const p = path.resolve(path.dirname(file), m[1]);
      return fs.existsSync(`${p}.js`) ? `${p}.js` : path.join(p, 'index.js');
    });
    graph.set(file, deps);
  }
  return graph;
}

/** The modules of each cycle (each strongly connected set of two or more, or one that requires itself), sorted. */
function cycles(graph: Map<string, string[]>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const out: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (stack.includes(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const members = stack.splice(stack.indexOf(v));
    if (members.length > 1 || (graph.get(v) ?? []).includes(v)) out.push(members.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return out;
}

const relative = (list: string[][], dir: string): string[][] => list.map((c) => c.map((f) => path.relative(dir, f)));

describe('run-time imports', () => {
  after(removeScratch);

  it('src/ has no import cycle', () => {
    const graph = requireGraph(SRC);
    assert.ok(graph.size > 100, `only ${graph.size} compiled modules under ${SRC}`);
    assert.deepEqual(relative(cycles(graph), SRC), []);
  });

  it('the check finds a cycle, through a folder too, and not a module read twice', () => {
    const dir = tmpdir('ssmax-cycles-');
    fs.mkdirSync(path.join(dir, 'sub'));
    const write = (name: string, ...deps: string[]): void => fs.writeFileSync(path.join(dir, name), deps.map((d) => `require("${d}");\n`).join(''));
    write('a.js', './sub/b');
    write('sub/b.js', '../c', '../d');
    write('c.js', './a');
    write('d.js');
    write('e.js', './d', './d');
    write('f.js', './f');
    assert.deepEqual(relative(cycles(requireGraph(dir)), dir).sort(), [['a.js', 'c.js', 'sub/b.js'], ['f.js']]);
  });

  // Each graph module loaded first, in a fresh process: every op's shape rule is there.
  const GRAPH = path.join(SRC, 'graph');
  for (const file of jsFiles(GRAPH).map((f) => path.relative(GRAPH, f).replace(/\.js$/, ''))) {
    it(`graph/${file} loaded first: no shape rule of the op table is undefined`, () => {
      const script = `require(${JSON.stringify(path.join(GRAPH, file))});
        const { OPS } = require(${JSON.stringify(path.join(SRC, 'graph', 'ops'))});
        const missing = Object.entries(OPS).filter(([, info]) => 'shape' in info && typeof info.shape !== 'function').map(([op]) => op);
        process.stdout.write(JSON.stringify(missing));`;
      const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      assert.deepEqual(JSON.parse(r.stdout), []);
    });
  }
});
