"""torch.roll as exporters write it, concat(x[s:], x[:s]) along an axis (compiler/fusion/roll.py):
one gather an axis, values equal to numpy's roll; slices that are not a roll stay slices."""

import numpy as np
import pytest
from helpers import FUSION, dispatch_at

import mltensor


def _roll(b, x, shift, axis):
    n = x.shape[axis]
    s = -shift % n  # torch.roll(x, shift): the first element comes from position -shift
    starts, sizes = [0] * x.rank, list(x.shape)
    head = b.slice(x, starts[:axis] + [s] + starts[axis + 1 :], sizes[:axis] + [n - s] + sizes[axis + 1 :])
    tail = b.slice(x, starts, sizes[:axis] + [s] + sizes[axis + 1 :])
    return b.concat([head, tail], axis)


@pytest.mark.parametrize("shifts", [(2, 3), (-1, 5), (4, -2)])
def test_roll_is_one_gather_an_axis(ctx, shifts):
    """Swin's cyclic shift of a [B, H, W, C] map over H and W, then a relu: two gathers and the
    relu, numpy's roll."""
    rng = np.random.default_rng(0)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 6, 7, 4])
    y = _roll(b, _roll(b, x, shifts[0], 1), shifts[1], 2)
    g = b.build_sync({"y": b.relu(y)})
    xa = rng.standard_normal((2, 6, 7, 4)).astype(np.float32)
    want = np.maximum(np.roll(xa, shifts, axis=(1, 2)), 0)
    np.testing.assert_array_equal(dispatch_at(ctx, g, {"x": xa})["y"], want)
    if FUSION:
        assert [k.split("_")[0] for k in g.kernel_names].count("gather") == 2, g.kernel_names
        assert not [k for k in g.kernel_names if k.startswith(("slice", "concat"))], g.kernel_names
    g.destroy()


def test_slices_that_are_not_a_roll_stay(ctx):
    """concat(x[2:], x[:3]) (overlapping: not a permutation) keeps its slices and concat."""
    rng = np.random.default_rng(1)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[6, 3])
    y = b.concat([b.slice(x, [2, 0], [4, 3]), b.slice(x, [0, 0], [3, 3])], 0)
    g = b.build_sync({"y": y})
    xa = rng.standard_normal((6, 3)).astype(np.float32)
    np.testing.assert_array_equal(dispatch_at(ctx, g, {"x": xa})["y"], np.concatenate([xa[2:], xa[:3]]))
    if FUSION:
        assert not [k for k in g.kernel_names if k.startswith("gather")], g.kernel_names
    g.destroy()
