/**
 * Fixture fingerprints: for every model under fixtures/, patched by the CLI under nine option sets, the hash of the
 * written model, of its JSON report (paths and timings taken out) and of the model `revert` gives back. A refactor
 * that means to change nothing leaves every fingerprint as it was:
 *   node dist/test/support/fingerprints.js before.json   (on the old build)
 *   node dist/test/support/fingerprints.js after.json --compare before.json
 * The CLI runs in this process (main), so the nine sets over 67 models take minutes, not an hour.
 */
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { main } from '../../src/cli/main';
import { FIXTURES, onnxFiles } from './ref';

const SETS: Record<string, string[]> = {
  's 0.3': ['--s', '0.3'],
  'train-len 64': ['--train-len', '64'],
  'n keys': ['--train-len', '64', '--n', 'keys'],
  'qwen-logn': ['--preset', 'qwen-logn', '--train-len', '64'],
  llama4: ['--preset', 'llama4', '--floor-scale', '16'],
  slope: ['--preset', 'slope', '--train-len', '64', '--s', '0.5'],
  alibi: ['--train-len', '64', '--prior', 'alibi'],
  ggd: ['--train-len', '64', '--prior', 'ggd'],
  'every:2': ['--train-len', '64', '--layers', 'every:2'],
};

const hash = (bytes: Uint8Array | string): string => createHash('sha256').update(bytes).digest('hex').slice(0, 16);

/** The CLI in this process: its exit code and what it printed on stdout. */
async function cli(argv: string[]): Promise<{ code: number; stdout: string }> {
  let stdout = '';
  const write = process.stdout.write.bind(process.stdout);
  const err = process.stderr.write.bind(process.stderr);
  process.stdout.write = ((chunk: string | Uint8Array): boolean => {
    stdout += String(chunk);
    return true;
  }) as typeof process.stdout.write;
  process.stderr.write = ((): boolean => true) as typeof process.stderr.write;
  try {
    return { code: await main(argv), stdout };
  } finally {
    process.stdout.write = write;
    process.stderr.write = err;
  }
}

const stable = (text: string, dir: string): string => text.split(dir).join('<out>').split(FIXTURES).join('<fixtures>')
  .replace(/"(ms|totalMs)": \d+/g, '"$1": #');

async function fingerprint(file: string, dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const [name, args] of Object.entries(SETS)) {
    const patched = path.join(dir, 'p.onnx');
    const back = path.join(dir, 'r.onnx');
    fs.rmSync(patched, { force: true });
    const p = await cli(['patch', file, ...args, '-o', patched, '--force', '--quiet', '--json']);
    let line = `exit ${p.code} report ${hash(stable(p.stdout, dir))}`;
    if (p.code === 0) {
      line += ` model ${hash(fs.readFileSync(patched))}`;
      const r = await cli(['revert', patched, '-o', back, '--force', '--quiet', '--json']);
      line += ` revert exit ${r.code}${r.code === 0 ? ` ${hash(fs.readFileSync(back))}` : ''}`;
    }
    out[name] = line;
  }
  return out;
}

async function run(target: string, compare?: string): Promise<number> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-fingerprints-'));
  const all: Record<string, Record<string, string>> = {};
  try {
    for (const f of onnxFiles(FIXTURES).sort()) all[path.relative(FIXTURES, f)] = await fingerprint(f, dir);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  fs.writeFileSync(target, `${JSON.stringify(all, null, 1)}\n`);
  if (!compare) return 0;
  const before = JSON.parse(fs.readFileSync(compare, 'utf8')) as typeof all;
  const changed = Object.keys({ ...before, ...all }).flatMap((f) => Object.keys(SETS)
    .filter((s) => before[f]?.[s] !== all[f]?.[s]).map((s) => `${f} [${s}]: ${before[f]?.[s]} -> ${all[f]?.[s]}`));
  process.stdout.write(changed.length ? `${changed.join('\n')}\n${changed.length} fingerprints changed\n` : `${Object.keys(all).length} models × ${Object.keys(SETS).length} option sets: every fingerprint unchanged\n`);
  return changed.length ? 1 : 0;
}

// `node --test dist/test/` runs every file of the folder: without a target this is not the command, and does nothing.
if (require.main === module && process.argv[2]) {
  const [target, flag, compare] = process.argv.slice(2);
  run(target, flag === '--compare' ? compare : undefined).then((code) => {
    process.exitCode = code;
  }, (e: unknown) => {
    process.stderr.write(`${(e as Error).stack}\n`);
    process.exitCode = 1;
  });
}
