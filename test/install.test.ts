/**
 * The package as a user meets it (issues 13, 25, 35): packed, installed from the tarball into a fresh project with
 * none of our settings (no project .npmrc, no npm_* or ONNXRUNTIME_* variables, only the machine's own npm config
 * and cache), where only the npm registry need be reachable. The packed package has no install script (no
 * prepare: dist/ is in it), and npm prints what docs/install.md says it prints. There: the README's three commands
 * run as written, --verify at once on onnxruntime-web's WebAssembly backend (a dependency), and after the docs' one
 * command for onnxruntime-node (an optional peer dependency) on that; every other command block and every library
 * example of the README and docs/ runs as written (or names the test that runs it); the library and its types
 * resolve through `exports`; and the CI jobs run as written. Skipped, saying so, only when the npm registry cannot
 * be reached.
 */
import assert from 'node:assert/strict';
import { spawnSync, SpawnSyncReturns } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parse } from 'yaml';
import { encodeModel } from '../src/io/model-file';
import { classifierOnly } from './support/build';
import { corpusSkip, FIXTURES, TORCH } from './support/ref';
import { removeScratch, tmpdir } from './support/io';
import { assertLines, blocks, CodeBlock, codeBlocks, REPO, runShell, section, ShellResult } from './support/readme';
import { assertRecipeOutput, RECIPES } from './support/recipes';

after(removeScratch);

/** The environment of a user's shell: nothing npm or this test run put there. */
const userEnv: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) =>
  !/^npm_/i.test(k) && !/^ONNXRUNTIME_NODE_INSTALL/.test(k) && !['INIT_CWD', 'NODE_OPTIONS', 'NODE_TEST_CONTEXT'].includes(k)));

function run(cmd: string, args: string[], cwd: string, env = userEnv): SpawnSyncReturns<string> {
  return spawnSync(cmd, args, { cwd, env, encoding: 'utf8', timeout: 240_000 });
}

/** The npm notices docs/install.md shows: after installing the package, after adding onnxruntime-node. */
const npmNotices = (): string[] => blocks(section('What npm runs and prints at install'), 'text');

/** A run of an example in its folder. */
type Rerun = () => SpawnSyncReturns<string>;

/**
 * What each library example needs (the fixture it reads as model.onnx, its arguments) and prints, by the heading
 * above it; `then` checks more (the files it wrote, a second run, its errors).
 */
const EXAMPLES: Record<string, { model: string; args?: (dir: string) => string[]; stdout: RegExp; then?: (dir: string, again: Rerun) => void }> = {
  'Library API': {
    model: 'torch/gpt2_past.onnx',
    stdout: /^wrote model\.ssmax\.onnx\n$/,
    // Again, the output existing now (was: an unhandled rejection, output-exists).
    then: (_dir, again) => assert.equal(again().status, 0),
  },
  'Example (TypeScript or JavaScript, CommonJS)': {
    model: 'torch/gpt2_past.onnx',
    stdout: /^2 Softmax sites, 0 fused operators\nlayer 0: n=causal-padding on query\nlayer 1: n=causal-padding on query\n$/,
    then: (dir) => assert.ok(fs.existsSync(path.join(dir, 'model.ssmax.onnx'))),
  },
  'Example (ES module)': { model: 'torch/gpt2_past.onnx', stdout: /^\/lm\/transformer\/h\.1\/attn\/Softmax: s=\[0\.25,0\.3,0\.35,0\.4\]\nreverted exactly\n$/ },
  'Example: errors a pipeline branches on (TypeScript or JavaScript, CommonJS)': {
    model: 'torch/gpt2_past.onnx',
    args: (dir) => {
      fs.writeFileSync(path.join(dir, 'cls.onnx'), encodeModel(classifierOnly()));
      fs.writeFileSync(path.join(dir, 'bad.onnx'), 'not a model');
      return ['model.onnx', 'cls.onnx'];
    },
    stdout: /^model\.onnx: 2 sites patched\ncls\.onnx: skipped \(no-attention; the command line exits 4\)\n$/,
    then: (dir) => {
      assert.ok(fs.existsSync(path.join(dir, 'model.ssmax.onnx')) && !fs.existsSync(path.join(dir, 'cls.ssmax.onnx')));
      const stopped = run(process.execPath, ['example.js', 'bad.onnx', 'model.onnx'], dir);
      assert.equal(stopped.status, 2, 'a bad model stops the loop with the exit code of its error');
      assert.equal(stopped.stdout, '', 'the loop stopped at the bad model');
      assert.match(stopped.stderr, /^error: bad\.onnx: not (a readable|an) ONNX model.*\n$/);
    },
  },
  'Example: calibrate s, then verify (TypeScript or JavaScript, CommonJS)': {
    model: 'quality/rope-s0.onnx',
    stdout: /^all: s = 0\.(49|50)\d, found in 4 runs\nstrict: PASSED\n$/,
    then: (dir) => assert.ok(fs.existsSync(path.join(dir, 'model.slope.onnx'))),
  },
  'Detection (`src/detect/`)': { model: 'torch/gpt2_past.onnx', stdout: /^2 sites, 0 refused\n$/ },
};

