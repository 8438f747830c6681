/**
 * onnxruntime-node, loaded on first use. It is an optional dependency that only verification needs: its install
 * script downloads GPU libraries from api.nuget.org, which fails where only the npm registry is reachable, and
 * npm then leaves the package out. Patching never loads it; verification says how to install it.
 */
import type * as Ort from 'onnxruntime-node';
import { InputError } from './errors';

export const INSTALL_HINT =
  'install it with: ONNXRUNTIME_NODE_INSTALL=skip npm install onnxruntime-node@^1.30.0 (skip: without the GPU libraries, which verification does not use)';

let loaded: typeof Ort | undefined;

export function onnxruntime(): typeof Ort {
  if (loaded) return loaded;
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    loaded = require('onnxruntime-node') as typeof Ort;
    return loaded;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err?.code === 'MODULE_NOT_FOUND' && /onnxruntime-node/.test(String(err.message).split('\n')[0])) {
      throw new InputError(`verification needs onnxruntime-node, which is not installed; ${INSTALL_HINT}`);
    }
    throw new InputError(`onnxruntime-node cannot be loaded (${String(err?.message ?? e).split('\n')[0]}); ${INSTALL_HINT}`);
  }
}
