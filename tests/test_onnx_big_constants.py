"""Constants above the context's max_tensor_byte_length (mltensor/onnx/ops/_blocks.py): an
embedding table read by Gather and, tied, by the LM head (MatMul of its transpose, or Gemm with
transB), split into blocks that fit. The limit is lowered for one context (`ctx._max_bytes`, the
attribute the builder's check reads) so that a small table is just over it; results against
numpy."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from mltensor import InferenceSession, ml
from mltensor.onnx import UnsupportedError

V, D = 600, 64  # 153,600 bytes of float32, 256 a row


@pytest.fixture
def capped():
    """A context whose largest tensor is lowered to `cap` bytes: capped(cap) -> context."""
    made = []

    def make(cap):
        c = ml.create_context_sync()
        c._max_bytes = cap
        made.append(c)
        return c

    yield make
    for c in made:
        c.destroy()


def _largest_binding(s):
    """The largest buffer any launch of the session's builds binds (the graph's own buffers: the
    caller's tensors are checked against the limit when made). The compiler may merge the
    blocks' matmuls (compiler/fusion/gemm_views.py): each block must stay a binding of its own."""
    launches = [x for sp in s._specs.values() for x in sp.graph._program.launches]
    return max(b.size for launch in launches for b in launch[2] if hasattr(b, "size"))


