/** What verifyPatch takes: its options, and what the command line adds to them. */
import type { Analysis } from '../analysis/analyse';
import type { CheckId } from './plan';
import type { HostTensor } from './tensors';

export interface VerifyOptions {
  /** L: the retrofit length (default: the patch record's, else the length where the mean s gives factor 1). */
  trainLen?: number;
  /** Context lengths of the sweep (default L/4, L/2, L, 2L, 4L, 8L, 16L). */
  lengths?: number[];
  /** No run longer than this (default 4096, or the model's position table if shorter). */
  maxLen?: number;
  /**
   * Bytes no run may be estimated to pass (default half the memory free when verification starts): longer runs are
   * not started, and the lengths they would have run are capped with what the longest needs (src/verify/memory.ts).
   */
  maxMemory?: number;
  /** Batch of the short runs (default 2: one plain item and one padded item). */
  batch?: number;
  /** Tolerances for parity (default 1e-4 each for float32 outputs, 1e-2 for float16/bfloat16 outputs). */
  atol?: number;
  rtol?: number;
  /** Checks to run (default all). */
  checks?: CheckId[];
  /** Sizes of named dims, e.g. {seq: 128, height: 224}. */
  dims?: Record<string, number>;
  /** Input tensors, by input name, in the element type the model declares (see readTensorFile for .npy, .json and .pb files). */
  inputs?: Record<string, HostTensor>;
  /** Fail when anything is left unverified: a skipped check, a site not probed, attention the patch refused. */
  strict?: boolean;
  /** Called with a short progress line as each stage and run starts. */
  progress?: (line: string) => void;
  /** The original's analysis (analyseModel), when the caller has it: verification then does not analyse it again. */
  analysis?: Analysis;
}

/** What the command line adds: the input files it names (read against the model's declared types, and named in the report). */
export interface FileVerifyOptions extends VerifyOptions {
  inputFiles?: Record<string, string>;
}