/**
 * Each command block of the README and docs/, by the heading above it: how to run it in a folder of the project
 * (the models it reads, what it must print and write), or the test that runs it already.
 */
interface CommandRun {
  /** The corpus files it reads: skipped, saying so, without them. */
  corpus?: string[];
  setup: (dir: string) => void;
  check: (r: ShellResult, dir: string) => void | Promise<void>;
}

/** docs/recipes.md's recipes: their models, and what each prints and writes (test/support/recipes.ts). */
const recipeRuns: Record<string, CommandRun> = Object.fromEntries(Object.entries(RECIPES).map(([heading, recipe]) => [heading, {
  corpus: recipe.corpus,
  setup: recipe.setup,
  check: async (r: ShellResult, dir: string) => {
    assertRecipeOutput(heading, r);
    await recipe.check(dir);
  },
}]));

const COMMANDS: Record<string, string | CommandRun> = {
  ...recipeRuns,
  'ssmax-patch': {
    setup: (dir) => fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'model.onnx')),
    // GPT-2's position table caps it at 256 tokens, below L = 4096: three checks skip, saying why, and it passes.
    check: (r, dir) => {
      assert.match(r.stdout, /\nverify: PASSED \(2 passed, 3 skipped\) in /);
      assert.ok(fs.existsSync(path.join(dir, 'model.ssmax.onnx')));
    },
  },
  Install: "above: the README's npm install, with the tarball",
  'Three commands': "above: the README's three commands",
  'Use it in your project': "above: the README's npm install, the same command",
  'Faster verification: onnxruntime-node': 'above, after the README\'s three commands',
  'Exit codes': {
    setup: (dir) => {
      fs.mkdirSync(path.join(dir, 'models'));
      fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'models/gpt2_past.onnx'));
      fs.writeFileSync(path.join(dir, 'models/cls.onnx'), encodeModel(classifierOnly()));
    },
    check: (r, dir) => {
      assert.deepEqual(fs.readdirSync(path.join(dir, 'patched')), ['gpt2_past.onnx'], 'the model without attention (exit 4) skipped');
      assert.match(r.stderr, /^ssmax-patch: no attention Softmax found/m);
    },
  },
  'Verification: `ssmax-patch verify`': {
    setup: (dir) => fs.copyFileSync(path.join(TORCH, 'llama_gqa.onnx'), path.join(dir, 'model.onnx')),
    check: (r, dir) => {
      assert.equal(r.stdout.match(/^strict: PASSED$/gm)?.length, 2, r.stdout);
      assert.equal(JSON.parse(fs.readFileSync(path.join(dir, 'verify.json'), 'utf8')).strict.passed, true);
    },
  },
  'Positional priors (`--prior ggd|alibi`), the sliding window and RoPE rescaling': {
    setup: (dir) => {
      fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'model.onnx'));
      fs.writeFileSync(path.join(dir, 'theta.json'), JSON.stringify({ theta_alpha: [-1, -0.5, 0, 0.5], theta_beta: 1 }));
    },
    check: (r, dir) => {
      assert.deepEqual(r.stdout.match(/^patched 2 attention site\(s\), preset \w+/gm), ['ssmax', 'none', 'ssmax'].map((p) => `patched 2 attention site(s), preset ${p}`));
      for (const f of ['ggd', 'alibi', 'theta']) assert.ok(fs.existsSync(path.join(dir, `model.${f}.onnx`)));
    },
  },
  'RoPE rescaled (`--rope pi|ntk|yarn`, `--rope-scale F`)': {
    setup: (dir) => fs.copyFileSync(path.join(FIXTURES, 'lm/rope-s0.onnx'), path.join(dir, 'model.onnx')),
    check: (r, dir) => {
      assert.match(r.stdout, /RoPE rescaled: YaRN ×16 \(L = 4096\) at the constant of frequencies '[^']+'/);
      assert.match(r.stdout, /RoPE rescaled: NTK-aware ×8 at the constant of frequencies '[^']+'/);
      for (const f of ['yarn', 'ntk']) assert.ok(fs.existsSync(path.join(dir, `model.${f}.onnx`)));
    },
  },
  'Calibration: `ssmax-patch calibrate`': {
    setup: (dir) => fs.copyFileSync(path.join(FIXTURES, 'quality/rope-s0.onnx'), path.join(dir, 'model.onnx')),
    check: (r, dir) => {
      assert.match(r.stdout, /\nwrote model\.slope\.onnx\n/);
      for (const f of ['model.slope.onnx', 'model.slope.calibration.json', 'model.slope.calibration.svg']) assert.ok(fs.existsSync(path.join(dir, f)), f);
    },
  },
  'How the factor is inserted': {
    setup: (dir) => fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'model.onnx')),
    check: (r, dir) => {
      assert.deepEqual(r.stdout.match(/^would patch .*$/gm), ['would patch 2 attention site(s), preset ssmax, n computed 1 time(s):',
        'would patch 1 attention site(s), preset slope, n computed 1 time(s):']);
      assert.match(r.stdout, /^ {2}L1 {2}\/lm\/transformer\/h\.1\/attn\/Softmax {2}n=causal-padding .* s=0\.2404 {2}on query {2}rule softmax\/matmul-qk$/m);
      assert.deepEqual(fs.readdirSync(dir), ['model.onnx'], '--dry-run writes nothing');
    },
  },
  'Real checkpoints: lossless, large, external data, bad input': {
    setup: (dir) => fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(dir, 'model.onnx')),
    // cmp exits 1 on a difference, so the run's exit 0 is the byte-for-byte revert.
    check: (r, dir) => {
      assert.match(r.stdout, /^wrote patched\/model\.onnx$/m);
      assert.ok(!fs.readFileSync(path.join(dir, 'patched/model.onnx')).equals(fs.readFileSync(path.join(dir, 'model.onnx'))), 'a patch was written');
    },
  },
  'Example: a run on the llama_gqa fixture': {
    setup: (dir) => fs.copyFileSync(path.join(TORCH, 'llama_gqa.onnx'), path.join(dir, 'llama_gqa.onnx')),
    // It writes where it runs; docs/ holds copies of the two files, whose checks and sweep are today's.
    check: (r, dir) => {
      assertLines(r.stdout, blocks(section('Example: a run on the llama_gqa fixture'), 'text')[0]);
      const written = JSON.parse(fs.readFileSync(path.join(dir, 'verify-llama_gqa.json'), 'utf8'));
      const copy = JSON.parse(fs.readFileSync(path.join(REPO, 'docs/verify-llama_gqa.json'), 'utf8'));
      const statuses = (doc: { checks: { status: string }[] }): string[] => doc.checks.map((c) => c.status);
      assert.deepEqual([statuses(written), written.sweep], [statuses(copy), copy.sweep]);
      assert.match(fs.readFileSync(path.join(dir, 'sharpness-llama_gqa.svg'), 'utf8'), /<svg [^>]*>/);
    },
  },
  'From a clone of this repository': 'test/recipes.test.ts and npm test itself: it runs in a clone, not in a project',
};

