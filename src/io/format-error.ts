/** The file is not an ONNX model, or not one this tool reads; the message says why, in one line. */
export class ModelFormatError extends Error {}