def _model(nodes, inputs, outputs, inits):
    g = h.make_graph(nodes, "g", inputs, outputs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _tied(table, idx_type=T.INT64, gemm=False):
    """ids [batch, seq] -> (embeddings, logits): Gather(table, ids) and the tied head, MatMul(e,
    Transpose(table)) or Gemm(e, table, bias, transB=1) on e as rows."""
    nodes = [h.make_node("Gather", ["table", "ids"], ["emb"])]
    inits = [numpy_helper.from_array(table, "table")]
    if gemm:
        inits += [
            numpy_helper.from_array(np.array([-1, D], np.int64), "rows"),
            numpy_helper.from_array(np.linspace(-1, 1, V, dtype=np.float32), "bias"),
        ]
        nodes += [
            h.make_node("Reshape", ["emb", "rows"], ["e2"]),
            h.make_node("Gemm", ["e2", "table", "bias"], ["logits"], transB=1, alpha=0.5, beta=2.0),
        ]
        out_shape = [None, V]
    else:
        nodes += [
            h.make_node("Transpose", ["table"], ["tt"], perm=[1, 0]),
            h.make_node("MatMul", ["emb", "tt"], ["logits"]),
        ]
        out_shape = ["batch", "seq", V]
    return _model(
        nodes,
        [h.make_tensor_value_info("ids", idx_type, ["batch", "seq"])],
        [
            h.make_tensor_value_info("emb", T.FLOAT, ["batch", "seq", D]),
            h.make_tensor_value_info("logits", T.FLOAT, out_shape),
        ],
        inits,
    )


def _ids(rng, shape, edges):
    """Random rows in [-V, V) with the block edges, first/last rows and negative ones placed first."""
    ids = rng.integers(-V, V, size=shape).reshape(-1)
    take = min(len(edges), ids.size)
    ids[:take] = edges[:take]
    return ids.reshape(shape)


def _edges(cap):
    """Row indices at every block boundary for `cap`, the first and last rows, and their negative
    forms."""
    per = cap // (D * 4)
    count = -(-V // per)
    step = -(-V // count)
    out = [0, V - 1, -1, -V]
    for lo in range(step, V, step):
        out += [lo - 1, lo, lo - 1 - V, lo - V]
    return out


@pytest.mark.parametrize("cap", [V * D * 4 - 1, 60000, 40000])  # 2, 3 and 4 blocks
@pytest.mark.parametrize("idx_type", [T.INT64, T.INT32])
def test_gather_and_tied_matmul_over_the_limit(capped, cap, idx_type):
    rng = np.random.default_rng(cap)
    table = rng.standard_normal((V, D)).astype(np.float32)
    c = capped(cap)
    # dynamic dimensions bounded so that the logits fit the lowered limit: one build, the index
    # count read at dispatch
    s = InferenceSession(_tied(table, idx_type), c, cache=False, max_dimensions={"batch": 2, "seq": 8})
    edges = _edges(cap)
    dt = np.int64 if idx_type == T.INT64 else np.int32
    # several index counts through that build, the first holding every edge (sizes of 1 get
    # builds of their own: docs/guides/sessions.md)
    for shape in ((2, (len(edges) + 1) // 2), (2, 3), (2, 5), (1, 5), (1, 1)):
        ids = _ids(rng, shape, edges).astype(dt)
        emb, logits = s.run(None, {"ids": ids})
        want = table[ids]
        np.testing.assert_array_equal(emb, want)  # a gather copies rows: exact
        np.testing.assert_allclose(logits, want @ table.T, rtol=1e-4, atol=1e-4)
    assert s.stats["dynamic"], s.stats["static_reason"]
    assert _largest_binding(s) <= cap
    s.close()


def test_gemm_transposed_weight_over_the_limit(capped):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((V, D)).astype(np.float32)
    cap = 60000
    s = InferenceSession(_tied(table, gemm=True), capped(cap), cache=False)
    bias = np.linspace(-1, 1, V, dtype=np.float32)
    for shape in ((2, 9), (1, 3)):
        ids = _ids(rng, shape, _edges(cap))
        emb, logits = s.run(None, {"ids": ids})
        e = table[ids].reshape(-1, D)
        np.testing.assert_array_equal(emb, table[ids])
        np.testing.assert_allclose(logits, 0.5 * e @ table.T + 2.0 * bias, rtol=1e-4, atol=1e-4)
    s.close()


def test_gemm_computed_c_over_the_limit(capped):
    """A Gemm whose C is computed (not a host bias, so not split with the weight): added after."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((D, V)).astype(np.float32)
    m = _model(
        [h.make_node("Gemm", ["a", "w", "c"], ["y"], beta=0.5)],
        [h.make_tensor_value_info("a", T.FLOAT, [3, D]), h.make_tensor_value_info("c", T.FLOAT, [3, V])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, V])],
        [numpy_helper.from_array(w, "w")],
    )
    a = rng.standard_normal((3, D)).astype(np.float32)
    cc = rng.standard_normal((3, V)).astype(np.float32)
    s = InferenceSession(m, capped(60000), cache=False)
    (y,) = s.run(None, {"a": a, "c": cc})
    np.testing.assert_allclose(y, a @ w + 0.5 * cc, rtol=1e-4, atol=1e-4)
    s.close()


@pytest.mark.parametrize("vector", [False, True])
def test_matmul_constant_a_over_the_limit(capped, vector):
    """MatMul(table, x): the constant as A, one product per row block (x a matrix or a vector)."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((V, D)).astype(np.float32)
    xs = [D] if vector else [D, 3]
    m = _model(
        [h.make_node("MatMul", ["table", "x"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, xs)],
        [h.make_tensor_value_info("y", T.FLOAT, [V] if vector else [V, 3])],
        [numpy_helper.from_array(table, "table")],
    )
    x = rng.standard_normal(xs).astype(np.float32)
    s = InferenceSession(m, capped(60000), cache=False)
    (y,) = s.run(None, {"x": x})
    np.testing.assert_allclose(y, table @ x, rtol=1e-4, atol=1e-4)
    s.close()


def test_other_readers_keep_the_error(capped):
    """A reader that cannot be rewritten onto blocks (here an elementwise Add) fails at import,
    naming the node and the limit."""
    table = np.ones((V, D), np.float32)
    m = _model(
        [h.make_node("Add", ["table", "x"], ["y"], name="add_the_table")],
        [h.make_tensor_value_info("x", T.FLOAT, [1, D])],
        [h.make_tensor_value_info("y", T.FLOAT, [V, D])],
        [numpy_helper.from_array(table, "table")],
    )
    with pytest.raises(UnsupportedError, match=r"add_the_table.*exceeds max_tensor_byte_length 60000"):
        InferenceSession(m, capped(60000), cache=False)
