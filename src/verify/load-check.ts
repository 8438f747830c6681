/**
 * The patch command loads its own output before writing it: an onnxruntime session of the patched model at
 * optimisation level 'all' (what a user's session gets by default) and at 'disabled' (no fusion, every node as
 * written), created and released without a run. A patch that one of them refuses is not written (exit 3, both
 * levels' errors named), unless onnxruntime refuses the original at that level too: then the check can say
 * nothing about the patch, and says so.
 */
import { SsmaxError } from '../errors';
import { ModelProto } from '../io/onnx';
import { onnxruntime } from '../onnxruntime';
import { Optimization } from './run';
import { firstLine, LoadFailure, SessionFactory } from './sessions';

const LEVELS: Optimization[] = ['all', 'disabled'];

export interface LoadCheck {
  /** loaded: at both levels; original-refused: onnxruntime refuses the original where it refuses the patch; no-runtime: not checked. */
  status: 'loaded' | 'original-refused' | 'no-runtime';
  /** Why it was not checked, or what onnxruntime said of the original. */
  reason?: string;
  /** Milliseconds the sessions took to create, both levels (and the original's where the patch failed). */
  ms: number;
}

/** Loads the patched model at both levels; throws an internal error when it does not load where the original does. */
export async function checkLoads(original: ModelProto, patched: ModelProto): Promise<LoadCheck> {
  const runtime = runtimeName();
  if (runtime !== 'onnxruntime-node') return { status: 'no-runtime', reason: runtime, ms: 0 };
  const start = performance.now();
  const factory = new SessionFactory(original, patched, [], false);
  try {
    const failed = new Map<Optimization, string>();
    for (const level of LEVELS) {
      const error = await loadError(() => factory.openPatched(level), factory);
      if (error !== undefined) failed.set(level, error);
    }
    if (failed.size === 0) return { status: 'loaded', ms: performance.now() - start };
    const refused: string[] = [];
    for (const level of failed.keys()) {
      const error = await loadError(() => factory.openOriginal(level), factory);
      if (error !== undefined) refused.push(`at '${level}': ${error}`);
    }
    if (refused.length === failed.size) return { status: 'original-refused', reason: refused.join('; '), ms: performance.now() - start };
    const levels = LEVELS.map((l) => `at '${l}': ${failed.get(l) ?? 'loads'}`).join('; ');
    throw new SsmaxError(`internal error: onnxruntime cannot load the patched model where it loads the original, so it was not written (${levels}); a bug: please report it with the model`, 'internal');
  } finally {
    factory.cleanup();
  }
}

/** Why onnxruntime refuses a session, or undefined when it loads (then released at once). */
async function loadError(open: () => Promise<Awaited<ReturnType<SessionFactory['openPatched']>>>, factory: SessionFactory): Promise<string | undefined> {
  try {
    await factory.release(await open());
    return undefined;
  } catch (e) {
    if (e instanceof LoadFailure || e instanceof SsmaxError) return firstLine(e).replace(/^onnxruntime cannot load the (original|patched) model: /, '');
    throw e;
  }
}

/** The runtime the check would use: only onnxruntime-node's CPU provider (WebAssembly sessions of a large model take long). */
function runtimeName(): string {
  try {
    const r = onnxruntime();
    return r.name === 'onnxruntime-node' ? r.name : r.reason ?? `${r.name} runs here`;
  } catch (e) {
    return firstLine(e);
  }
}
