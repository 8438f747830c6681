/**
 * The floors of src/, in the order the data goes: no module imports from a floor above its own (type imports
 * included: a type that climbs back up is an arrow back up too). A floor is a folder of src/ or a file at its top.
 * docs/layout.md draws the same order.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';

const SRC = path.resolve(__dirname, '../../src');

/** Bottom first; the modules of one floor may import each other. */
const FLOORS: readonly (readonly string[])[] = [
  ['version.ts', 'memo.ts', 'errors.ts', 'identity.ts'],
  ['io', 'onnxruntime.ts'],
  ['graph'],
  ['detect'],
  ['policy'],
  ['analysis'],
  ['rewrite'],
  ['verify'],
  ['calibrate'],
  ['cli'],
  ['index.ts'],
];

function tsFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? tsFiles(p) : e.name.endsWith('.ts') ? [p] : [];
  });
}

const floorOf = (file: string): number => {
  const top = path.relative(SRC, file).split(path.sep)[0];
  const i = FLOORS.findIndex((f) => f.includes(top));
  assert.ok(i >= 0, `${top}: not on any floor of test/layers.test.ts (add it where it belongs)`);
  return i;
};

describe('the floors of src/', () => {
  it('no import climbs to a floor above its own', () => {
    const climbs: string[] = [];
    for (const file of tsFiles(SRC)) {
      const text = fs.readFileSync(file, 'utf8');
      for (const m of text.matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+'(\.{1,2}\/[^']+)'/g)) {
        const target = path.resolve(path.dirname(file), m[1]);
        const resolved = fs.existsSync(`${target}.ts`) ? `${target}.ts` : path.join(target, 'index.ts');
        if (floorOf(resolved) > floorOf(file)) climbs.push(`${path.relative(SRC, file)} -> ${path.relative(SRC, resolved)}`);
      }
    }
    assert.deepEqual(climbs, []);
  });
});
