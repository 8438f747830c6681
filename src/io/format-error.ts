/** The file is not an ONNX model, or not one this tool reads; the message says why, in one line. */
export class ModelFormatError extends Error {
  /** bad-external-data: the model's own bytes are fine, the data its tensors refer to is not. */
  constructor(message: string, readonly code: 'bad-model' | 'bad-external-data' = 'bad-model') {
    super(message);
  }
}
