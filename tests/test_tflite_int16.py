"""16x8 TFLite SOFTMAX (int16 activations, zero point 0) in LiteRT's own int16 arithmetic
(mltensor/tflite/int16.py: its 513-entry exp and 1 / (1 + x) tables and fixed-point
normalization), against LiteRT: the numpy reference over random scales, betas and row lengths,
and the GPU's outputs equal to LiteRT's. (and SUB, MUL; LOGISTIC, TANH, ADD: tests/test_tflite_quantized.py.)"""

import numpy as np
import pytest

from tflite_reference import litert_outputs as _litert
from tflite_reference import run_model

from mltensor.tflite import int16
from mltensor.tflite.reader import read
from mltensor.tflite.writer import ModelWriter

pytest.importorskip("ai_edge_litert")

ALL = np.arange(-(1 << 15), 1 << 15)  # every int16 value


def _scales(seed, n):
    """n random int16 input scales (log-uniform, 1e-6 to 2), float32 as a model stores them."""
    rng = np.random.default_rng(seed)
    return [float(np.float32(s)) for s in np.exp(rng.uniform(np.log(1e-6), np.log(2.0), n))]


def _unary(op, si, float_io=False, shape=(ALL.size,), beta=None):
    """One int16 operator with input scale si and output scale 1 / 32768 (LOGISTIC and TANH
    require it); float_io: a float input QUANTIZEd and the output DEQUANTIZEd (WebNN has no
    int16 graph input or output)."""
    w = ModelWriter()
    x = w.input("x", list(shape), np.float32 if float_io else np.int16, quant=None if float_io else (si, 0))
    xq = x
    if float_io:
        xq = w.tensor("xq", list(shape), np.int16, quant=(si, 0))
        w.op("QUANTIZE", [x], [xq], version=2)
    y = w.tensor("y", list(shape), np.int16, quant=(1 / 32768, 0))
    if beta is None:
        w.op(op, [xq], [y], version=3)
    else:
        w.op(op, [xq], [y], "SoftmaxOptions", version=3, Beta=beta)
    if not float_io:
        return w.finish([x], [y])
    out = w.tensor("out", list(shape))
    w.op("DEQUANTIZE", [y], [out], version=2)
    return w.finish([x], [out])


def _softmax_case(seed):
    """A random int16 SOFTMAX: input scale (1e-5 to 0.1), beta (1, or random on odd seeds), rows of
    1 to 4000 (one row constant), values spread over the int16 range or 64 times narrower."""
    rng = np.random.default_rng(seed)
    si = float(np.float32(np.exp(rng.uniform(np.log(1e-5), np.log(0.1)))))
    beta = float(np.float32(rng.uniform(0.3, 2.0))) if seed % 2 else 1.0
    shape = (3, int(rng.choice([1, 2, 10, 100, 1000, 4000])))
    q = rng.integers(-(1 << 15), 1 << 15, shape) // (64 if seed % 3 == 0 else 1)
    q[0] = q[0, 0]
    return si, beta, q.astype(np.int16)


def test_softmax_reference_matches_litert():
    """int16 SOFTMAX: softmax_reference equals LiteRT over random scales, betas and row lengths
    (36 cases, about 100000 outputs); its tables are the formula's (checked through the outputs)."""
    exp_t, recip_t = int16.softmax_tables()
    assert exp_t[512] == 32767 and recip_t[0] == 32767 and recip_t[512] == 16384
    for seed in range(36):
        si, beta, q = _softmax_case(seed)
        data = _unary("SOFTMAX", si, shape=q.shape, beta=beta)
        want = _litert(data, [q])[0]
        assert np.ptp(want.astype(np.float64)) > 0 or q.shape[1] == 1
        got = int16.softmax_reference(q, read(bytes(data)).tensors[0], beta)
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")


