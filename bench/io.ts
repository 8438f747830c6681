/**
 * `npm run bench -- io [options]`: the I/O benchmark. Builds (or reuses, cached outside the repository) GPT-2-shaped models of
 * about 100 MB and 1 GB with embedded weights and 1 GB with external data, then times side by side, in one
 * run: `ssmax-patch` (as a child process, peak RSS from /usr/bin/time), `cp` of the same file (the I/O
 * floor), and Python `onnx.load` + `onnx.save` where Debian's python3-onnx is installed.
 *
 * Each is measured twice: with the input in the page cache (warm: the copy runs at memory speed, so fixed
 * costs such as Node start-up weigh most) and with the input's pages dropped first (cold, as after a download
 * or on a busy machine: `dd iflag=nocache` evicts only that file, nothing else on the machine).
 *
 * For the model with external data, the output also goes to another folder, whose data file is then copied (the
 * default: a copy-on-write clone where the file system has them) or hard-linked (--external-data link): the time
 * of each and the disk it takes (the file system's free space before and after, so a clone's shared blocks count
 * as what they are). With --dir on Btrfs or XFS (reflink) the default clones; on ext4 it copies.
 *
 * Options: --reps N (default 3; the median is reported), --only LABEL[,LABEL], --cache warm|cold|both,
 * --large (adds a 4 GB model, written with external data since it passes 2 GB), --dir DIR (model cache; also
 * SSMAX_BENCH_DIR; default ~/.cache/ssmax-patch-bench).
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CACHE } from './decoder';
import { BenchModel, writeBenchModel } from './models';

const MODELS: BenchModel[] = [
  { label: '100 MB embedded', spec: { layers: 5, d: 512, heads: 8, ff: 2048, vocab: 8192, tmax: 256 }, external: false },
  { label: '1 GB embedded', spec: { layers: 16, d: 1024, heads: 16, ff: 4096, vocab: 32000, tmax: 256 }, external: false },
  { label: '1 GB external', spec: { layers: 16, d: 1024, heads: 16, ff: 4096, vocab: 32000, tmax: 256 }, external: true },
];
/** With --large: a model whose output must go to external data (over 2 GB), to see the ratio at scale. */
const LARGE: BenchModel = { label: '4 GB embedded', spec: { layers: 72, d: 1024, heads: 16, ff: 4096, vocab: 32000, tmax: 256 }, external: false };
/** Bump when the model generator changes, so cached models are rebuilt. */
const GENERATOR_VERSION = 1;
export const BIN = path.resolve(__dirname, '../../bin/ssmax-patch.js');
const PYTHON = '/usr/bin/python3';

interface Measure { seconds: number; rssMB: number }
type Cache = 'warm' | 'cold';
interface Row {
  model: BenchModel; cache: Cache; sizeMB: number; ours: Measure; dry: Measure; cp: Measure; python: Measure | 'failed' | null; sites: number;
  placements: Placement[];
}
/** An output in another folder than its input with external data: how its data file got there, in what time, using how much disk. */
interface Placement { mode: 'default' | 'link'; how: string; seconds: number; diskMB: number }

