/** `ssmax-patch revert PATCHED [-o OUT]`: removes the patch, giving back the original model. */
import { Command } from 'commander';
import { readModel, writeModelAsync } from '../io/model-file';
import { revertModel } from '../rewrite/revert';
import { rejectExtraArguments } from './parse';
import type { Warning } from '../policy/warnings';
import type { RevertOutcome } from './outcome';
import { defaultOutput, EXTERNAL_DATA_HELP, linkWarnings, outputHint, warn, writeOptions } from './patch-command';
import { Run } from './run';

export interface RevertCliOptions {
  output?: string;
  force?: boolean;
  externalData?: string;
  quiet?: boolean;
}

export function revertProgram(cmd: Command): Command {
  return cmd
    .description('Remove an SSMax patch: the result computes exactly what the original model computed')
    .argument('<model>', 'patched ONNX model (never modified)')
    .option('-o, --output <file>', 'output model (default <name>.reverted.onnx beside the input)')
    .option('--force', 'overwrite an existing output file')
    .option('--json', 'print the JSON report on stdout (also on errors)')
    .option('--external-data <mode>', EXTERNAL_DATA_HELP)
    .option('--quiet', 'no progress line on stderr');
}

export async function revertCommand(args: string[], o: RevertCliOptions, run: Run): Promise<RevertOutcome> {
  rejectExtraArguments(args, 1, 'revert takes one model', outputHint('revert', args));
  const input = args[0];
  const known = run.known as Partial<RevertOutcome>;
  known.input = input;
  const output = defaultOutput(input, o.output, 'reverted', /(\.ssmax)?\.onnx$/i);
  const write = writeOptions(o, input);
  const { model, report } = revertModel(readModel(input));
  known.revert = report;
  const written = await writeModelAsync(output, model, write);
  const warnings: Warning[] = [];
  warn(warnings, linkWarnings(written));
  return { command: 'revert', input, revert: report, written, warnings };
}
