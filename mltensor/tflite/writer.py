"""Write small .tflite flatbuffers (for tests: single-operator models LiteRT can run as reference).

w = ModelWriter()
x = w.input("x", [1, 8, 8, 3])
k = w.const("k", np.ones((4, 3, 3, 3), np.float32))
y = w.tensor("y", [1, 8, 8, 4])
w.op("CONV_2D", [x, k, -1], [y], "Conv2DOptions", Padding=0, StrideW=1, StrideH=1)
data = w.finish([x], [y])

More subgraphs (IF branches, WHILE bodies, CALL_ONCE's initialization): `sub = w.subgraph()` is a
writer of subgraph `sub.index` sharing w's buffers and operator codes; `sub.end(inputs, outputs)`
sets its inputs and outputs before `w.finish`. String options (VAR_HANDLE's SharedName) are given
as str.
"""

import flatbuffers
import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

_CODES = {v: k for k, v in BUILTIN_OPCODE2NAME.items()}
_TYPES = {
    np.dtype(np.float32): tflite.TensorType.FLOAT32,
    np.dtype(np.float16): tflite.TensorType.FLOAT16,
    np.dtype(np.int32): tflite.TensorType.INT32,
    np.dtype(np.int64): tflite.TensorType.INT64,
    np.dtype(np.int8): tflite.TensorType.INT8,
    np.dtype(np.uint8): tflite.TensorType.UINT8,
    np.dtype(np.bool_): tflite.TensorType.BOOL,
    np.dtype(np.int16): tflite.TensorType.INT16,
}


