"""Keras models converted by TensorFlow's own TFLite converter (tests/tflite_keras_models.py: a
MobileNetV2 alpha 0.35 and a MobileNetV3Small alpha 0.75 at 96x96, a transformer block, an MLP, a
two-layer LSTM), in float, dynamic-range and full-integer forms (int8, with int8 or float inputs
and outputs; not the LSTM, which TensorFlow 2.21's converter crashes on), imported and run on the
GPU against LiteRT on the same inputs.

TensorFlow is not a test dependency: the models are made on first use by a Python that has
`tensorflow-cpu` (and `tf-keras`, whose LSTM converts to the fused UNIDIRECTIONAL_SEQUENCE_LSTM),
named by MLTENSOR_TENSORFLOW_PYTHON or made by `MLTENSOR_SETUP_TENSORFLOW=1 bash setup.sh` (.venv-tf),
and cached under the cache directory keyed on the generator script and the TensorFlow version.
Without one these tests skip.
"""

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tflite_reference import external_python

from mltensor._xdg import cache_dir
from mltensor.tflite import import_model

pytest.importorskip("ai_edge_litert")

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "tflite_keras_models.py")
ENV = "MLTENSOR_TENSORFLOW_PYTHON"

# (model, form) pairs that import and match LiteRT
PASSING = [(m, f) for m in ("mlp", "transformer", "lstm", "mobilenet_v2", "mobilenet_v3") for f in ("float", "dynamic")]
# full-integer forms (int8 activations; int8 or float graph inputs and outputs)
FULL_INTEGER = [
    (m, f) for m in ("mlp", "transformer", "mobilenet_v2", "mobilenet_v3") for f in ("int8", "int8_float_io")
]
# int8 models are LiteRT's outputs exactly, end to end and each operator alone: every int8 operator
# of these models is computed in LiteRT's own integer arithmetic (mltensor/tflite/quantized.py).


def _tensorflow_python():
    if importlib.util.find_spec("tensorflow") is not None:
        return sys.executable
    return external_python(ENV, ".venv-tf", "MLTENSOR_SETUP_TENSORFLOW", "tensorflow-cpu and tf-keras")


_VERSIONS = (
    "import importlib.metadata as m\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print([v('tensorflow'), v('tensorflow-cpu'), v('tf-keras')])\n"
)


@pytest.fixture(scope="module")
def keras_dir():
    py = _tensorflow_python()
    versions = subprocess.run([py, "-c", _VERSIONS], check=True, capture_output=True, text=True).stdout
    with open(GENERATOR, "rb") as f:
        key = hashlib.sha256(f.read() + versions.encode()).hexdigest()[:16]
    d = os.path.join(cache_dir(), "tflite-keras", key)
    if not os.path.exists(os.path.join(d, "versions.json")):
        tmp = d + f".tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run([py, GENERATOR, tmp], capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail(f"the converter failed ({r.returncode}):\n{r.stderr[-3000:]}")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    return d


def _litert(data, x):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data)  # the default CPU path (XNNPACK delegate), a fresh state
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _run(ctx, data, x):
    graph, inputs, outputs = import_model(data, ctx)
    (name, dt, shape), = inputs  # fmt: skip
    t = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
    ctx.write_tensor(t, x)
    outs = {n: ctx.create_tensor_sync(data_type=d, shape=s, readable=True) for n, d, s in outputs}
    ctx.dispatch(graph, {name: t}, outs)
    res = [ctx.read_tensor_sync(outs[n]) for n, _, _ in outputs]
    for v in [t, *outs.values()]:
        v.destroy()
    graph.destroy()
    return res


def _read(keras_dir, model, form):
    """The model's bytes and an input: standard normal values, quantized for an int8 input."""
    with open(os.path.join(keras_dir, f"{model}_{form}.tflite"), "rb") as f:
        data = f.read()
    from ai_edge_litert.interpreter import Interpreter

    d = Interpreter(model_content=data).get_input_details()[0]
    x = np.random.default_rng(7).standard_normal(d["shape"]).astype(np.float32)
    if d["dtype"] != np.float32:
        scale, zp = d["quantization"]
        x = np.clip(np.round(x / scale) + zp, -128, 127).astype(d["dtype"])
    return data, x


