"""TFLite importer: padding arithmetic, the flatbuffer reader, operator mapping (checked twice: on a
numpy reference builder, so the mapping is tested apart from the GPU kernels, and on the real
MLGraphBuilder), single-operator models against LiteRT, and the MediaPipe selfie segmentation
models against LiteRT on a real photo."""

import os

import numpy as np
import pytest

import mltensor
from mltensor.errors import DataError, NotSupportedError
from mltensor.tflite import import_model, importer
from mltensor.tflite.importer import (
    conv_padding,
    mediapipe_transpose_conv_padding,
    same_padding,
    transpose_conv_padding,
)
from mltensor.tflite.reader import is_tflite, read
from mltensor.tflite.writer import ModelWriter

SAME, VALID = 0, 1
RELU, RELU_N1_TO_1, RELU6, TANH = 1, 2, 3, 4


# -- padding arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "in_size,k,s,d,want",
    [
        (256, 3, 2, 1, (0, 1)),  # even input, stride 2: the odd pixel goes at the end
        (257, 3, 2, 1, (1, 1)),
        (7, 3, 1, 1, (1, 1)),
        (7, 3, 1, 2, (2, 2)),  # dilation 2: effective kernel 5
        (8, 1, 1, 1, (0, 0)),
        (5, 4, 1, 1, (1, 2)),
        (9, 5, 3, 1, (1, 1)),
        (10, 4, 3, 1, (1, 2)),
        (2, 5, 1, 1, (2, 2)),
    ],
)
def test_same_padding(in_size, k, s, d, want):
    assert same_padding(in_size, k, s, d) == want
    beg, end = want
    eff = (k - 1) * d + 1
    # SAME gives ceil(in / stride) outputs.
    assert (in_size + beg + end - eff) // s + 1 == -(-in_size // s)


def test_conv_padding_valid_and_same():
    assert conv_padding(VALID, (10, 11), (3, 3), (2, 2)) == [0, 0, 0, 0]
    assert conv_padding(SAME, (10, 11), (3, 3), (2, 2)) == [0, 1, 1, 1]
    with pytest.raises(NotSupportedError):
        conv_padding(7, (10, 11), (3, 3), (2, 2))


def test_transpose_conv_padding():
    # out = (in - 1) * s + k - beg - end + output_padding
    for padding in (SAME, VALID):
        for in_size, k, s in [(4, 3, 2), (5, 2, 2), (3, 4, 3), (6, 1, 1)]:
            outs = [in_size * s] if padding == SAME else [(in_size - 1) * s + k]
            for out in outs:
                beg, end, op = transpose_conv_padding(padding, in_size, k, s, out)
                assert (in_size - 1) * s + k - beg - end + op == out
                assert min(beg, end, op) >= 0
    assert mediapipe_transpose_conv_padding(1, 128, 2, 2) == (0, 0)  # the selfie model: 128 -> 256
    assert mediapipe_transpose_conv_padding(1, 4, 3, 2) == (0, 1)  # out 8 = 3*2 + 3 - 1
    assert mediapipe_transpose_conv_padding(2, 4, 3, 2) == (0, 0)


# -- reader and errors ---------------------------------------------------------------------------


def _one_conv_model():
    w = ModelWriter()
    x = w.input("image", [1, 5, 5, 2])
    k = w.const("kernel", np.arange(3 * 3 * 3 * 2, dtype=np.float32).reshape(3, 3, 3, 2) / 50)
    y = w.tensor("features", [1, 5, 5, 3])
    w.op("CONV_2D", [x, k, -1], [y], "Conv2DOptions", Padding=SAME, StrideW=1, StrideH=1)
    return w.finish([x], [y])


def test_reader_roundtrip():
    data = _one_conv_model()
    assert is_tflite(data) and not is_tflite(b"\0" * 16)
    m = read(data)
    assert [t.name for t in m.tensors] == ["image", "kernel", "features"]
    assert m.tensors[0].shape == (1, 5, 5, 2) and m.tensors[0].data is None
    assert m.tensors[1].data.shape == (3, 3, 3, 2) and m.tensors[1].data.dtype == np.float32
    assert m.inputs == [0] and m.outputs == [2]
    op = m.operators[0]
    assert op.name == "CONV_2D" and op.inputs == [0, 1, -1] and op.options.StrideW() == 1


def test_not_tflite_is_data_error(ctx):
    with pytest.raises(DataError, match="TFL3"):
        import_model(b"this is not a flatbuffer at all", ctx)
    with pytest.raises(TypeError, match="path, bytes or bytearray"):
        import_model(12, ctx)


def test_unsupported_builtin_names_operator_and_index(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4])
    z = w.tensor("z", [1, 4])
    w.op("RELU", [x], [y])
    w.op("SQUARE", [y], [z])
    with pytest.raises(NotSupportedError) as e:
        import_model(w.finish([x], [z]), ctx)
    msg = str(e.value)
    assert "operator 1 (SQUARE)" in msg
    assert "supported operators:" in msg and "CONV_2D" in msg and "'Convolution2DTransposeBias'" in msg


def test_unsupported_custom_names_code(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4])
    w.op("CUSTOM", [x], [y], custom="MaxPoolingWithArgmax2D")
    with pytest.raises(NotSupportedError, match=r"operator 0 \(CUSTOM 'MaxPoolingWithArgmax2D'\)"):
        import_model(w.finish([x], [y]), ctx)


def test_quantized_activations_rejected(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4], np.int8, quant=(0.1, 3))
    w.op("QUANTIZE", [x], [y])
    with pytest.raises(NotSupportedError, match=r"operator 0 \(QUANTIZE\)"):
        import_model(w.finish([x], [y]), ctx)
    w = ModelWriter()
    x = w.input("x", [1, 4], np.int8, quant=(0.1, 3))
    y = w.tensor("y", [1, 4], np.int8, quant=(0.1, 3))
    w.op("RELU", [x], [y])
    with pytest.raises(NotSupportedError, match=r"input 0 \('x'\).*quantized"):
        import_model(w.finish([x], [y]), ctx)