def test_softmax_exact_on_gpu(ctx):
    """QUANTIZE -> SOFTMAX -> DEQUANTIZE on the GPU equals LiteRT (the real-value form was a
    quantum or two off)."""
    for seed in range(6):
        si, beta, q = _softmax_case(seed)
        feeds = [(q.astype(np.float64) * si).astype(np.float32)]
        data = _unary("SOFTMAX", si, float_io=True, shape=q.shape, beta=beta)
        want = _litert(data, feeds)[0]
        np.testing.assert_array_equal(run_model(ctx, data, feeds)[1][0], want, err_msg=f"seed {seed}")


def _binary_case(op, seed, float_io=False):
    """A random int16 SUB / MUL of [64, 256] and [64, 256] (odd seeds) or [1, 256] inputs, scales
    log-uniform (MUL's output scale below the product's: a multiplier under 1)."""
    rng = np.random.default_rng(seed)
    sa, sb = (float(np.float32(v)) for v in np.exp(rng.uniform(np.log(1e-5), np.log(1e-2), 2)))
    lo = np.log(sa * sb * 1.01) if op == "MUL" else np.log(1e-5)
    so = float(np.float32(np.exp(rng.uniform(lo, lo + 6 if op == "MUL" else np.log(2e-3)))))
    shapes = [(64, 256), (64, 256) if seed % 2 else (1, 256)]
    qs = [rng.integers(-(1 << 15), 1 << 15, s) for s in shapes]
    w = ModelWriter()
    dt = np.float32 if float_io else np.int16
    xs = [
        w.input(f"x{k}", list(s), dt, quant=None if float_io else (sc, 0))
        for k, (s, sc) in enumerate(zip(shapes, (sa, sb)))
    ]
    ins = xs
    if float_io:
        ins = [w.tensor(f"q{k}", list(s), np.int16, quant=(sc, 0)) for k, (s, sc) in enumerate(zip(shapes, (sa, sb)))]
        for x, q in zip(xs, ins):
            w.op("QUANTIZE", [x], [q], version=2)
    y = w.tensor("y", [64, 256], np.int16, quant=(so, 0))
    if op == "SUB":
        w.op(op, ins, [y], "SubOptions", version=5, PotScaleInt16=False)
    else:
        w.op(op, ins, [y], "MulOptions", version=5)
    if not float_io:
        return w.finish(xs, [y]), [q.astype(np.int16) for q in qs]
    out = w.tensor("out", [64, 256])
    w.op("DEQUANTIZE", [y], [out], version=2)
    return w.finish(xs, [out]), [(q * np.float64(sc)).astype(np.float32) for q, sc in zip(qs, (sa, sb))]


_BINARY = {"SUB": int16.sub_reference, "MUL": int16.mul_reference}


@pytest.mark.parametrize("op", list(_BINARY))
def test_sub_mul_references_match_litert(op):
    """int16 SUB (sub_reference: add_reference's scales, inputs rescaled with two roundings) and
    MUL (mul_reference: float32 scale quotient, two roundings) equal LiteRT over 20 random scale
    draws, broadcast or not."""
    for seed in range(20):
        data, feeds = _binary_case(op, seed)
        want = _litert(data, feeds)[0]
        m = read(bytes(data))
        ts = [m.tensors[i] for i in (*m.inputs, m.outputs[0])]
        assert np.ptp(want.astype(np.float64)) > 0
        np.testing.assert_array_equal(_BINARY[op](*feeds, *ts), want, err_msg=f"seed {seed}")


@pytest.mark.parametrize("op", list(_BINARY))
def test_sub_mul_exact_on_gpu(ctx, op):
    """QUANTIZE -> SUB / MUL -> DEQUANTIZE on the GPU equals LiteRT."""
    for seed in range(4):
        data, feeds = _binary_case(op, seed, float_io=True)
        want = _litert(data, feeds)[0]
        np.testing.assert_array_equal(run_model(ctx, data, feeds)[1][0], want, err_msg=f"seed {seed}")