# Dynamic range quantizes every layer's input at run time: a float rounding difference of 1e-7
# that moves a value across a rounding boundary changes it by a whole step (about 1% of its
# row's range), and through 52 layers such steps add up. Each operator on its own matches
# LiteRT to 2e-6 (test_dynamic_range_operators_match_litert); the whole network to this.
END_TO_END_ATOL = {("mobilenet_v2", "dynamic"): 0.1}


@pytest.mark.parametrize("model,form", PASSING)
def test_converted_keras_model_matches_litert(ctx, keras_dir, model, form):
    data, x = _read(keras_dir, model, form)
    ref = _litert(data, x)
    got = _run(ctx, data, x)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        assert np.abs(r).max() > 1e-2  # a model whose outputs vanish would test nothing
        np.testing.assert_allclose(g, r, atol=END_TO_END_ATOL.get((model, form), 1e-4), rtol=1e-4)


@pytest.mark.parametrize("model,form", [("mobilenet_v2", "dynamic"), ("transformer", "dynamic"),
                                        ("transformer", "int8"), ("mobilenet_v3", "int8"), ("mobilenet_v2", "int8"), ("mlp", "int8")])  # fmt: skip
@pytest.mark.filterwarnings("ignore:Warning. Enabling .experimental_preserve_all_tensors")
def test_each_operator_matches_litert(ctx, keras_dir, model, form):
    """Every operator of the model on its own, fed LiteRT's own values of its inputs (a model of
    that one operator), against LiteRT's value of its outputs: floats to 1e-4, int8 equal."""
    from ai_edge_litert.interpreter import Interpreter

    from mltensor.front.builder import MLGraphBuilder
    from mltensor.tflite.importer import convert
    from mltensor.tflite.reader import Model, read

    data, x = _read(keras_dir, model, form)
    it = Interpreter(model_content=data, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    m = read(data)
    for op in m.operators:
        ins = [i for i in op.inputs if i >= 0 and m.tensors[i].data is None]
        b = MLGraphBuilder(ctx)
        outs, idesc, odesc = convert(Model(m.tensors, [op], ins, list(op.outputs)), b)
        g = b.build_sync(outs)
        feeds = {}
        for (n, dt, shape), i in zip(idesc, ins):
            feeds[n] = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
            ctx.write_tensor(feeds[n], it.get_tensor(i))
        res = {n: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True) for n, dt, shape in odesc}
        ctx.dispatch(g, feeds, res)
        for (n, _, _), o in zip(odesc, op.outputs):
            got, ref = ctx.read_tensor_sync(res[n]), it.get_tensor(o)
            if ref.dtype == np.int8:
                np.testing.assert_array_equal(got, ref, err_msg=f"operator {op.index} ({op.name})")
            else:
                np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=f"operator {op.index} ({op.name})")
        for t in [*feeds.values(), *res.values()]:
            t.destroy()
        g.destroy()


def _output_quantum(data, k, r):
    """One step of output k: 1 for an int8 output, else the scale of the int8 tensor its
    DEQUANTIZE reads."""
    if r.dtype == np.int8:
        return 1
    from mltensor.tflite.reader import read

    m = read(data)
    (op,) = [op for op in m.operators if m.outputs[k] in op.outputs]
    assert op.name == "DEQUANTIZE"
    return float(m.tensors[op.inputs[0]].scale[0])


@pytest.mark.parametrize("model,form", FULL_INTEGER)
def test_full_integer_model_matches_litert(ctx, keras_dir, model, form):
    """int8 activations: LiteRT's values exactly."""
    data, x = _read(keras_dir, model, form)
    ref = _litert(data, x)
    got = _run(ctx, data, x)
    for k, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        quantum = _output_quantum(data, k, r)
        diff = np.abs(g.astype(np.float64) - r.astype(np.float64))
        assert diff.max() == 0, f"{diff.max() / quantum} quanta of {quantum} off LiteRT"


def test_versions_recorded(keras_dir):
    with open(os.path.join(keras_dir, "versions.json")) as f:
        v = json.load(f)
    assert v["tensorflow"]


