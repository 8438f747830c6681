/**
 * `npm run bench -- runtimes [--only REGEX]`: `patch --train-len 64 --verify --dry-run` of every fixture and every
 * file of the corpus (the folder $SSMAX_CORPUS names, else ../shared/corpus: the tests' own helper) on
 * onnxruntime-node and on onnxruntime-web's WebAssembly backend (SSMAX_PATCH_RUNTIME),
 * one model at a time: the verdicts side by side (exit code, each check's status, the error), every file whose
 * verdicts differ with both sides' reasons, and the time each took (the process's wall time and the verification's).
 */
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { CORPUS, CORPUS_HINT } from '../test/support/ref';

const run = promisify(execFile);
const ROOT = path.resolve(__dirname, '../..');
const BIN = path.join(ROOT, 'bin/ssmax-patch.js');
const SOURCES = { fixtures: path.join(ROOT, 'fixtures'), corpus: CORPUS };
const RUNTIMES = ['node', 'web'] as const;
type RuntimeChoice = typeof RUNTIMES[number];

interface Outcome { exit: number; verdict: string; why: string; wallMs: number; verifyMs: number | null }

interface Doc {
  exitCode?: number;
  error?: string;
  verification?: { checks: { id: string; status: string; summary: string }[]; totalMs: number };
}

function models(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? models(p) : e.name.endsWith('.onnx') ? [p] : [];
  }).sort();
}

async function verifyOn(file: string, runtime: RuntimeChoice): Promise<Outcome> {
  const env = { ...process.env, SSMAX_PATCH_RUNTIME: runtime };
  const started = performance.now();
  let stdout = '';
  let exit = 0;
  try {
    ({ stdout } = await run(process.execPath, [BIN, file, '--train-len', '64', '--verify', '--dry-run', '--json', '--quiet'], { env, maxBuffer: 64 << 20 }));
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    exit = typeof err.code === 'number' ? err.code : -1;
    stdout = err.stdout ?? '';
    if (!stdout.trim()) return { exit, verdict: `exit ${exit}`, why: (err.stderr ?? '').trim().split('\n')[0], wallMs: performance.now() - started, verifyMs: null };
  }
  const wallMs = performance.now() - started;
  const doc = JSON.parse(stdout) as Doc;
  const checks = doc.verification?.checks ?? [];
  const verdict = [`exit ${doc.exitCode ?? exit}`, ...checks.map((c) => `${c.id} ${c.status}`)].join(', ');
  const why = [doc.error, ...checks.filter((c) => c.status !== 'PASSED').map((c) => `${c.id}: ${c.summary}`)].filter(Boolean).join(' | ');
  return { exit, verdict, why, wallMs, verifyMs: doc.verification?.totalMs ?? null };
}

const seconds = (ms: number): string => (ms / 1000).toFixed(1);

export async function runtimesBench(argv: string[]): Promise<void> {
  const i = argv.indexOf('--only');
  const only = i >= 0 ? new RegExp(argv[i + 1]) : null;
  // Without a corpus the table would show 0 corpus files as if none differed: say so first.
  if (!fs.existsSync(CORPUS)) process.stderr.write(`runtimes: no corpus at ${CORPUS} (${CORPUS_HINT}): fixtures only\n`);
  const rows: { source: string; file: string; by: Record<RuntimeChoice, Outcome> }[] = [];
  for (const [source, dir] of Object.entries(SOURCES)) {
    for (const file of models(dir).filter((f) => !only || only.test(f))) {
      const by = {} as Record<RuntimeChoice, Outcome>;
      for (const r of RUNTIMES) by[r] = await verifyOn(file, r);
      rows.push({ source, file: path.relative(dir, file), by });
      process.stderr.write(`${source}/${path.relative(dir, file)}: ${by.node.verdict === by.web.verdict ? 'same' : 'DIFFERENT'} (${seconds(by.node.wallMs)} s / ${seconds(by.web.wallMs)} s)\n`);
    }
  }
  const lines = ['| files | same verdicts | different | both verified | wall time node | wall time web | verification node | verification web |', '|---|---|---|---|---|---|---|---|'];
  for (const source of Object.keys(SOURCES)) {
    const of = rows.filter((r) => r.source === source);
    const same = of.filter((r) => r.by.node.verdict === r.by.web.verdict).length;
    const both = of.filter((r) => r.by.node.verifyMs !== null && r.by.web.verifyMs !== null);
    const sum = (rt: RuntimeChoice, k: 'wallMs' | 'verifyMs', list = of): number => list.reduce((n, r) => n + (r.by[rt][k] ?? 0), 0);
    lines.push(`| ${source}: ${of.length} | ${same} | ${of.length - same} | ${both.length} | ${seconds(sum('node', 'wallMs'))} s | ${seconds(sum('web', 'wallMs'))} s `
      + `| ${seconds(sum('node', 'verifyMs', both))} s | ${seconds(sum('web', 'verifyMs', both))} s |`);
  }
  process.stdout.write(`${lines.join('\n')}\n\n`);
  for (const r of rows.filter((x) => x.by.node.verdict !== x.by.web.verdict)) {
    process.stdout.write(`${r.source}/${r.file}\n  node: ${r.by.node.verdict}${r.by.node.why ? `\n        ${r.by.node.why}` : ''}\n`
      + `  web:  ${r.by.web.verdict}${r.by.web.why ? `\n        ${r.by.web.why}` : ''}\n`);
  }
}
