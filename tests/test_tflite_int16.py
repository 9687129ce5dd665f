"""16x8 TFLite operators (int16 activations, zero point 0) in LiteRT's own int16 arithmetic
(mltensor/tflite/int16.py, fixedpoint.py) against LiteRT: SOFTMAX (its 513-entry exp and
1 / (1 + x) tables, fixed-point normalization), ADD / SUB / MUL (general and power-of-two paths,
MUL multipliers of 1 or more), LOGISTIC / TANH at power-of-two input scales (gemmlowp's
fixed-point functions): each numpy reference over random draws, and the GPU's outputs equal to
LiteRT's. (LOGISTIC / TANH at other scales, ADD / SUB with default options:
tests/test_tflite_quantized.py.)"""

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


def _pot_lut_scales():
    """LOGISTIC / TANH input scales around the power-of-two path: 2^-12 and 2^-11 exactly and
    within CheckedLog2's tolerance (3 random draws each: still "powers of two" to LiteRT), and
    2^-13, 2^-10 (powers of two whose shift sends them to the table)."""
    rng = np.random.default_rng(45)
    near = [float(np.float32(2.0**e * f)) for e in (-12, -11) for f in rng.uniform(1 - 6e-4, 1 + 6e-4, 3)]
    return [2.0**-12, 2.0**-11, *near, 2.0**-13, 2.0**-10]


_LUT = {"LOGISTIC": int16.logistic_reference, "TANH": int16.tanh_reference}


@pytest.mark.parametrize("op", list(_LUT))
def test_pot_lut_references_match_litert(op):
    """int16 LOGISTIC / TANH at power-of-two input scales: the reference (gemmlowp's fixed-point
    logistic at 2^-12, tanh at 2^-12 and 2^-11: fixedpoint.py; the table elsewhere) equals LiteRT
    for every int16 input (10 scales, 655360 outputs)."""
    for s in _pot_lut_scales():
        data = _unary(op, s)
        want = _litert(data, [ALL.astype(np.int16)])[0]
        got = _LUT[op](ALL, read(bytes(data)).tensors[0])
        np.testing.assert_array_equal(got, want, err_msg=f"input scale {s}")


@pytest.mark.parametrize("op", list(_LUT))
def test_pot_lut_exact_on_gpu(ctx, op):
    """The same on the GPU, every int16 input (the real-value form these scales kept was a quantum
    or more off)."""
    for s in _pot_lut_scales()[:4]:
        feeds = [(ALL * np.float64(np.float32(s))).astype(np.float32)]
        data = _unary(op, s, float_io=True)
        np.testing.assert_array_equal(run_model(ctx, data, feeds)[1][0], _litert(data, feeds)[0], err_msg=f"{s}")


def _scales(rng, kind):
    """Random input and output scales (float32) of a binary case: "general" log-uniform (a MUL's
    output scale above the product's: a multiplier under 1); "pot": powers of two, one input at
    the output's scale, the other up to 2^7 finer (the power-of-two ADD / SUB); "large": a MUL's
    output scale up to 2e4 times below the product's (a multiplier of 1 or more)."""
    if kind == "pot":
        lo, d = int(rng.integers(-16, -6)), int(rng.integers(0, 8))
        pair = (2.0**lo, 2.0 ** (lo - d))
        return (*(pair if rng.integers(2) else pair[::-1]), 2.0**lo)
    sa, sb = (float(np.float32(v)) for v in np.exp(rng.uniform(np.log(1e-5), np.log(1e-2), 2)))
    if kind == "large":
        return sa, sb, float(np.float32(sa * sb / np.exp(rng.uniform(0.0, np.log(2e4)))))
    lo = np.log(sa * sb * 1.01) if kind == "mul" else np.log(1e-5)
    return sa, sb, float(np.float32(np.exp(rng.uniform(lo, lo + 6 if kind == "mul" else np.log(2e-3)))))