function args(argv: string[]): { reps: number; only: string[] | null; dir: string; caches: Cache[]; large: boolean } {
  const get = (flag: string): string | undefined => {
    const i = argv.indexOf(flag);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  return {
    reps: Number(get('--reps') ?? 3),
    only: get('--only')?.split(',') ?? null,
    dir: get('--dir') ?? process.env.SSMAX_BENCH_DIR ?? CACHE,
    caches: get('--cache') === 'warm' ? ['warm'] : get('--cache') === 'cold' ? ['cold'] : ['cold', 'warm'],
    large: argv.includes('--large'),
  };
}

function modelPath(dir: string, m: BenchModel): string {
  const s = m.spec;
  const name = `gpt-L${s.layers}-d${s.d}-v${s.vocab}${m.external ? '-ext' : ''}-g${GENERATOR_VERSION}`;
  return path.join(dir, name, 'model.onnx');
}

function ensureModel(dir: string, m: BenchModel): string {
  const file = modelPath(dir, m);
  if (fs.existsSync(file)) return file;
  fs.mkdirSync(path.dirname(file), { recursive: true });
  process.stderr.write(`building ${m.label} model in ${path.dirname(file)} ...\n`);
  writeBenchModel(file, m);
  return file;
}

/** Runs a command under /usr/bin/time: wall seconds and peak resident set size; a failure throws unless `check` is false. */
export function timed(cmd: string, argv: string[], check = true): Measure & { code: number; stdout: string; stderr: string } {
  const report = path.join(os.tmpdir(), `ssmax-bench-time-${process.pid}`);
  const r = spawnSync('/usr/bin/time', ['-f', '%e %M', '-o', report, cmd, ...argv], { encoding: 'utf8', maxBuffer: 256 << 20 });
  if (check && r.status !== 0) throw new Error(`${cmd} ${argv.join(' ')} failed (${r.status}): ${r.stderr.slice(0, 500)}`);
  const [seconds, kb] = fs.readFileSync(report, 'utf8').trim().split('\n').pop()!.split(' ').map(Number);
  fs.rmSync(report, { force: true });
  return { seconds, rssMB: kb / 1024, code: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

function median(values: Measure[]): Measure {
  const by = (k: keyof Measure): number => [...values.map((v) => v[k])].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  return { seconds: by('seconds'), rssMB: by('rssMB') };
}

function hasPythonOnnx(): boolean {
  return fs.existsSync(PYTHON) && spawnSync(PYTHON, ['-c', 'import onnx'], { stdio: 'ignore' }).status === 0;
}

const PY_ROUND_TRIP = [
  'import onnx, sys',
  'm = onnx.load(sys.argv[1])',
  'ext = sys.argv[3] == "1"',
  'onnx.save(m, sys.argv[2], save_as_external_data=ext, all_tensors_to_one_file=True, location="py.onnx.data") if ext else onnx.save(m, sys.argv[2])',
].join('\n');

function removeOutputs(dir: string): void {
  for (const f of fs.readdirSync(dir)) if (f.startsWith('out.') || f.startsWith('py.') || f.startsWith('cp.')) fs.rmSync(path.join(dir, f), { force: true });
  spawnSync('sync');
}

/** Puts the input files in the page cache (warm) or evicts them from it (cold) before a timed run. */
function prepare(files: string[], cache: Cache): void {
  for (const f of files) {
    if (cache === 'cold') spawnSync('dd', [`if=${f}`, 'iflag=nocache', 'count=0', 'status=none']);
    else spawnSync('cat', [f], { stdio: ['ignore', 'ignore', 'ignore'] });
  }
}

function benchOne(file: string, m: BenchModel, reps: number, python: boolean, cache: Cache): Row {
  const dir = path.dirname(file);
  const inputs = m.external ? [file, `${file}.data`] : [file];
  removeOutputs(dir);
  const ours: Measure[] = [];
  const dry: Measure[] = [];
  const cp: Measure[] = [];
  const py: Measure[] = [];
  let pyFailed = false;
  let sites = 0;
  for (let i = 0; i < reps; i++) {
    prepare(inputs, cache);
    cp.push(timed('cp', [file, path.join(dir, 'cp.onnx')]));
    removeOutputs(dir);
    prepare(inputs, cache);
    const r = timed(process.execPath, [BIN, file, '--train-len', '1024', '-o', path.join(dir, 'out.onnx'), '--json', '--quiet']);
    sites = JSON.parse(r.stdout).sites.length;
    ours.push(r);
    removeOutputs(dir);
    // The fixed part: Node start-up, reading the graph, detection, no write.
    prepare(inputs, cache);
    dry.push(timed(process.execPath, [BIN, file, '--train-len', '1024', '--dry-run', '--quiet']));
    if (python && !pyFailed) {
      prepare(inputs, cache);
      try {
        py.push(timed(PYTHON, ['-c', PY_ROUND_TRIP, file, path.join(dir, 'py.onnx'), m.external ? '1' : '0']));
      } catch {
        pyFailed = true; // e.g. onnx.load of a protobuf over 2 GB
      }
      removeOutputs(dir);
    }
  }
  const size = fs.statSync(file).size + (m.external ? fs.statSync(`${file}.data`).size : 0);
  const pyResult = !python ? null : pyFailed ? 'failed' : median(py);
  const placements = m.external ? (['default', 'link'] as const).map((mode) => place(file, inputs, mode, reps, cache)) : [];
  return { model: m, cache, sizeMB: size / 2 ** 20, ours: median(ours), dry: median(dry), cp: median(cp), python: pyResult, sites, placements };
}

/** Patches into a folder beside the model's: the median time, and the disk the output took (free space before − after). */
function place(file: string, inputs: string[], mode: Placement['mode'], reps: number, cache: Cache): Placement {
  const out = path.join(path.dirname(path.dirname(file)), `placed-${process.pid}`);
  const free = (): number => {
    spawnSync('sync');
    const s = fs.statfsSync(path.dirname(file));
    return s.bfree * s.bsize;
  };
  const runs: Measure[] = [];
  let how = '';
  let disk = 0;
  for (let i = 0; i < reps; i++) {
    fs.rmSync(out, { recursive: true, force: true });
    fs.mkdirSync(out);
    prepare(inputs, cache);
    const before = free();
    const r = timed(process.execPath, [BIN, file, '--train-len', '1024', '-o', path.join(out, 'model.onnx'), '--json', '--quiet', ...(mode === 'link' ? ['--external-data', 'link'] : [])]);
    disk = before - free();
    how = (JSON.parse(r.stdout) as { externalData: { how: string }[] }).externalData.map((e) => e.how).join(', ');
    runs.push(r);
  }
  fs.rmSync(out, { recursive: true, force: true });
  return { mode, how, seconds: median(runs).seconds, diskMB: disk / 2 ** 20 };
}

function placementTable(rows: Row[]): string {
  const lines = [
    '| model | page cache | output in another folder | data file | time | disk taken |',
    '|---|---|---|---|---|---|',
  ];
  for (const r of rows) {
    for (const p of r.placements) {
      const mode = p.mode === 'default' ? 'default (copy)' : '--external-data link';
      lines.push(`| ${r.model.label} | ${r.cache} | ${mode} | ${p.how} | ${p.seconds.toFixed(2)} s | ${p.diskMB.toFixed(0)} MB |`);
    }
  }
  return lines.join('\n');
}

function table(rows: Row[]): string {
  const f = (x: number, d = 2): string => x.toFixed(d);
  const lines = [
    '| model | page cache | size | ssmax-patch time | of which fixed (--dry-run) | ssmax-patch peak RSS | cp time | patch / cp | python onnx load+save time | python peak RSS |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ];
  for (const r of rows) {
    const py = r.python === 'failed' ? 'fails | —' : r.python ? `${f(r.python.seconds)} s | ${f(r.python.rssMB, 0)} MB` : 'n/a | n/a';
    // With external data, cp copies only the small .onnx file: a ratio to it means nothing.
    const ratio = r.model.external ? '—' : `${f(r.ours.seconds / r.cp.seconds)}×`;
    lines.push(`| ${r.model.label} | ${r.cache} | ${f(r.sizeMB, 0)} MB | ${f(r.ours.seconds)} s | ${f(r.dry.seconds)} s | ${f(r.ours.rssMB, 0)} MB | ${f(r.cp.seconds)} s | ${ratio} | ${py} |`);
  }
  return lines.join('\n');
}

function verdicts(rows: Row[]): string[] {
  return rows.map((r) => {
    const checks = r.model.external
      ? [[r.ours.seconds < 1, `time ${r.ours.seconds.toFixed(2)} s < 1 s`], [r.ours.rssMB < 200, `peak RSS ${r.ours.rssMB.toFixed(0)} MB < 200 MB`]]
      : [[r.ours.seconds <= 1.3 * r.cp.seconds, `time ${(r.ours.seconds / r.cp.seconds).toFixed(2)}× cp ≤ 1.3×`], [r.ours.rssMB < 300, `peak RSS ${r.ours.rssMB.toFixed(0)} MB < 300 MB`]];
    return `${r.model.label}, ${r.cache} (${r.sites} attention sites patched): ${checks.map(([ok, what]) => `${ok ? 'met' : 'NOT met'}: ${what}`).join('; ')}`;
  });
}

export function ioBench(argv: string[]): void {
  const { reps, only, dir, caches, large } = args(argv);
  const python = hasPythonOnnx();
  const rows: Row[] = [];
  for (const m of [...MODELS, ...(large ? [LARGE] : [])].filter((x) => !only || only.some((o) => x.label.startsWith(o)))) {
    const file = ensureModel(dir, m);
    for (const cache of caches) {
      process.stderr.write(`measuring ${m.label}, ${cache} page cache (${reps} runs each) ...\n`);
      rows.push(benchOne(file, m, reps, python, cache));
    }
  }
  process.stdout.write(`${table(rows)}\n\nmedian of ${reps} runs; ${os.cpus().length} CPUs; node ${process.version}; models cached in ${dir}\n`);
  if (rows.some((r) => r.placements.length)) process.stdout.write(`\n${placementTable(rows)}\n\n`);
  process.stdout.write(`${verdicts(rows).join('\n')}\n`);
  if (!python) process.stdout.write(`python onnx: not measured (${PYTHON} without the onnx module)\n`);
}