/**
 * What each language of a fenced block is. Every block has one of these: sh and bash run (COMMANDS), ts and js run
 * (EXAMPLES), yaml and json are read by a test here (DATA_BLOCKS), text is never run.
 */
const BLOCK_KINDS: Record<string, string> = {
  sh: 'commands', bash: 'commands', ts: 'a library example', js: 'a library example',
  yaml: 'a CI job', json: 'a package.json field', text: 'output, a command shape (synopsis), a diagram or a formula',
};

/** The headings of the YAML and JSON blocks the tests below read (the CI jobs, the allowScripts field). */
const DATA_BLOCKS = ['GitHub Actions', 'GitLab CI', 'What npm runs and prints at install'];

describe('the code blocks of the README and docs/', () => {
  it('every code block of the README and docs/ is an example a test here runs, or is marked as none (output, a shape, a diagram)', () => {
    const all = codeBlocks(null);
    const where = (b: CodeBlock): string => `${b.page} '${b.heading}' (${b.lang || 'no language'})`;
    assert.deepEqual(all.filter((b) => !(b.lang in BLOCK_KINDS)).map(where), [], `a block whose language is none of ${Object.keys(BLOCK_KINDS).join(', ')}`);
    assert.deepEqual(all.filter((b) => b.lang === 'sh' || b.lang === 'bash').filter((b) => !COMMANDS[b.heading]).map(where), [], 'a command block without an entry in COMMANDS');
    assert.deepEqual(all.filter((b) => b.lang === 'ts' || b.lang === 'js').filter((b) => !EXAMPLES[b.heading]).map(where), [], 'an example without an entry in EXAMPLES');
    assert.deepEqual(all.filter((b) => b.lang === 'yaml' || b.lang === 'json').filter((b) => !DATA_BLOCKS.includes(b.heading)).map(where), [],
      'a YAML or JSON block that no test here reads');
    // A text block is never run: a command in one would go untested (npm's own warn and notice lines are output).
    const command = /^\s*(\$ |npx |npm (?!warn|notice|error)\S|node (-e|\S+\.[cm]?js))/;
    const hidden = all.filter((b) => b.lang === 'text').flatMap((b) => b.code.split('\n').filter((l) => command.test(l)).map((l) => `${where(b)}: ${l}`));
    assert.deepEqual(hidden, [], 'a command in a text block: make it an sh block with an entry in COMMANDS');
  });
});

