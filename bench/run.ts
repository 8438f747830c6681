/** `npm run bench [-- latency] [-- --filter REGEX]`: benchmarks, printed as Markdown tables. */
import { latencyTable } from './latency';

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const filterAt = args.indexOf('--filter');
  const filter = filterAt >= 0 ? new RegExp(args[filterAt + 1]) : undefined;
  const sections = args.filter((a, i) => !a.startsWith('--') && args[i - 1] !== '--filter');
  const all = sections.length === 0;
  if (all || sections.includes('latency')) {
    process.stdout.write('## Inference latency, original vs patched (onnxruntime-node, default options)\n\n');
    process.stdout.write(`${await latencyTable(filter)}\n\n`);
  }
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).message}\n`);
  process.exitCode = 1;
});
