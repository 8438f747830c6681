/**
 * The package as a user meets it (issues 13, 25): packed, installed from the tarball into a fresh project with none
 * of our settings (no project .npmrc, no npm_* or ONNXRUNTIME_* variables, only the machine's own npm config
 * and cache), where only the npm registry need be reachable. The packed package runs no script at install (no
 * prepare: dist/ is in it). There: npx ssmax-patch patches; --verify works at once, on onnxruntime-web's
 * WebAssembly backend (a dependency), and says so; after the README's one command for onnxruntime-node (an
 * optional peer dependency) it runs on that; the library and its types resolve through `exports`; and the
 * README's CI jobs run as written. Skipped, saying so, only when the npm registry cannot be reached.
 */
import assert from 'node:assert/strict';
import { spawnSync, SpawnSyncReturns } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parse } from 'yaml';
import { TORCH } from './support/ref';
import { removeScratch, tmpdir } from './support/io';
import { blocks, REPO, runShell, section } from './support/readme';

after(removeScratch);

/** The environment of a user's shell: nothing npm or this test run put there. */
const userEnv: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) =>
  !/^npm_/i.test(k) && !/^ONNXRUNTIME_NODE_INSTALL/.test(k) && !['INIT_CWD', 'NODE_OPTIONS', 'NODE_TEST_CONTEXT'].includes(k)));

function run(cmd: string, args: string[], cwd: string, env = userEnv): SpawnSyncReturns<string> {
  return spawnSync(cmd, args, { cwd, env, encoding: 'utf8', timeout: 240_000 });
}

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
    const install = run('npm', [...readme.trim().split(' ').slice(1, -1), tarball, '--prefer-offline', '--no-audit', '--no-fund'], project);
    assert.equal(install.status, 0, install.stdout + install.stderr);
    // npm 11 lists every dependency whose install scripts no allowScripts entry covers: never this package.
    assert.doesNotMatch(install.stdout + install.stderr, /ssmax-patch@\S+ \(/);
    assert.ok(!fs.existsSync(path.join(project, 'node_modules/onnxruntime-node')), 'an optional peer dependency is not installed');
    const r = run('npx', ['ssmax-patch', 'models/gpt2_past.onnx', '--train-len', '64'], project);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^patched 2 attention site\(s\)/);
    assert.ok(fs.existsSync(path.join(project, 'models/gpt2_past.ssmax.onnx')));
  });

  it('--verify works at once, on onnxruntime-web; after the README\'s command for onnxruntime-node, on that', () => {
    const args = (out: string): string[] => ['ssmax-patch', 'models/gpt2_past.onnx', '--train-len', '64', '--verify', '-o', `models/${out}.onnx`];
    const web = run('npx', args('web'), project);
    assert.equal(web.status, 0, web.stdout + web.stderr);
    assert.match(web.stdout, /\nverify: PASSED \(5 passed\) in \d+\.\d s on onnxruntime-web 1\.30\.0 \(WebAssembly; onnxruntime-node is not installed\)\n/);
    assert.ok(fs.existsSync(path.join(project, 'models/web.onnx')));
    const [, command] = blocks(section('Use it in your project'), 'sh');
    assert.match(command, /^ONNXRUNTIME_NODE_INSTALL=skip npm install --save-dev onnxruntime-node@\^1\.30\.0\n$/);
    const follow = runShell(command, project, userEnv, true);
    assert.equal(follow.code, 0, follow.stderr);
    const node = run('npx', args('node'), project);
    assert.equal(node.status, 0, node.stdout + node.stderr);
    assert.match(node.stdout, /\nverify: PASSED \(5 passed\) in \d+\.\d s on onnxruntime-node 1\.30\.0\n/);
    assert.ok(fs.readFileSync(path.join(project, 'models/web.onnx')).equals(fs.readFileSync(path.join(project, 'models/node.onnx'))),
      'the same patch, whichever runtime verified it');
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
