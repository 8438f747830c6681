/**
 * The ONNX protobuf schema (onnx.proto, IR version 11) as a protobufjs JSON descriptor.
 *
 * Written from the ONNX IR specification rather than generated, so that the tool carries the current
 * fields (functions, metadata on nodes and graphs, overloads, device configurations) without a build step.
 */
type Field = { rule?: 'repeated'; type: string; id: number; options?: { packed: false } };

const NUMERIC = new Set(['int64', 'int32', 'uint64', 'float', 'double']);
const f = (type: string, id: number): Field => ({ type, id });
/** onnx.proto is proto2: repeated numbers are written unpacked, as onnx itself writes them (both are read). */
const r = (type: string, id: number): Field => ({ rule: 'repeated', type, id, ...(NUMERIC.has(type) ? { options: { packed: false } } : {}) });

const messages: Record<string, { fields: Record<string, Field>; oneofs?: Record<string, { oneof: string[] }>; nested?: object }> = {
  AttributeProto: {
    fields: {
      name: f('string', 1), refAttrName: f('string', 21), docString: f('string', 13), type: f('int32', 20),
      f: f('float', 2), i: f('int64', 3), s: f('bytes', 4), t: f('TensorProto', 5), g: f('GraphProto', 6),
      sparseTensor: f('SparseTensorProto', 22), tp: f('TypeProto', 14),
      floats: r('float', 7), ints: r('int64', 8), strings: r('bytes', 9), tensors: r('TensorProto', 10),
      graphs: r('GraphProto', 11), sparseTensors: r('SparseTensorProto', 23), typeProtos: r('TypeProto', 15),
    },
  },
  ValueInfoProto: {
    fields: { name: f('string', 1), type: f('TypeProto', 2), docString: f('string', 3),
      metadataProps: r('StringStringEntryProto', 4) },
  },
  NodeProto: {
    fields: {
      input: r('string', 1), output: r('string', 2), name: f('string', 3), opType: f('string', 4),
      domain: f('string', 7), overload: f('string', 8), attribute: r('AttributeProto', 5),
      docString: f('string', 6), metadataProps: r('StringStringEntryProto', 9),
      deviceConfigurations: r('NodeDeviceConfigurationProto', 10),
    },
  },
  IntIntListEntryProto: { fields: { key: f('int64', 1), value: r('int64', 2) } },
  NodeDeviceConfigurationProto: {
    fields: { configurationId: f('string', 1), shardingSpec: r('ShardingSpecProto', 2), pipelineStage: f('int32', 3) },
  },
  ShardingSpecProto: {
    fields: { tensorName: f('string', 1), device: r('int64', 2),
      indexToDeviceGroupMap: r('IntIntListEntryProto', 3), shardedDim: r('ShardedDimProto', 4) },
  },
  ShardedDimProto: { fields: { axis: f('int64', 1), simpleSharding: r('SimpleShardedDimProto', 2) } },
  SimpleShardedDimProto: {
    fields: { dimValue: f('int64', 1), dimParam: f('string', 2), numShards: f('int64', 3) },
    oneofs: { dim: { oneof: ['dimValue', 'dimParam'] } },
  },
  TrainingInfoProto: {
    fields: { initialization: f('GraphProto', 1), algorithm: f('GraphProto', 2),
      initializationBinding: r('StringStringEntryProto', 3), updateBinding: r('StringStringEntryProto', 4) },
  },
  ModelProto: {
    fields: {
      irVersion: f('int64', 1), opsetImport: r('OperatorSetIdProto', 8), producerName: f('string', 2),
      producerVersion: f('string', 3), domain: f('string', 4), modelVersion: f('int64', 5),
      docString: f('string', 6), graph: f('GraphProto', 7), metadataProps: r('StringStringEntryProto', 14),
      trainingInfo: r('TrainingInfoProto', 20), functions: r('FunctionProto', 25),
      configuration: r('DeviceConfigurationProto', 26),
    },
  },
  DeviceConfigurationProto: { fields: { name: f('string', 1), numDevices: f('int32', 2), device: r('string', 3) } },
  StringStringEntryProto: { fields: { key: f('string', 1), value: f('string', 2) } },
  TensorAnnotation: {
    fields: { tensorName: f('string', 1), quantParameterTensorNames: r('StringStringEntryProto', 2) },
  },
  GraphProto: {
    fields: {
      node: r('NodeProto', 1), name: f('string', 2), initializer: r('TensorProto', 5),
      sparseInitializer: r('SparseTensorProto', 15), docString: f('string', 10), input: r('ValueInfoProto', 11),
      output: r('ValueInfoProto', 12), valueInfo: r('ValueInfoProto', 13),
      quantizationAnnotation: r('TensorAnnotation', 14), metadataProps: r('StringStringEntryProto', 16),
    },
  },
  TensorProto: {
    fields: {
      dims: r('int64', 1), dataType: f('int32', 2), segment: f('Segment', 3), floatData: r('float', 4),
      int32Data: r('int32', 5), stringData: r('bytes', 6), int64Data: r('int64', 7), name: f('string', 8),
      docString: f('string', 12), rawData: f('bytes', 9), externalData: r('StringStringEntryProto', 13),
      dataLocation: f('int32', 14), doubleData: r('double', 10), uint64Data: r('uint64', 11),
      metadataProps: r('StringStringEntryProto', 16),
    },
    nested: { Segment: { fields: { begin: f('int64', 1), end: f('int64', 2) } } },
  },
  SparseTensorProto: { fields: { values: f('TensorProto', 1), indices: f('TensorProto', 2), dims: r('int64', 3) } },
  TensorShapeProto: {
    fields: { dim: r('Dimension', 1) },
    nested: {
      Dimension: {
        fields: { dimValue: f('int64', 1), dimParam: f('string', 2), denotation: f('string', 3) },
        oneofs: { value: { oneof: ['dimValue', 'dimParam'] } },
      },
    },
  },
  TypeProto: {
    fields: {
      tensorType: f('Tensor', 1), sequenceType: f('Sequence', 4), mapType: f('Map', 5),
      optionalType: f('Optional', 9), sparseTensorType: f('SparseTensor', 8), opaqueType: f('Opaque', 7),
      denotation: f('string', 6),
    },
    oneofs: { value: { oneof: ['tensorType', 'sequenceType', 'mapType', 'optionalType', 'sparseTensorType', 'opaqueType'] } },
    nested: {
      Tensor: { fields: { elemType: f('int32', 1), shape: f('TensorShapeProto', 2) } },
      Sequence: { fields: { elemType: f('TypeProto', 1) } },
      Map: { fields: { keyType: f('int32', 1), valueType: f('TypeProto', 2) } },
      Optional: { fields: { elemType: f('TypeProto', 1) } },
      SparseTensor: { fields: { elemType: f('int32', 1), shape: f('TensorShapeProto', 2) } },
      Opaque: { fields: { domain: f('string', 1), name: f('string', 2) } },
    },
  },
  OperatorSetIdProto: { fields: { domain: f('string', 1), version: f('int64', 2) } },
  FunctionProto: {
    fields: {
      name: f('string', 1), input: r('string', 4), output: r('string', 5), attribute: r('string', 6),
      attributeProto: r('AttributeProto', 11), node: r('NodeProto', 7), docString: f('string', 8),
      opsetImport: r('OperatorSetIdProto', 9), domain: f('string', 10), overload: f('string', 13),
      valueInfo: r('ValueInfoProto', 12), metadataProps: r('StringStringEntryProto', 14),
    },
  },
};

export const onnxSchema = { nested: { onnx: { nested: messages } } };
