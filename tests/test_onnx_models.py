"""The nine real architectures shipped in onnx/backend/test/data/light/ load, run, and match
onnxruntime on the same random input.

The light models ship without weights (every weight is a ConstantOfShape of 0.02), so
`randomize_weights` replaces each weight by a random tensor of the same shape (He-scaled so the
activations stay in range; BatchNormalization variances positive) before both runtimes see it.
The heavy ones run under `-m slow`.
"""

import os
import time

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
FAST = ["squeezenet", "shufflenet", "inception_v1"]
SLOW = ["resnet50", "densenet121", "inception_v2", "bvlc_alexnet", "zfnet512", "vgg19"]


def light_path(name):
    return os.path.join(LIGHT, f"light_{name}.onnx")


def randomize_weights(model, seed=0):
    """A copy of `model` whose constant weights are random tensors of the same shapes.

    ConstantOfShape nodes fed by an initializer (how the light models encode their weights)
    become initializers; every float initializer is replaced too. Scales: conv/gemm weights
    N(0, 2/fan_in); BatchNormalization scale ~1, bias/mean small, variance in [0.5, 1.5];
    biases small.
    """
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    role = {}
    for n in g.node:
        if n.op_type == "BatchNormalization":
            for name, r in zip(n.input[1:5], ("bn_scale", "bn_bias", "bn_mean", "bn_var")):
                role[name] = r
        elif n.op_type in ("Conv", "ConvTranspose"):
            role[n.input[1]] = "conv_w"
            if len(n.input) > 2:
                role[n.input[2]] = "bias"
        elif n.op_type == "Gemm":
            tb = next((a.i for a in n.attribute if a.name == "transB"), 0)
            role[n.input[1]] = "gemm_w_t" if tb else "gemm_w"
            if len(n.input) > 2:
                role[n.input[2]] = "bias"
        elif n.op_type == "MatMul":
            role[n.input[1]] = "gemm_w"

    def value(name, shape):
        shape = tuple(int(s) for s in shape)
        r = role.get(name, "other")
        if r == "bn_scale":
            return rng.uniform(0.8, 1.2, shape)
        if r == "bn_var":
            return rng.uniform(0.5, 1.5, shape)
        if r in ("bn_bias", "bn_mean", "bias"):
            return rng.normal(0, 0.05, shape)
        if r == "conv_w":
            fan_in = int(np.prod(shape[1:]))
            return rng.normal(0, np.sqrt(2.0 / fan_in), shape)
        if r == "gemm_w_t":
            return rng.normal(0, np.sqrt(1.0 / shape[1]), shape)
        if r == "gemm_w":
            return rng.normal(0, np.sqrt(1.0 / shape[0]), shape)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        return rng.normal(0, np.sqrt(1.0 / max(fan_in, 1)), shape)

    keep_nodes = []
    new_inits = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = numpy_helper.to_array(inits[n.input[0]])
            new_inits.append(numpy_helper.from_array(value(n.output[0], shape).astype(np.float32), n.output[0]))
        else:
            keep_nodes.append(n)
    out_inits = []
    for i in g.initializer:
        a = numpy_helper.to_array(i)
        if a.dtype == np.float32 and a.size > 1 or role.get(i.name):
            out_inits.append(numpy_helper.from_array(value(i.name, a.shape).astype(a.dtype), i.name))
        else:
            out_inits.append(i)
    del g.node[:]
    g.node.extend(keep_nodes)
    del g.initializer[:]
    g.initializer.extend(out_inits + new_inits)
    # graph inputs that are now initializers stay listed (IR < 4 style); both runtimes accept it
    return m


def expose_logits(model):
    """Add the input of the final Softmax as a graph output: with random weights the softmax
    may saturate to one-hot, which would hide errors; the logits do not."""
    soft = [n for n in model.graph.node if n.op_type == "Softmax"]
    if soft:
        name = soft[-1].input[0]
        if name not in {o.name for o in model.graph.output}:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model


def real_inputs(model):
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def rel_err(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def check_model(name, ctx, seed=0):
    model = expose_logits(randomize_weights(onnx.load(light_path(name)), seed))
    (vi,) = real_inputs(model)
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    x = np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32)
    t0 = time.perf_counter()
    sess = InferenceSession(model, ctx)
    t1 = time.perf_counter()
    ours = sess.run(None, {vi.name: x})
    t2 = time.perf_counter()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {vi.name: x})
    sess.close()
    return ours, ref, {"load_s": t1 - t0, "first_run_s": t2 - t1}


def _check(name, ctx):
    ours, ref, _ = check_model(name, ctx)
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert o.shape == r.shape
        assert o.dtype == r.dtype
        assert rel_err(o, r) < 1e-3, f"{name}: relative error {rel_err(o, r):.2e}"


@pytest.mark.parametrize("name", FAST)
def test_light_model(name, ctx):
    _check(name, ctx)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_light_model_slow(name, ctx):
    _check(name, ctx)


def test_randomize_weights_keeps_shapes():
    m = onnx.load(light_path("squeezenet"))
    r = randomize_weights(m)
    assert not any(n.op_type == "ConstantOfShape" for n in r.graph.node)
    names = {i.name for i in r.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape":
            assert n.output[0] in names


if __name__ == "__main__":
    from mltensor import ml

    c = ml.create_context_sync()
    import sys

    for n in sys.argv[1:] or FAST + SLOW:
        ours, ref, t = check_model(n, c)
        print(
            f"{n:14s} rel_err {max(rel_err(o, r) for o, r in zip(ours, ref)):.2e}  "
            f"load {t['load_s']:.1f}s first run {t['first_run_s']:.1f}s",
            flush=True,
        )