def _binary_case(op, seed, float_io=False, kind="general"):
    """A random int16 ADD / SUB / MUL of [64, 256] and [64, 256] (odd seeds) or [1, 256] inputs
    (never for a power-of-two ADD, on which LiteRT aborts), scales as _scales makes them; ADD and
    SUB ask for the power-of-two path (PotScaleInt16) only with power-of-two scales. Large MUL
    multipliers: the inputs 256 times narrower on every third seed (a product that does not wrap)."""
    rng = np.random.default_rng(seed)
    sa, sb, so = _scales(rng, "mul" if op == "MUL" and kind == "general" else kind)
    shapes = [(64, 256), (64, 256) if seed % 2 or (op, kind) == ("ADD", "pot") else (1, 256)]
    qs = [rng.integers(-(1 << 15), 1 << 15, s) // (256 if kind == "large" and seed % 3 == 0 else 1) for s in shapes]
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
    if op == "MUL":
        w.op(op, ins, [y], "MulOptions", version=5)
    else:
        w.op(op, ins, [y], f"{op.capitalize()}Options", version=5 if op == "SUB" else 4, PotScaleInt16=kind == "pot")
    if not float_io:
        return w.finish(xs, [y]), [q.astype(np.int16) for q in qs]
    out = w.tensor("out", [64, 256])
    w.op("DEQUANTIZE", [y], [out], version=2)
    return w.finish(xs, [out]), [(q * np.float64(sc)).astype(np.float32) for q, sc in zip(qs, (sa, sb))]


def _pot_reference(op):
    def ref(a, c, ta, tc, to):
        shifts = int16.pot_shifts(ta, tc, to, True)
        assert shifts is not None and 0 in shifts
        return int16.pot_add_sub_reference(a, c, shifts, op == "SUB")

    return ref


_CASES = {  # (operator, kind of scales): its numpy reference
    ("ADD", "general"): int16.add_reference,
    ("SUB", "general"): lambda *a: int16.add_reference(*a, subtract=True),
    ("MUL", "general"): int16.mul_reference,
    ("ADD", "pot"): _pot_reference("ADD"),
    ("SUB", "pot"): _pot_reference("SUB"),
    ("MUL", "large"): int16.mul_reference,
}


@pytest.mark.parametrize("op, kind", list(_CASES))
def test_binary_references_match_litert(op, kind):
    """int16 ADD / SUB (add_reference: the inputs rescaled with one rounding in a same-shape ADD,
    two in a broadcast ADD and in SUB; pot_add_sub_reference on the power-of-two path), MUL
    (mul_reference: float32 scale quotient, two roundings; a multiplier of 1 or more wrapping the
    shifted product in int32) equal LiteRT over 48 random scale draws (786432 outputs),
    broadcast or not. (One rounding in place of two, or the reverse, changes about one output in
    160000: ADD's seeds 5 and 37 (one shape), 40 and 44 (broadcast), SUB's 11, 20, 30...)"""
    for seed in range(48):
        data, feeds = _binary_case(op, seed, kind=kind)
        want = _litert(data, feeds)[0]
        m = read(bytes(data))
        ts = [m.tensors[i] for i in (*m.inputs, m.outputs[0])]
        assert np.ptp(want.astype(np.float64)) > 0
        np.testing.assert_array_equal(_CASES[op, kind](*feeds, *ts), want, err_msg=f"seed {seed}")


_GPU_SEEDS = {("ADD", "general"): (0, 1, 5, 40), ("SUB", "general"): (0, 1, 11, 20)}


@pytest.mark.parametrize("op, kind", list(_CASES))
def test_binary_exact_on_gpu(ctx, op, kind):
    """QUANTIZE -> ADD / SUB / MUL -> DEQUANTIZE on the GPU equals LiteRT (4 draws each, ADD's and
    SUB's general path on two where the rounding of the inputs tells)."""
    for seed in _GPU_SEEDS.get((op, kind), range(4)):
        data, feeds = _binary_case(op, seed, float_io=True, kind=kind)
        want = _litert(data, feeds)[0]
        np.testing.assert_array_equal(run_model(ctx, data, feeds)[1][0], want, err_msg=f"seed {seed}")