class ModelWriter:
    def __init__(self):
        self.tensors = []  # (name, shape, type, buffer index)
        self.buffers = [b""]  # buffer 0: the empty sentinel
        self.ops = []
        self.codes = []  # (builtin name, custom code, version)
        self.subgraphs = []  # further subgraphs (a ModelWriter each), index 1, 2, ...
        self.index = 0
        self.io = ([], [])

    def subgraph(self):
        """A further subgraph: a writer sharing this one's buffers and operator codes."""
        sub = ModelWriter()
        sub.buffers, sub.codes = self.buffers, self.codes
        self.subgraphs.append(sub)
        sub.index = len(self.subgraphs)
        return sub

    def end(self, inputs, outputs):
        """A further subgraph's inputs and outputs (tensor indices)."""
        self.io = (list(inputs), list(outputs))

    def tensor(self, name, shape, dtype=np.float32, signature=None, quant=None, variable=False):
        """An activation tensor; `signature` (shape_signature) marks free dimensions with -1;
        `quant` = (scale, zero_point) makes it a quantized tensor, (scales, zero_points, axis) a
        per-channel one; `variable`: a variable tensor (an LSTM's state)."""
        self.tensors.append((name, list(shape), _TYPES[np.dtype(dtype)], 0, signature, quant, variable))
        return len(self.tensors) - 1

    input = tensor

    def const(self, name, array, quant=None):
        """A constant tensor; `quant` as for tensor()."""
        a = np.array(array, order="C")  # (ascontiguousarray would make a scalar 1-D)
        self.buffers.append(a.astype(a.dtype.newbyteorder("<")).tobytes())
        self.tensors.append((name, list(a.shape), _TYPES[a.dtype], len(self.buffers) - 1, None, quant, False))
        return len(self.tensors) - 1

    def op(self, name, inputs, outputs, options_type=None, custom=None, custom_options=b"", version=1, **options):
        key = (name, custom, version)
        if key not in self.codes:
            self.codes.append(key)
        self.ops.append((self.codes.index(key), list(inputs), list(outputs), options_type, options, custom_options))

    def finish(self, inputs, outputs):
        fb = flatbuffers.Builder(1024)

        def ivec(start, values):
            start(fb, len(values))
            for v in reversed(values):
                fb.PrependInt32(int(v))
            return fb.EndVector()

        def table_vec(start, offsets):
            start(fb, len(offsets))
            for o in reversed(offsets):
                fb.PrependUOffsetTRelative(o)
            return fb.EndVector()

        bufs = []
        for data in self.buffers:
            d = fb.CreateByteVector(data) if data else None
            tflite.BufferStart(fb)
            if d is not None:
                tflite.BufferAddData(fb, d)
            bufs.append(tflite.BufferEnd(fb))

        sgs = [self._subgraph_table(fb, ivec, table_vec, inputs, outputs)]
        sgs += [w._subgraph_table(fb, ivec, table_vec, *w.io) for w in self.subgraphs]

        codes = []
        for name, custom, version in self.codes:
            cc = fb.CreateString(custom) if custom else None
            code = _CODES[name]
            tflite.OperatorCodeStart(fb)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(fb, min(code, 127))
            tflite.OperatorCodeAddBuiltinCode(fb, code)
            tflite.OperatorCodeAddVersion(fb, version)
            if cc is not None:
                tflite.OperatorCodeAddCustomCode(fb, cc)
            codes.append(tflite.OperatorCodeEnd(fb))

        codes_vec = table_vec(tflite.ModelStartOperatorCodesVector, codes)
        sg_vec = table_vec(tflite.ModelStartSubgraphsVector, sgs)
        buf_vec = table_vec(tflite.ModelStartBuffersVector, bufs)
        desc = fb.CreateString("mltensor test model")
        tflite.ModelStart(fb)
        tflite.ModelAddVersion(fb, 3)
        tflite.ModelAddOperatorCodes(fb, codes_vec)
        tflite.ModelAddSubgraphs(fb, sg_vec)
        tflite.ModelAddDescription(fb, desc)
        tflite.ModelAddBuffers(fb, buf_vec)
        fb.Finish(tflite.ModelEnd(fb), file_identifier=b"TFL3")
        return bytes(fb.Output())

    def _subgraph_table(self, fb, ivec, table_vec, inputs, outputs):
        """This writer's tensors and operators as a SubGraph table."""
        tens = []
        for name, shape, ttype, buf, sig, quant, variable in self.tensors:
            n = fb.CreateString(name)
            q = None
            if quant is not None:
                scales = np.atleast_1d(np.asarray(quant[0], np.float32))
                zps = np.atleast_1d(np.asarray(quant[1], np.int64))
                tflite.QuantizationParametersStartScaleVector(fb, len(scales))
                for v in reversed(scales):
                    fb.PrependFloat32(float(v))
                sc = fb.EndVector()
                tflite.QuantizationParametersStartZeroPointVector(fb, len(zps))
                for v in reversed(zps):
                    fb.PrependInt64(int(v))
                zp = fb.EndVector()
                tflite.QuantizationParametersStart(fb)
                tflite.QuantizationParametersAddScale(fb, sc)
                tflite.QuantizationParametersAddZeroPoint(fb, zp)
                if len(quant) > 2:
                    tflite.QuantizationParametersAddQuantizedDimension(fb, int(quant[2]))
                q = tflite.QuantizationParametersEnd(fb)
            s = ivec(tflite.TensorStartShapeVector, shape)
            sg = ivec(tflite.TensorStartShapeSignatureVector, sig) if sig is not None else None
            tflite.TensorStart(fb)
            tflite.TensorAddShape(fb, s)
            if sg is not None:
                tflite.TensorAddShapeSignature(fb, sg)
            tflite.TensorAddType(fb, ttype)
            tflite.TensorAddBuffer(fb, buf)
            tflite.TensorAddName(fb, n)
            if q is not None:
                tflite.TensorAddQuantization(fb, q)
            if variable:
                tflite.TensorAddIsVariable(fb, True)
            tens.append(tflite.TensorEnd(fb))

        ops = []
        for code, ins, outs, otype, opts, copts in self.ops:
            i = ivec(tflite.OperatorStartInputsVector, ins)
            o = ivec(tflite.OperatorStartOutputsVector, outs)
            opt = None
            if otype:
                opts = {k: fb.CreateString(v) if isinstance(v, str) else v for k, v in opts.items()}
                getattr(tflite, f"{otype}Start")(fb)
                for k, v in opts.items():
                    getattr(tflite, f"{otype}Add{k}")(fb, v)
                opt = getattr(tflite, f"{otype}End")(fb)
            c = fb.CreateByteVector(copts) if copts else None
            tflite.OperatorStart(fb)
            tflite.OperatorAddOpcodeIndex(fb, code)
            tflite.OperatorAddInputs(fb, i)
            tflite.OperatorAddOutputs(fb, o)
            if opt is not None:
                tflite.OperatorAddBuiltinOptionsType(fb, getattr(tflite.BuiltinOptions, otype))
                tflite.OperatorAddBuiltinOptions(fb, opt)
            if c is not None:
                tflite.OperatorAddCustomOptions(fb, c)
            ops.append(tflite.OperatorEnd(fb))

        t_vec = table_vec(tflite.SubGraphStartTensorsVector, tens)
        o_vec = table_vec(tflite.SubGraphStartOperatorsVector, ops)
        in_vec = ivec(tflite.SubGraphStartInputsVector, inputs)
        out_vec = ivec(tflite.SubGraphStartOutputsVector, outputs)
        tflite.SubGraphStart(fb)
        tflite.SubGraphAddTensors(fb, t_vec)
        tflite.SubGraphAddInputs(fb, in_vec)
        tflite.SubGraphAddOutputs(fb, out_vec)
        tflite.SubGraphAddOperators(fb, o_vec)
        sg = tflite.SubGraphEnd(fb)
        return sg
