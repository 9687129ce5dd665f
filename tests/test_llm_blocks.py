"""GGUF block formats decoded on the GPU, still packed (mltensor/ops/blocks.py): random but
well-formed blocks of each type (random quant bytes, small float16 scales), the GEMV (decode),
the tiled GEMM (prompts, M static or known at dispatch) and the embedding gather against the
`gguf` package's own dequantizer (`gguf.quants.dequantize`) and numpy."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

import mltensor  # noqa: E402
from mltensor import MLDynamicDimension, MLGraphBuilder  # noqa: E402
from mltensor.errors import DataError, NotSupportedError  # noqa: E402
from mltensor.ops.blocks import BLOCK_TYPES, block_words, pack_blocks  # noqa: E402

# byte offsets of the float16 fields of each block (scales, mins): set to small finite values
F16_FIELDS = {
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "IQ4_NL": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_XS": (0,),
}
KINDS = list(BLOCK_TYPES)


@pytest.fixture(scope="module")
def ctx():
    return mltensor.ml.create_context_sync()


def random_blocks(kind, rows, cols, rng):
    """The bytes [rows, row bytes] of a `kind` tensor: random quant bytes, float16 scales of
    magnitude ~0.01-0.1 with both signs (mins too), one all-zero block."""
    bv, bb, _ = BLOCK_TYPES[kind]
    nb = rows * cols // bv
    if kind == "BF16":
        v = rng.standard_normal(rows * cols).astype(np.float32)
        raw = (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return raw.reshape(rows, -1)
    raw = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    for off in F16_FIELDS[kind]:
        d = (rng.uniform(0.01, 0.1, nb) * rng.choice([-1, 1], nb)).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(nb, 2)
    raw[min(1, nb - 1)] = 0  # an all-zero block (d == 0)
    return raw.reshape(rows, -1)


def reference(kind, raw):
    return dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).astype(np.float64)


def rel_err(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def _run(ctx, g, feeds, out_shape, out_dyn=None):
    tins = {}
    for name, (arr, shape) in feeds.items():
        t = ctx.create_tensor_sync(data_type=str(arr.dtype), shape=shape, writable=True)
        ctx.write_tensor(t, arr)
        tins[name] = t
    ty = ctx.create_tensor_sync(data_type="float32", shape=out_dyn or out_shape, readable=True)
    ctx.dispatch(g, tins, {"y": ty})
    return ctx.read_tensor_sync(ty)


def _matmul(ctx, kind, words, a, K, N, dynamic=False):
    m = a.shape[0]
    b = MLGraphBuilder(ctx)
    shape = [MLDynamicDimension("m", 16), K] if dynamic else [m, K]
    x = b.input("a", data_type="float32", shape=shape)
    y = b._matmul_blocks(x, b.constant(words), kind=kind, K=K, N=N)
    g = b.build_sync({"y": y})
    out_dyn = [MLDynamicDimension("m", 16), N] if dynamic else None
    return _run(ctx, g, {"a": (a, shape)}, [m, N], out_dyn)


@pytest.mark.parametrize("kind", KINDS)
def test_block_matmul_matches_gguf_dequantize(ctx, kind):
    rng = np.random.default_rng(sum(map(ord, kind)))
    bv = BLOCK_TYPES[kind][0]
    K = 2 * bv if bv == 256 else 96
    N = 37  # odd: the GEMV's last thread has one row
    raw = random_blocks(kind, N, K, rng)
    ref = reference(kind, raw)
    assert ref.shape == (N, K) and np.isfinite(ref).all()
    words = pack_blocks(kind, raw, N, K)
    assert words.dtype == np.uint32 and words.shape == (block_words(kind, N, K),)
    assert words.nbytes <= raw.nbytes + 4  # the file's bytes, at most 2 bytes of padding
    # M = 1, 3: the GEMV (decode); 7: the tiled GEMM; 5 with M known at dispatch: tiled too
    for m, dynamic in ((1, False), (3, False), (7, False), (5, True)):
        a = rng.standard_normal((m, K)).astype(np.float32)
        got = _matmul(ctx, kind, words, a, K, N, dynamic)
        assert got.shape == (m, N)
        err = rel_err(got, a.astype(np.float64) @ ref.T)
        assert err < 2e-6, (kind, m, dynamic, err)


@pytest.mark.parametrize("kind", KINDS)
def test_block_gather_matches_gguf_dequantize(ctx, kind):
    rng = np.random.default_rng(100 + sum(map(ord, kind)))
    bv = BLOCK_TYPES[kind][0]
    V, H = 21, (bv if bv == 256 else 64)
    raw = random_blocks(kind, V, H, rng)
    ref = reference(kind, raw).astype(np.float32)
    ids = np.array([0, 1, 20, -1, 7, 7, 13], np.int32)
    b = MLGraphBuilder(ctx)
    shape = [MLDynamicDimension("n", 16)]
    x = b.input("ids", data_type="int32", shape=shape)
    y = b._gather_blocks(b.constant(pack_blocks(kind, raw, V, H)), x, kind=kind, V=V, H=H)
    g = b.build_sync({"y": y})
    got = _run(ctx, g, {"ids": (ids, shape)}, [len(ids), H], [MLDynamicDimension("n", 16), H])
    assert got.shape == (len(ids), H)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref[ids % V], rtol=1e-6, atol=1e-6 * np.abs(ref).max())


def test_pack_blocks_rejects_bad_input():
    with pytest.raises(DataError, match="256"):
        pack_blocks("Q4_K", np.zeros(144, np.uint8), 1, 128)
    with pytest.raises(DataError, match="bytes"):
        pack_blocks("Q6_K", np.zeros(200, np.uint8), 1, 256)
    with pytest.raises(NotSupportedError, match="IQ2_XXS"):
        pack_blocks("IQ2_XXS", np.zeros(66, np.uint8), 1, 256)
