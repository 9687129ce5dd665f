"""Tables over the adapter's largest tensor (max_tensor_byte_length; lavapipe and WebGPU's default:
128 MiB): an embedding Gather of such a host table runs as gathers of row blocks that fit
(onnx/ops/indexing.py `_gather_rows`), and the tied LM head reading the same table transposed as
matmuls of column slices (onnx/ops/matmul.py), as GPT-2's real-size export needs. Forced here by
lowering one context's limit; checked against numpy. The real GPT-2 and RoBERTa exports run in
tests/test_corpus.py (real sizes, `slow`)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mltensor import InferenceSession, NotSupportedError, ml

V, H = 1000, 256  # 1024 bytes a row


def _model(tied=True, index_type=TensorProto.INT64):
    rng = np.random.default_rng(5)
    table = rng.standard_normal((V, H)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"], axis=0)]
    outputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["seq", H])]
    inits = [numpy_helper.from_array(table, "table")]
    if tied:  # the LM head: h @ table^T, the transposed table folded at import
        nodes += [
            helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["h", "table_t"], ["logits"]),
        ]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["seq", V]))
    g = helper.make_graph(
        nodes, "big_table", [helper.make_tensor_value_info("ids", index_type, ["seq"])], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), table


LIMIT = 300000


@pytest.fixture
def small_ctx():
    c = ml.create_context_sync()
    # 300000 bytes: blocks of 291 rows (and their zero row), 4 blocks; the tied head's [256, 1000]
    # table 4 slices of 250 columns; the logits of up to 75 ids fit
    c._max_bytes = LIMIT
    yield c
    c.destroy()


@pytest.mark.parametrize("index_type", [TensorProto.INT64, TensorProto.INT32])
def test_gather_and_tied_head_over_the_limit(small_ctx, index_type):
    m, table = _model(index_type=index_type)
    s = InferenceSession(m, small_ctx)
    per = LIMIT // (4 * H) - 1
    dt = np.int64 if index_type == TensorProto.INT64 else np.int32
    for ids in (
        [0, per - 1, per, per + 1, 2 * per, V - 1, -1, -V, 7],  # block edges, the last row, negatives
        [3],
        list(range(V - 40, V)) + list(range(-30, 0)),
    ):
        ids = np.array(ids, dt)
        h, logits = s.run(None, {"ids": ids})
        want = table[ids]
        np.testing.assert_array_equal(h, want)
        ref = want.astype(np.float64) @ table.T.astype(np.float64)  # (sums of 256 float32 products)
        np.testing.assert_allclose(logits, ref, rtol=1e-5, atol=2e-6 * np.abs(ref).max())
    s.close()


def test_the_table_fits_one_block_when_the_limit_allows(ctx):
    """Unchanged where the table fits: one gather kernel, the same rows."""
    m, table = _model(tied=False)
    s = InferenceSession(m, ctx)
    ids = np.array([5, -2, 999], np.int64)
    (h,) = s.run(None, {"ids": ids})
    np.testing.assert_array_equal(h, table[ids])
    assert sum("gather" in k for k in s.graph.kernel_names) == 1, s.graph.kernel_names
    s.close()


def test_other_readers_of_a_big_table_are_named(small_ctx):
    """A Gather along another axis of such a table: a NotSupportedError naming it."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((H, V)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["h"], axis=1)],
        "big_table_axis1",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["seq"])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [H, "seq"])],
        [numpy_helper.from_array(table, "table")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NotSupportedError, match="Gather"):
        InferenceSession(m, small_ctx).run(None, {"ids": np.array([1], np.int64)})
