/**
 * Writes the benchmark models straight to disk, streaming the weights, so models of any size are built in
 * flat memory: the graph skeleton is encoded with protobufjs, each weight is appended as its own
 * initializer entry (raw data embedded, or external in `<model>.data`).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { encodeAs } from '../src/io/proto';
import { concatBytes, lenHeader, varintField } from '../src/io/wire';
import { fillWeights, TransformerSpec, transformerGraph } from './transformer';

export interface BenchModel {
  label: string;
  spec: TransformerSpec;
  external: boolean;
}

/** Bytes of random float32 values reused for every weight (content does not matter to the patch, only size). */
const POOL_FLOATS = 4 * 1024 * 1024;
let pool: Buffer | null = null;

function weightPool(): Buffer {
  if (!pool) {
    const values = new Float32Array(POOL_FLOATS);
    fillWeights(values, 12345, 0.05);
    pool = Buffer.from(values.buffer);
  }
  return pool;
}

/** Writes the model (and its data file when external) to `file`. */
export function writeBenchModel(file: string, model: BenchModel): void {
  const { model: skeleton, weights } = transformerGraph(model.spec);
  const dataName = `${path.basename(file)}.data`;
  const graphHead = encodeAs('GraphProto', skeleton.graph!);
  let offset = 0;
  const entries = weights.map((w) => {
    const bytes = w.dims.reduce((a, b) => a * b, 1) * 4;
    const header = model.external
      ? encodeAs('TensorProto', {
        name: w.name, dataType: 1, dims: w.dims, dataLocation: 1,
        externalData: [{ key: 'location', value: dataName }, { key: 'offset', value: String(offset) }, { key: 'length', value: String(bytes) }],
      })
      : concatBytes([encodeAs('TensorProto', { name: w.name, dataType: 1, dims: w.dims }), lenHeader(9, bytes)]);
    offset += bytes;
    const length = header.length + (model.external ? 0 : bytes);
    return { header: concatBytes([lenHeader(5, length), header]), bytes };
  });
  const graphLength = graphHead.length + entries.reduce((n, e) => n + e.header.length + (model.external ? 0 : e.bytes), 0);
  const top = concatBytes([
    varintField(1, 8),
    encodeAs('ModelProto', { opsetImport: skeleton.opsetImport, producerName: skeleton.producerName, producerVersion: '0' }),
    lenHeader(7, graphLength), graphHead,
  ]);
  const tmp = `${file}.partial`;
  const fd = fs.openSync(tmp, 'w');
  const dataFd = model.external ? fs.openSync(`${tmp}.data`, 'w') : null;
  const write = (target: number, bytes: Uint8Array): void => {
    let done = 0;
    while (done < bytes.length) done += fs.writeSync(target, bytes, done, bytes.length - done);
  };
  write(fd, top);
  entries.forEach((e, i) => {
    write(fd, e.header);
    streamWeights(e.bytes, i, (chunk) => write(dataFd ?? fd, chunk));
  });
  fs.closeSync(fd);
  if (dataFd !== null) {
    fs.closeSync(dataFd);
    fs.renameSync(`${tmp}.data`, path.join(path.dirname(file), dataName));
  }
  fs.renameSync(tmp, file);
}

function streamWeights(bytes: number, index: number, write: (chunk: Uint8Array) => void): void {
  const source = weightPool();
  let start = (index * 4096 * 7) % source.length;
  let left = bytes;
  while (left > 0) {
    const n = Math.min(left, source.length - start);
    write(source.subarray(start, start + n));
    left -= n;
    start = 0;
  }
}