# 16x8: int16 activations (zero point 0), int8 weights, int64 biases, float inputs and outputs; every
# operator of these models is computed in LiteRT's own int16 arithmetic (mltensor/tflite/int16.py)
INT16 = ("mlp", "mobilenet_v2")


@pytest.mark.parametrize("model", INT16)
def test_int16x8_model_matches_litert(ctx, keras_dir, model):
    """A 16x8 model equals LiteRT end to end: MobileNetV2 (QUANTIZE, CONV_2D, DEPTHWISE_CONV_2D, ADD,
    MEAN, FULLY_CONNECTED) and the MLP (FULLY_CONNECTED, TANH, SOFTMAX), each operator in LiteRT's own
    int16 arithmetic."""
    data, x = _read(keras_dir, model, "int16x8")
    ref = _litert(data, x)
    got = _run(ctx, data, x)
    quantum = _output_quantum(data, 0, ref[0])
    assert np.abs(ref[0]).max() > 1e-2
    diff = np.abs(got[0].astype(np.float64) - ref[0])
    assert diff.max() == 0, f"{diff.max() / quantum} int16 quanta"


@pytest.mark.parametrize("model", INT16)
@pytest.mark.filterwarnings("ignore:Warning. Enabling .experimental_preserve_all_tensors")
def test_int16x8_each_operator_matches_litert(ctx, keras_dir, model):
    """Every operator of a 16x8 model alone, fed LiteRT's values of its inputs: int16 outputs equal
    LiteRT's (int16.py computes each in LiteRT's arithmetic). WebNN has no int16 graph input, so an int16 input is given as a
    float32 operand holding its real values, set straight into the importer (the tensor keeps its
    int16 quantization, which the exact paths read)."""
    from ai_edge_litert.interpreter import Interpreter

    from mltensor.front.builder import MLGraphBuilder
    from mltensor.tflite import importer
    from mltensor.tflite.reader import Model, read

    data, x = _read(keras_dir, model, "int16x8")
    it = Interpreter(model_content=data, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    m = read(data)
    checked = set()
    for op in m.operators:
        if op.name == "DEQUANTIZE":
            continue
        ins = [i for i in op.inputs if i >= 0 and m.tensors[i].data is None]
        b = MLGraphBuilder(ctx)
        imp = importer.Importer(Model(m.tensors, [op], ins, list(op.outputs)), b)
        feeds = {}
        for i in ins:
            t, v = m.tensors[i], it.get_tensor(i)
            if t.data_type == "int16":
                v = (v.astype(np.float64) * t.scale[0]).astype(np.float32)
            imp.values[i] = b.input(f"in{i}", data_type="float32", shape=list(v.shape))
            feeds[f"in{i}"] = ctx.create_tensor_sync(data_type="float32", shape=list(v.shape), writable=True)
            ctx.write_tensor(feeds[f"in{i}"], v)
        imp.run_ops()
        outs = {f"out{o}": b.identity(imp.values[o]) for o in op.outputs}
        g = b.build_sync(outs)
        res = {n: ctx.create_tensor_sync(data_type="float32", shape=v.shape, readable=True) for n, v in outs.items()}
        ctx.dispatch(g, feeds, res)
        for o in op.outputs:
            t, ref = m.tensors[o], it.get_tensor(o)
            q = np.rint(ctx.read_tensor_sync(res[f"out{o}"]).astype(np.float64) / t.scale[0])
            assert np.abs(q - ref).max() == 0, f"operator {op.index} ({op.name})"
            checked.add(op.name)
        for v in [*feeds.values(), *res.values()]:
            v.destroy()
        g.destroy()
    assert {"QUANTIZE", "FULLY_CONNECTED"} <= checked
    if model == "mlp":
        assert {"TANH", "SOFTMAX"} <= checked


def test_converter_operators_supported(keras_dir):
    """Every builtin operator the TFLite converter emits for these Keras models (every form) is one
    the importer converts (the target is 95%; the docs' TFLite operator page gives the figure)."""
    from tflite_reference import operator_coverage

    used, missing = operator_coverage(sorted(glob.glob(os.path.join(keras_dir, "*.tflite"))))
    assert len(used) >= 15  # MobileNets, a transformer, an LSTM: the converter's common operators
    assert 1 - len(missing) / len(used) >= 0.95, sorted(missing)