const ping = run('npm', ['ping', '--fetch-timeout=15000', '--fetch-retries=1'], REPO);
const unreachable = ping.status === 0 ? false : `the npm registry is unreachable (npm ping: ${(ping.stderr || ping.stdout).trim().split('\n').pop()})`;

describe('the packed package in a fresh project', { skip: unreachable }, () => {
  const root = tmpdir('ssmax-install-');
  const project = path.join(root, 'project');
  let tarball = '';

  before(() => {
    assert.ok(fs.existsSync(path.join(REPO, 'dist/src/cli/main.js')), 'build first (npm test does)');
    // dist/ is built by `npm test` already: pack it without running prepare again.
    const pack = run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', root], REPO);
    assert.equal(pack.status, 0, pack.stderr);
    const [info] = JSON.parse(pack.stdout);
    tarball = path.join(root, info.filename);
    const files: string[] = info.files.map((f: { path: string }) => f.path);
    for (const f of ['LICENSE', 'README.md', 'package.json', 'bin/ssmax-patch.js', 'dist/src/index.d.ts', 'docs/report.schema.json', 'docs/sharpness-llama_gqa.svg']) {
      assert.ok(files.includes(f), `${f} missing from the package`);
    }
    assert.ok(!files.some((f) => f.startsWith('dist/test/') || f.startsWith('test/') || f.startsWith('fixtures/')), 'tests or fixtures packed');
    const manifest = JSON.parse(run('tar', ['-xzOf', tarball, 'package/package.json'], root).stdout);
    const installScripts = ['preinstall', 'install', 'postinstall', 'prepare'].filter((s) => manifest.scripts?.[s]);
    assert.deepEqual(installScripts, [], 'the packed package runs scripts at install');
    assert.ok(manifest.dependencies['onnxruntime-web'], 'onnxruntime-web, the runtime that needs no install script, is a dependency');
    assert.equal(manifest.optionalDependencies?.['onnxruntime-node'], undefined, 'npm would try its GPU download and drop it');
    assert.deepEqual(manifest.peerDependenciesMeta?.['onnxruntime-node'], { optional: true });
    fs.mkdirSync(path.join(project, 'models'), { recursive: true });
    fs.writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'consumer', version: '1.0.0', private: true }, null, 2));
    for (const m of ['gpt2_past', 'llama_gqa']) fs.copyFileSync(path.join(TORCH, `${m}.onnx`), path.join(project, 'models', `${m}.onnx`));
  });

  it('npm publish --dry-run has nothing to warn about (but the missing login a dry run cannot avoid)', () => {
    const r = run('npm', ['publish', '--dry-run', '--ignore-scripts'], REPO);
    assert.equal(r.status, 0, r.stderr);
    const warnings = r.stderr.split('\n').filter((l) => /^npm (warn|error)/i.test(l) && !/requires you to be logged in/.test(l));
    assert.deepEqual(warnings, []);
  });

  it("installs with the README's npm install (the tarball for the unpublished name), and npx ssmax-patch patches there", () => {
    const [readme] = blocks(section('Install'), 'sh');
    assert.equal(readme, 'npm install --save-dev ssmax-patch\n');
    assert.equal(blocks(section('Use it in your project'), 'sh')[0], readme, 'docs/install.md gives the same command');
    const install = run('npm', [...readme.trim().split(' ').slice(1, -1), tarball, '--prefer-offline', '--no-audit', '--no-fund'], project);
    assert.equal(install.status, 0, install.stdout + install.stderr);
    // npm 11 lists every dependency whose install scripts no allowScripts entry covers: never this package, and
    // what docs/install.md shows.
    assert.doesNotMatch(install.stdout + install.stderr, /ssmax-patch@\S+ \(/);
    assertLines(install.stderr, npmNotices()[0]);
    assert.ok(!fs.existsSync(path.join(project, 'node_modules/onnxruntime-node')), 'an optional peer dependency is not installed');
    const r = run('npx', ['ssmax-patch', 'models/gpt2_past.onnx', '--train-len', '64'], project);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^patched 2 attention site\(s\)/);
    assert.ok(fs.existsSync(path.join(project, 'models/gpt2_past.ssmax.onnx')));
  });

  it("the README's three commands run as written, verifying at once on onnxruntime-web; after the README's command for onnxruntime-node, on that", () => {
    fs.copyFileSync(path.join(TORCH, 'gpt2_past.onnx'), path.join(project, 'model.onnx'));
    const text = section('Three commands');
    const [sh] = blocks(text, 'sh');
    const [expected] = blocks(text, 'text');
    // The first command on onnxruntime-web (the package's own runtime), the other two once onnxruntime-node is there.
    const [first, ...rest] = sh.trim().split('\n');
    assert.match(first, / --force$/, 'the node run below writes beside it instead');
    const web = runShell(first, project, userEnv, true);
    assert.equal(web.code, 0, web.stdout + web.stderr);
    assertLines(web.stdout, expected);
    assert.match(web.stdout, /\nverify: PASSED \(5 passed\) in \d+\.\d s on onnxruntime-web 1\.30\.0 \(WebAssembly; onnxruntime-node is not installed\)\n/);
    const [command] = blocks(section('Faster verification: onnxruntime-node'), 'sh');
    assert.match(command, /^ONNXRUNTIME_NODE_INSTALL=skip npm install --save-dev onnxruntime-node@\^1\.30\.0\n$/);
    const follow = runShell(command, project, userEnv, true);
    assert.equal(follow.code, 0, follow.stderr);
    assertLines(follow.stderr, npmNotices()[1]);
    // The docs' allowScripts field denies both scripts: npm then has nothing left to list.
    const manifest = path.join(project, 'package.json');
    const [field] = blocks(section('What npm runs and prints at install'), 'json');
    fs.writeFileSync(manifest, JSON.stringify({ ...JSON.parse(fs.readFileSync(manifest, 'utf8')), ...JSON.parse(field) }, null, 2));
    const ls = run('npm', ['install-scripts', 'ls'], project);
    assert.equal(ls.status, 0, ls.stderr);
    assert.doesNotMatch(ls.stdout + ls.stderr, /protobufjs|onnxruntime-node/);
    const node = runShell(first.replace('--force', '-o model.node.onnx'), project, userEnv, true);
    assert.equal(node.code, 0, node.stdout + node.stderr);
    // npm installs the newest release the range ^1.30.0 allows (1.31.1 on 2026-12-04): whichever it is, it ran.
    const version = /\nverify: PASSED \(5 passed\) in \d+\.\d s on onnxruntime-node 1\.(\d+)\.\d+\n/.exec(node.stdout);
    assert.ok(version && Number(version[1]) >= 30, node.stdout);
    assert.ok(fs.readFileSync(path.join(project, 'model.ssmax.onnx')).equals(fs.readFileSync(path.join(project, 'model.node.onnx'))),
      'the same patch, whichever runtime verified it');
    const others = runShell(rest.join('\n'), project, userEnv, true);
    assert.equal(others.code, 0, others.stdout + others.stderr);
    assert.match(others.stdout, /\nstrict: PASSED\n/);
    assert.ok(fs.readFileSync(path.join(project, 'model.reverted.onnx')).equals(fs.readFileSync(path.join(project, 'model.onnx'))));
  });

  for (const [i, c] of codeBlocks(['sh', 'bash']).entries()) {
    const entry = COMMANDS[c.heading];
    if (entry === undefined || typeof entry === 'string') continue;
    it(`${c.page} '${c.heading}': the command block runs as written`, { skip: corpusSkip(...(entry.corpus ?? [])) }, async () => {
      const dir = path.join(project, 'commands', String(i));
      fs.mkdirSync(dir, { recursive: true });
      entry.setup(dir);
      const r = runShell(c.code, dir, userEnv, true);
      assert.equal(r.code, 0, `${c.page} '${c.heading}': ${r.stdout}${r.stderr}`);
      await entry.check(r, dir);
    });
  }

  it('every library example of the README and docs/ compiles under strict TypeScript and runs as written, handling its errors', () => {
    const examples = codeBlocks(['ts', 'js']);
    assert.deepEqual(examples.map((e) => e.heading).filter((h) => !EXAMPLES[h]), [], 'an example without an entry in EXAMPLES');
    const dirs = examples.map((e, i) => {
      const dir = path.join(project, 'examples', String(i));
      fs.mkdirSync(dir, { recursive: true });
      fs.copyFileSync(path.join(FIXTURES, EXAMPLES[e.heading].model), path.join(dir, 'model.onnx'));
      fs.writeFileSync(path.join(dir, e.lang === 'js' ? 'example.mjs' : 'example.ts'), e.code);
      return dir;
    });
    // One compiler run for every TypeScript example (@types/node from this repository: a user's project has its own).
    const sources = examples.flatMap((e, i) => (e.lang === 'ts' ? [path.join('examples', String(i), 'example.ts')] : []));
    const tsc = run(process.execPath, [path.join(REPO, 'node_modules/typescript/bin/tsc'), '--strict', '--skipLibCheck', '--module', 'node16',
      '--moduleResolution', 'node16', '--target', 'es2022', '--types', 'node', '--typeRoots', path.join(REPO, 'node_modules/@types'), ...sources], project);
    assert.equal(tsc.status, 0, tsc.stdout + tsc.stderr);
    for (const [i, e] of examples.entries()) {
      const expect = EXAMPLES[e.heading];
      const r = run(process.execPath, [e.lang === 'js' ? 'example.mjs' : 'example.js', ...(expect.args?.(dirs[i]) ?? [])], dirs[i]);
      assert.equal(r.status, 0, `${e.page} '${e.heading}': ${r.stderr}`);
      assert.match(r.stdout, expect.stdout, `${e.page} '${e.heading}'`);
      const again = (): SpawnSyncReturns<string> => run(process.execPath, [e.lang === 'js' ? 'example.mjs' : 'example.js', ...(expect.args?.(dirs[i]) ?? [])], dirs[i]);
      expect.then?.(dirs[i], again);
      // Without its model, every example says so in one line and exits as the command line would (2), no stack trace.
      fs.rmSync(path.join(dirs[i], 'model.onnx'), { force: true });
      const missing = again();
      assert.equal(missing.status, 2, `${e.page} '${e.heading}' without model.onnx: ${missing.stdout}${missing.stderr}`);
      assert.match(missing.stderr, /^error: model\.onnx: [^\n]*\n$/, `${e.page} '${e.heading}'`);
    }
  });

  it('the library, its schema and its types resolve through the package exports', () => {
    const js = run(process.execPath, ['-e', [
      "const s = require('ssmax-patch');",
      "const { report } = s.patchModel(s.readModel('models/gpt2_past.onnx'), { trainLen: 64 });",
      "console.log(report.sites.length, require('ssmax-patch/report.schema.json').title);",
      "try { require('ssmax-patch/dist/src/cli/main.js'); } catch (e) { console.log(e.code); }",
    ].join('\n')], project);
    assert.equal(js.status, 0, js.stderr);
    assert.equal(js.stdout, '2 ssmax-patch report\nERR_PACKAGE_PATH_NOT_EXPORTED\n');
    fs.writeFileSync(path.join(project, 'consumer.ts'), [
      "import { patchModel, readModel, type PatchReport, type VerifyReport } from 'ssmax-patch';",
      "const report: PatchReport = patchModel(readModel('models/gpt2_past.onnx'), { trainLen: 64, n: 'causal-padding' }).report;",
      'export const n: string = report.sites[0].n;',
      "export type Checks = VerifyReport['checks'];",
      '',
    ].join('\n'));
    fs.writeFileSync(path.join(project, 'wrong.ts'), "import { patchModel } from 'ssmax-patch';\npatchModel({} as never, { n: 'rows' });\n");
    // One compiler run for both files (skipLibCheck: checking all of @types/node would take 15 s): the consumer
    // compiles, the wrong n mode does not, so the types reach the consumer through `exports`.
    const tsc = run(process.execPath, [path.join(REPO, 'node_modules/typescript/bin/tsc'), '--noEmit', '--strict', '--skipLibCheck',
      '--module', 'node16', '--moduleResolution', 'node16', '--target', 'es2022', 'consumer.ts', 'wrong.ts'], project);
    const errors = tsc.stdout.trim().split('\n');
    assert.equal(errors.length, 1, tsc.stdout + tsc.stderr);
    assert.match(errors[0], /^wrong\.ts\(2,.*'"rows"' is not assignable/);
  });

  it("the README's CI jobs run as written: they patch, verify --strict, write what they upload, and exit 1 fails", () => {
    const github = parse(blocks(section('GitHub Actions'), 'yaml')[0]);
    const gitlab = parse(blocks(section('GitLab CI'), 'yaml')[0]);
    const job = github.jobs.ssmax;
    const steps: { run?: string; if?: string; uses?: string; with?: Record<string, string> }[] = job.steps;
    const uploads = steps.filter((s) => s.uses?.startsWith('actions/upload-artifact') || s.uses?.includes('junit'));
    assert.equal(uploads.length, 2);
    assert.ok(uploads.every((s) => s.if === 'always()'), 'reports must be uploaded when verification fails');
    const uploaded: string[] = uploads[0].with!.path.trim().split('\n');
    assert.deepEqual(gitlab.ssmax.artifacts.paths, uploaded.filter((p) => !p.endsWith('.xml')));
    assert.equal(gitlab.ssmax.artifacts.when, 'always');
    assert.equal(gitlab.ssmax.artifacts.reports.junit, uploads[1].with!.report_paths);
    assert.deepEqual(gitlab.ssmax.variables, job.env);
    assert.equal(job.env.ONNXRUNTIME_NODE_INSTALL, 'skip');

    // The variables a user sets for their model; here a fixture that passes every check, and the same model with a
    // train length beyond any run (nothing can show the factor at work there): --strict fails that one.
    const envFor = (model: string, trainLen = '64'): NodeJS.ProcessEnv => ({ ...userEnv, ...job.env, MODEL: `models/${model}.onnx`, TRAIN_LEN: trainLen });
    const runs = steps.filter((s) => s.run).map((s) => s.run!);
    assert.equal(runs[0], 'npm ci');
    for (const [i, script] of runs.entries()) {
      const r = runShell(script, project, envFor('gpt2_past'), true);
      assert.equal(r.code, 0, `GitHub step ${i + 1} (${script.split('\n')[0]}): ${r.stdout}${r.stderr}`);
    }
    for (const f of [...uploaded, uploads[1].with!.report_paths]) assert.ok(fs.existsSync(path.join(project, f)), `${f} was not written`);
    assert.equal(JSON.parse(fs.readFileSync(path.join(project, 'ssmax/report.json'), 'utf8')).strict.passed, true);

    fs.rmSync(path.join(project, 'ssmax'), { recursive: true });
    const script: string[] = gitlab.ssmax.script;
    assert.equal(script[0], runs[0], 'the same install');
    const failing = runShell(script.slice(1).join('\n'), project, envFor('llama_gqa', '65536'), true);
    assert.equal(failing.code, 1, failing.stdout + failing.stderr);
    assert.match(failing.stdout, /strict: FAILED \(retrofit parity: n = 65536 is beyond the longest runnable length/);
    for (const f of [...gitlab.ssmax.artifacts.paths, gitlab.ssmax.artifacts.reports.junit]) assert.ok(fs.existsSync(path.join(project, f)), `${f} missing after a failed verification`);
  });
});
