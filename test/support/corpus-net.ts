/**
 * The corpus regression net: what the tool makes of every real file in ../shared/corpus (and of the committed
 * fixtures/torchlib exports), under a few option sets,
 * as plain data that a committed expectations file (test/corpus-expected.json) pins. Per file and option set: the
 * CLI's exit code, every patched site with its rule, n mode and target, every refused attention node with its
 * reason, the error line, the verification checks' verdicts; for every model written, whether onnxruntime loads
 * and runs it to finite outputs that differ from the original's, onnx.checker's verdict (Debian's python3-onnx),
 * and whether revert gives back the original exactly.
 *
 * `npm run corpus:expect` (node dist/test/support/corpus-net.js --update) rewrites the expectations from the current build: commit the
 * file with the reason for every changed outcome in the commit message.
 */
import { execFile, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { SsmaxError } from '../../src/errors';
import { readModel, serializeModel } from '../../src/io/model-file';
import { ModelProto } from '../../src/io/onnx';
import { synthesize } from '../../src/verify/inputs';
import { Outputs, Runner } from '../../src/verify/run';
import { prepare } from '../../src/verify/setup';
import { CORPUS, FIXTURES, onnxFiles } from './ref';

const run = promisify(execFile);
const BIN = path.resolve(__dirname, '../../../bin/ssmax-patch.js');
export const EXPECTED = path.resolve(__dirname, '../../../test/corpus-expected.json');
const CHECKER = path.resolve(__dirname, '../../../test/support/onnx_check.py');

/** The option sets every file is patched with. */
export const OPTION_SETS: Record<string, string[]> = {
  's 0.3': ['--s', '0.3'],
  'train-len 64': ['--train-len', '64'],
  'train-len 64 verify': ['--train-len', '64', '--verify'],
};

export interface OutputOutcome {
  /** `finite, differs` when onnxruntime ran original and patched on synthesised inputs; else why not. */
  runs: string;
  /** onnx.checker full check of the written model: `ok`, or its first line. */
  checker?: string;
  /** `exact` (the file's bytes), `canonical` (the file as this tool writes it), else what differs. */
  revert: string;
}

export interface SetOutcome {
  exit: number;
  sites?: string[];
  refused?: string[];
  /** The error's code (errors.ts ERROR_CODES), which sets the exit code. */
  code?: string;
  error?: string;
  checks?: Record<string, string>;
  output?: OutputOutcome;
}

export interface FileOutcome {
  /** onnx.checker full check of the file itself. */
  checker?: string;
  sets: Record<string, SetOutcome>;
}

export type Outcomes = Record<string, FileOutcome>;

interface ReportDoc {
  exitCode: number;
  error?: { code: string; message: string };
  sites?: { layer: number; scope: string; node: string; rule: string; n: string; target: string; kind: string; fused?: string }[];
  skipped?: { node: string; reason: string; attention?: boolean; scope?: string }[];
  verification?: { checks: { id: string; status: string; summary: string }[] };
}

/**
 * The committed library-architecture fixtures the net runs beside the corpus (torchvision/torchaudio exports, issue
 * 23), keyed by this prefix and their path below fixtures/.
 */
const FIXTURE_KEY = 'fixtures/';
const NET_FIXTURES = ['torchlib'];

/** The corpus files, relative to the corpus folder, sorted; then the net's fixtures, as `fixtures/<dir>/<file>`. */
export function corpusFiles(): string[] {
  const corpus = onnxFiles(CORPUS).map((f) => path.relative(CORPUS, f)).sort();
  const fixtures = NET_FIXTURES.flatMap((d) => onnxFiles(path.join(FIXTURES, d))).map((f) => FIXTURE_KEY + path.relative(FIXTURES, f)).sort();
  return [...corpus, ...fixtures];
}

/** Whether a net file is a corpus file (not one of the net's fixtures): the README's tally counts those. */
export const inCorpus = (file: string): boolean => !file.startsWith(FIXTURE_KEY);

/** The path of a net file. */
const sourceOf = (file: string): string => (inCorpus(file) ? path.join(CORPUS, file) : path.join(FIXTURES, file.slice(FIXTURE_KEY.length)));

/** Numbers that vary with the machine (errors, timings) are not part of an outcome. */
const stable = (text: string): string => text.split(CORPUS).join('<corpus>').split(FIXTURES).join('<fixtures>')
  .replace(/\S*ssmax-net-[^/\s]+\//g, '<out>/')
  .replace(/\d+(\.\d+)?e[-+]\d+/g, '#')
  .replace(/in \d+(\.\d+)? ?m?s\b/g, 'in #');

async function patchOutcome(file: string, args: string[], out: string): Promise<SetOutcome> {
  let stdout: string;
  let exit = 0;
  try {
    ({ stdout } = await run(process.execPath, [BIN, 'patch', sourceOf(file), ...args, '-o', out, '--force', '--quiet', '--json'],
      { maxBuffer: 64 << 20 }));
  } catch (e) {
    const err = e as { code?: number; stdout?: string };
    exit = typeof err.code === 'number' ? err.code : -1;
    stdout = err.stdout ?? '';
  }
  let doc: ReportDoc;
  try {
    doc = JSON.parse(stdout) as ReportDoc;
  } catch {
    return { exit, error: `no JSON report: ${stdout.slice(0, 200)}` };
  }
  const o: SetOutcome = { exit: doc.exitCode ?? exit };
  if (doc.sites?.length) {
    o.sites = doc.sites.map((s) => `L${s.layer}${s.scope === 'main' ? '' : ` [${s.scope}]`} ${s.node}: ${s.kind} ${s.rule} n=${s.n} on ${s.target}${s.fused ? ', written as MultiHeadAttention' : ''}`);
  }
  const refused = (doc.skipped ?? []).filter((k) => k.attention);
  if (refused.length) o.refused = refused.map((k) => `${k.node}${k.scope && k.scope !== 'main' ? ` [${k.scope}]` : ''}: ${k.reason}`);
  if (doc.error) {
    o.code = doc.error.code;
    o.error = stable(doc.error.message);
  }
  if (doc.verification) {
    o.checks = Object.fromEntries(doc.verification.checks.map((c) => [c.id, c.status === 'PASSED' ? c.status : `${c.status}: ${stable(c.summary)}`]));
  }
  return o;
}

/** onnxruntime runs the original and the patched model once, on the inputs verification would synthesise first. */
async function runsOutcome(file: string, model: ModelProto, out: string): Promise<string> {
  let feeds;
  try {
    const setup = prepare(model, readModel(out), { checks: ['wiring'] });
    const first = setup.plan.runs[0];
    if (!first) return 'not run: verification plans no run';
    feeds = synthesize(setup.graph, setup.specs, first, { fixed: setup.fixed, given: setup.given, padded: first.padded });
  } catch (e) {
    if (e instanceof SsmaxError) return `not run: ${stable(e.message)}`;
    throw e;
  }
  const run = async (label: string, model: string): Promise<Outputs | string> => {
    let runner: Runner;
    try {
      runner = await Runner.create(model, label);
    } catch (e) {
      return `${label} does not load: ${stable(firstLine(e))}`;
    }
    try {
      return await runner.run(feeds);
    } catch (e) {
      return `${label} does not run: ${stable(firstLine(e))}`;
    } finally {
      await runner.release();
    }
  };
  const original = await run('original', sourceOf(file));
  const patched = await run('patched', out);
  if (typeof patched === 'string') {
    // Neither model loads or runs here (a training op, a kernel limit, inputs synthesis cannot know): the same reason.
    const same = typeof original === 'string' && original.replace(/^original /, '').replace(/<corpus>\S*|<out>\S*/g, '')
      === patched.replace(/^patched /, '').replace(/<corpus>\S*|<out>\S*/g, '');
    const reason = (r: string): string => r.replace(/^original does not (load|run): /, (_m, v: string) => `neither model ${v}s: `);
    return typeof original !== 'string' ? patched : same ? reason(original) : `${original}; ${patched}`;
  }
  if (typeof original === 'string') return `${finiteness(patched)} (${original}: nothing to compare with)`;
  return `${finiteness(patched, original)}, ${differs(patched, original) ? 'differs' : 'same as the original'}`;
}

/** `finite`, or `NOT FINITE` where the patched outputs hold a NaN or infinity the original's do not. */
function finiteness(patched: Outputs, original?: Outputs): string {
  for (const [name, t] of Object.entries(patched)) {
    const ref = original?.[name]?.data;
    for (let i = 0; i < t.data.length; i++) if (!Number.isFinite(t.data[i]) && (ref === undefined || Number.isFinite(ref[i]))) return 'NOT FINITE';
  }
  return 'finite';
}

function differs(patched: Outputs, original: Outputs): boolean {
  return Object.entries(patched).some(([name, t]) => {
    const ref = original[name]?.data;
    return t.data.some((v, i) => v !== ref?.[i] && !(Number.isNaN(v) && Number.isNaN(ref?.[i])));
  });
}

const firstLine = (e: unknown): string => String((e as Error)?.message ?? e).split('\n')[0];

/**
 * `ssmax-patch revert` of the written model into a folder of its own, under the original's file name: `exact` when
 * the model file and every data file beside it are the original's bytes, `canonical` when it is the same model
 * encoded as this tool encodes it, else what went wrong.
 */
async function revertOutcome(file: string, out: string): Promise<string> {
  const folder = fs.mkdtempSync(`${out}.revert-`);
  const back = path.join(folder, path.basename(file));
  try {
    await run(process.execPath, [BIN, 'revert', out, '-o', back, '--quiet'], { maxBuffer: 64 << 20 });
  } catch (e) {
    return `revert failed: ${stable(firstLine((e as { stderr?: string }).stderr ?? e))}`;
  }
  const source = sourceOf(file);
  const same = (a: string, b: string): boolean => fs.existsSync(b) && fs.readFileSync(a).equals(fs.readFileSync(b));
  const beside = fs.readdirSync(folder).filter((f) => f !== path.basename(file));
  if (same(back, source) && beside.every((f) => same(path.join(folder, f), path.join(path.dirname(source), f)))) return 'exact';
  return Buffer.from(serializeModel(readModel(back))).equals(Buffer.from(serializeModel(readModel(source)))) ? 'canonical' : 'DIFFERS from the original';
}

/** onnx.checker's verdict on each file, from one python3 process; null where python3-onnx is not installed. */
export function checkerVerdicts(files: string[]): Record<string, string> | null {
  if (!onnxCheckerAvailable()) return null;
  const r = spawnSync('/usr/bin/python3', [CHECKER, ...files], { encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`onnx_check.py failed: ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, string>;
}

export function onnxCheckerAvailable(): boolean {
  return spawnSync('/usr/bin/python3', ['-c', 'import onnx'], { encoding: 'utf8' }).status === 0;
}

/** A name for a written model: the corpus path flattened, with the option set. */
const outName = (file: string, set: string): string => `${file.replace(/[/\\]/g, '__')}.${set.replace(/\s+/g, '_')}.onnx`;

/**
 * Where one set's patch of `file` is written: a folder of its own, because a patch keeps its original's external data
 * file name (model.onnx.data), which two corpus folders share: written side by side, with --force, the later file's
 * data replaced the earlier's, and onnx.checker then read one model with the other's weights (a flaky outcome).
 */
function outPath(dir: string, file: string, set: string): string {
  const folder = path.join(dir, outName(file, set).replace(/\.onnx$/, ''));
  fs.mkdirSync(folder);
  return path.join(folder, outName(file, set));
}

/** Every outcome of one corpus file (models written into `dir`). */
async function fileOutcome(file: string, dir: string): Promise<{ outcome: FileOutcome; written: Record<string, string> }> {
  const sets: Record<string, SetOutcome> = {};
  const written: Record<string, string> = {};
  const original = readModel(sourceOf(file));
  for (const [set, args] of Object.entries(OPTION_SETS)) {
    const out = outPath(dir, file, set);
    const o = await patchOutcome(file, args, out);
    if (o.exit === 0 && fs.existsSync(out)) {
      written[set] = out;
      o.output = { runs: await runsOutcome(file, original, out), revert: await revertOutcome(file, out) };
    }
    sets[set] = o;
  }
  return { outcome: { sets }, written };
}

/** Outcomes of every corpus file; `concurrency` files at a time. */
export async function corpusOutcomes(files: string[], concurrency = Math.max(1, Math.min(2, os.availableParallelism()))): Promise<Outcomes> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ssmax-net-'));
  try {
    const results: Outcomes = {};
    const written: Record<string, Record<string, string>> = {};
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < files.length) {
        const file = files[next++];
        const r = await fileOutcome(file, dir);
        results[file] = r.outcome;
        written[file] = r.written;
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    const verdicts = checkerVerdicts([...files.map((f) => sourceOf(f)), ...Object.values(written).flatMap((w) => Object.values(w))]);
    const ordered: Outcomes = {};
    for (const file of files) {
      const o = results[file];
      if (verdicts) {
        o.checker = verdicts[sourceOf(file)];
        for (const [set, out] of Object.entries(written[file])) o.sets[set].output!.checker = verdicts[out];
      }
      ordered[file] = o;
    }
    return ordered;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export function readExpected(): Outcomes {
  return JSON.parse(fs.readFileSync(EXPECTED, 'utf8')) as Outcomes;
}

/**
 * `--update` rewrites every file's expectations; `--update --only A B …` recomputes only the named net files (as the
 * net names them: `deeploy_SleepViT.onnx`, `jolt_minigpt/network.onnx`) and keeps every other file's as committed,
 * so that a change meant for a few files cannot carry unnoticed changes of the rest into the expectations.
 */
function filesToUpdate(argv: string[]): string[] {
  const at = argv.indexOf('--only');
  if (at < 0) return corpusFiles();
  const named = argv.slice(at + 1);
  const unknown = named.filter((f) => !corpusFiles().includes(f));
  if (!named.length || unknown.length) throw new Error(`--only names no net file: ${unknown.join(', ') || '(none given)'}`);
  return named;
}

if (require.main === module && process.argv.includes('--update')) {
  const only = filesToUpdate(process.argv);
  corpusOutcomes(only).then((o) => {
    const kept = process.argv.includes('--only') ? readExpected() : {};
    const merged = Object.fromEntries(corpusFiles().filter((f) => f in o || f in kept).map((f) => [f, o[f] ?? kept[f]]));
    fs.writeFileSync(EXPECTED, `${JSON.stringify(merged, null, 1)}\n`);
    process.stdout.write(`wrote ${EXPECTED}: ${Object.keys(o).length} of ${Object.keys(merged).length} files recomputed\n`);
  }, (e: unknown) => {
    process.stderr.write(`${(e as Error).stack}\n`);
    process.exitCode = 1;
  });
}
