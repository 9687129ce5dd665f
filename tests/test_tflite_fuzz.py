"""Mutation fuzzing of the TFLite importer: corrupted copies of the selfie segmentation model
(bit flips, zeroed runs, truncation, swapped tables) either import or raise mltensor.DataError /
NotSupportedError; nothing else escapes, nothing hangs. A quick run by default; with -m slow,
600 mutants of the selfie model and 300 of the sparse and custom-operator models."""

import faulthandler
import struct
import time

import numpy as np
import pytest
import tflite

import mltensor
from mltensor import models
from mltensor.tflite import import_model


@pytest.fixture(scope="module")
def selfie():
    try:
        path = models.fetch("selfie_segmentation", progress=False)
    except models.FetchError as e:
        pytest.skip(f"the selfie model cannot be fetched: {e}")
    with open(path, "rb") as f:
        return f.read()


def _table_vectors(data):
    """(position, length) of the offset vectors of tables in the model: operator codes, buffers,
    subgraph tensors and operators; swapping two of their entries swaps two tables."""
    m = tflite.Model.GetRootAsModel(data, 0)
    sg = m.Subgraphs(0)
    out = []
    for tab, field, n in [(m._tab, 6, m.OperatorCodesLength()), (m._tab, 12, m.BuffersLength()),
                          (sg._tab, 4, sg.TensorsLength()), (sg._tab, 10, sg.OperatorsLength())]:  # fmt: skip
        o = tab.Offset(field)
        if o and n > 1:
            out.append((tab.Vector(o), n))
    return out


def mutate(data, rng, vectors):
    """One corrupted copy of `data` and a word for what was done."""
    b = bytearray(data)
    kind = rng.choice(["flip", "flip", "zero", "truncate", "swap", "swap_words", "header"])
    if kind == "flip":
        for _ in range(int(rng.integers(1, 9))):
            i = int(rng.integers(len(b)))
            b[i] ^= 1 << int(rng.integers(8))
    elif kind == "zero":
        i = int(rng.integers(len(b)))
        b[i : i + int(rng.integers(1, 65))] = bytes(min(len(b) - i, 64))[: len(b[i : i + 64])]
    elif kind == "truncate":
        b = b[: int(rng.integers(len(b)))]
    elif kind == "swap":  # two entries of a vector of tables: each uoffset is relative to itself
        pos, n = vectors[int(rng.integers(len(vectors)))]
        i, j = (int(v) for v in rng.choice(n, 2, replace=False))
        pi, pj = pos + 4 * i, pos + 4 * j
        ti = pi + struct.unpack_from("<I", b, pi)[0]
        tj = pj + struct.unpack_from("<I", b, pj)[0]
        struct.pack_into("<I", b, pi, tj - pi)
        struct.pack_into("<I", b, pj, ti - pj)
    elif kind == "swap_words":  # two aligned runs of bytes anywhere
        n = 4 * int(rng.integers(1, 9))
        i, j = (4 * int(v) for v in rng.integers(0, (len(b) - n) // 4, 2))
        b[i : i + n], b[j : j + n] = bytes(b[j : j + n]), bytes(b[i : i + n])
    else:  # the root offset and the identifier
        i = int(rng.integers(8))
        b[i] = int(rng.integers(256))
    return bytes(b), kind


def run_mutants(ctx, data, n, seed):
    rng = np.random.default_rng(seed)
    vectors = _table_vectors(data)
    outcomes = {"imported": 0, "DataError": 0, "NotSupportedError": 0}
    slowest = 0.0
    for k in range(n):
        mutant, kind = mutate(data, rng, vectors)
        t = time.perf_counter()
        # A hang would block the run forever: past 5 minutes, dump every thread's stack and exit.
        faulthandler.dump_traceback_later(300, exit=True)
        try:
            graph, _, _ = import_model(mutant, ctx)
        except mltensor.DataError as e:
            assert str(e).startswith("[tflite]"), e
            outcomes["DataError"] += 1
        except mltensor.NotSupportedError as e:
            assert str(e).startswith("[tflite]"), e
            outcomes["NotSupportedError"] += 1
        except Exception as e:  # anything else is a bug: say which mutant
            raise AssertionError(f"mutant {k} (seed {seed}, {kind}) raised {type(e).__name__}: {e}") from e
        else:
            graph.destroy()
            outcomes["imported"] += 1
        finally:
            faulthandler.cancel_dump_traceback_later()
        slowest = max(slowest, time.perf_counter() - t)
    return outcomes, slowest


def test_errors_name_the_file_and_field(ctx, selfie, tmp_path):
    path = tmp_path / "cut.tflite"
    n = len(selfie) // 3
    path.write_bytes(selfie[:n])
    with pytest.raises(
        mltensor.DataError, match=rf"^\[tflite\] cut\.tflite: the model table: reads past the end of the {n}-byte file"
    ):
        import_model(str(path), ctx)
    # A buffer index out of range, named down to the tensor.
    bad = bytearray(selfie)
    m = tflite.Model.GetRootAsModel(selfie, 0)
    t = m.Subgraphs(0).Tensors(5)
    o = t._tab.Offset(8)  # Tensor.buffer
    struct.pack_into("<I", bad, t._tab.Pos + o, 100000)
    with pytest.raises(
        mltensor.DataError, match=r"subgraph 0, tensor 5 \('.*'\), buffer: buffer index 100000 is out of range"
    ):
        import_model(bytes(bad), ctx)
    with pytest.raises(mltensor.DataError, match=r"^\[tflite\] cut\.tflite: the model table: reads past the end"):
        mltensor.InferenceSession(str(path), context=ctx)
    with pytest.raises(mltensor.DataError, match="file identifier"):
        import_model(b"\0" * 100, ctx)
    with pytest.raises(mltensor.DataError, match="TFL3"):
        import_model(b"", ctx)


def test_corrupt_shape_is_data_error(ctx):
    """A shape that no longer matches what the operator computes is caught, not built."""
    from mltensor.tflite.writer import ModelWriter

    w = ModelWriter()
    x = w.input("x", [1, 4, 4, 2])
    y = w.tensor("y", [1, 4, 4, 1 << 20])
    w.op("RELU", [x], [y])
    with pytest.raises(mltensor.DataError, match=r"operator 0 \(RELU\) computes tensor 1 \('y'\) with shape"):
        import_model(w.finish([x], [y]), ctx)


def test_fuzz_quick(ctx, selfie):
    outcomes, slowest = run_mutants(ctx, selfie, 24, seed=0)
    assert sum(outcomes.values()) == 24
    assert outcomes["DataError"] > 0  # the mutations do reach the error paths
    assert slowest < 60


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,seed,n",
    [
        ("selfie_segmentation", 1, 200),
        ("selfie_segmentation", 2, 200),
        ("selfie_segmentation", 3, 200),
        ("face_detection_full_range_sparse", 4, 200),  # sparse constants
        ("face_landmark_with_attention", 5, 100),  # custom operators' flexbuffer options
    ],
)
def test_fuzz_many(ctx, name, seed, n):
    try:
        path = models.fetch(name, progress=False)
    except models.FetchError as e:
        pytest.skip(f"the model cannot be fetched: {e}")
    with open(path, "rb") as f:
        data = f.read()
    outcomes, slowest = run_mutants(ctx, data, n, seed=seed)
    print(f"{name}, seed {seed}: {outcomes}, slowest mutant {slowest:.2f} s")
    assert sum(outcomes.values()) == n
    assert slowest < 60
