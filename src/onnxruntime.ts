/**
 * The onnxruntime verification runs on, loaded on first use; patching never loads one. onnxruntime-node (native,
 * its CPU provider) when the project installed it: an optional peer dependency, not a dependency, because its
 * install script downloads GPU libraries from outside the npm registry, and npm silently leaves the package out
 * where that fails. Otherwise onnxruntime-web's WebAssembly backend, a dependency with no install script, so that
 * an install from the registry alone verifies. Both are onnxruntime 1.30 built from the same sources, with the same
 * verdicts on the fixtures and the corpus (npm run bench -- runtimes); the native one is about 4× faster.
 * SSMAX_PATCH_RUNTIME=node or web picks one, and every verification report says which ran.
 */
import * as os from 'node:os';
import type * as Ort from 'onnxruntime-web';
import { InputError } from './errors';

export type RuntimeName = 'onnxruntime-node' | 'onnxruntime-web';

/** The loaded runtime. Both packages export onnxruntime-common's API, so one type serves both. */
export interface Runtime {
  name: RuntimeName;
  version: string;
  ort: typeof Ort;
  /** The execution provider sessions ask for: onnxruntime-node's CPU provider, or the WebAssembly one. */
  provider: 'cpu' | 'wasm';
  /** Why onnxruntime-web runs: onnxruntime-node is not installed, cannot be loaded, or SSMAX_PATCH_RUNTIME=web. */
  reason?: string;
}

/** What a report says about the runtime that ran. */
export interface RuntimeReport {
  name: RuntimeName;
  version: string;
  reason?: string;
}

const INSTALL_HINT =
  'install onnxruntime-node with: ONNXRUNTIME_NODE_INSTALL=skip npm install onnxruntime-node@^1.30.0 (skip: without the GPU libraries, which verification does not use)';

const CHOICES: Record<string, RuntimeName[]> = { node: ['onnxruntime-node'], web: ['onnxruntime-web'], '': ['onnxruntime-node', 'onnxruntime-web'] };

let loaded: Runtime | undefined;

export function onnxruntime(): Runtime {
  loaded ??= load(process.env.SSMAX_PATCH_RUNTIME ?? '');
  return loaded;
}

export function runtimeReport(): RuntimeReport {
  const { name, version, reason } = onnxruntime();
  return reason ? { name, version, reason } : { name, version };
}

/** `onnxruntime-node 1.30.0`, `onnxruntime-web 1.30.0 (WebAssembly; onnxruntime-node is not installed)`. */
export function runtimeLabel(r: RuntimeReport): string {
  if (r.name === 'onnxruntime-node') return `${r.name} ${r.version}`;
  return `${r.name} ${r.version} (WebAssembly${r.reason ? `; ${r.reason}` : ''})`;
}

function load(choice: string): Runtime {
  const names = CHOICES[choice];
  if (!names) throw new InputError(`SSMAX_PATCH_RUNTIME must be node or web, got '${choice}'`, 'usage');
  const failures: string[] = [];
  for (const name of names) {
    try {
      const runtime = name === 'onnxruntime-node' ? loadNode() : loadWeb();
      if (runtime.name === 'onnxruntime-node') return runtime;
      return { ...runtime, reason: failures.length ? failures.join('; ') : `SSMAX_PATCH_RUNTIME=${choice}` };
    } catch (e) {
      failures.push(loadFailure(name, e));
    }
  }
  const hint = names.includes('onnxruntime-node') ? `; ${INSTALL_HINT}` : '';
  throw new InputError(`verification needs onnxruntime: ${failures.join('; ')}${hint}`, 'no-runtime');
}

function loadNode(): Runtime {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const ort = require('onnxruntime-node') as typeof Ort;
  return { name: 'onnxruntime-node', version: ort.env.versions.node ?? ort.env.versions.common, ort, provider: 'cpu' };
}

function loadWeb(): Runtime {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const ort = require('onnxruntime-web') as typeof Ort;
  // WebAssembly threads run as worker threads; its own default is half the cores, at most 4.
  ort.env.wasm.numThreads = cores();
  return { name: 'onnxruntime-web', version: ort.env.versions.web ?? ort.env.versions.common, ort, provider: 'wasm' };
}

/** The threads a session may use: one per core. */
export function cores(): number {
  return Math.max(1, typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length);
}

function loadFailure(name: RuntimeName, e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  const first = String(err?.message ?? e).split('\n')[0];
  // Only the package itself missing: a missing file inside it (its native binding) is a failure to load.
  if (err?.code === 'MODULE_NOT_FOUND' && first.includes(`'${name}'`)) return `${name} is not installed`;
  return `${name} cannot be loaded (${first})`;
}
