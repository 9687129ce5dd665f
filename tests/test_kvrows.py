"""`_attention_rows` (ops/kvrows.py: the serving step's attention over a KV cache of slots) against
numpy, in both kernels: the workgroup-per-(row, head) one GPUs take and the thread-per-(row, head)
one CPU adapters take (kvrows.wgsl CPU), each forced here whatever the adapter is."""

import numpy as np
import pytest

from mltensor import MLGraphBuilder
from mltensor.dynamic.dims import MLDynamicDimension
from mltensor.ops import kvrows

SLOT = 40  # positions a slot holds (max_len)


@pytest.fixture(params=["cpu", "workgroup"])
def kernel(request, monkeypatch):
    monkeypatch.setattr(kvrows, "cpu_device", lambda device: request.param == "cpu")
    return request.param


def _reference(q, k, v, rows, scale, window, softcap, ring):
    """rows: (slot, position) of each query row; k, v: the whole cache [slots * P, HKV, D]."""
    R, H, _ = q.shape
    grp = H // k.shape[1]
    out = np.zeros((R, H, v.shape[2]))
    for r, (slot, p) in enumerate(rows):
        keys = np.arange(max(0, p + 1 - window) if window else 0, p + 1)
        at = slot * (ring or SLOT) + (keys % ring if ring else keys)
        for h in range(H):
            s = k[at, h // grp].astype(np.float64) @ q[r, h].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            e = np.exp(s - s.max())
            out[r, h] = e @ v[at, h // grp].astype(np.float64) / e.sum()
    return out


@pytest.mark.parametrize(
    "dtype, heads, kv_heads, d, dv, window, softcap, ring",
    [
        ("float32", 4, 2, 16, 16, 0, 0.0, 0),
        ("float32", 6, 3, 64, 32, 0, 0.0, 0),  # grouped-query, v's head size not q's
        ("float32", 4, 4, 8, 8, 7, 2.5, 0),  # a sliding window and a soft cap
        ("float32", 2, 1, 16, 16, 6, 0.0, 9),  # a ring of 9 positions a slot (window 6)
        ("float16", 4, 2, 16, 16, 0, 0.0, 0),
    ],
)
def test_attention_rows_against_numpy(ctx, kernel, dtype, heads, kv_heads, d, dv, window, softcap, ring):
    rng = np.random.default_rng(heads * 100 + d + window)
    slots, per = 3, ring or SLOT
    # rows of one step: sequences at different positions, one of them two rows (a prompt chunk)
    rows = [(0, 0), (2, 17), (1, 33), (1, 34), (0, 25)]
    k = (2 * rng.standard_normal((slots * per, kv_heads, d))).astype(dtype)
    v = rng.standard_normal((slots * per, kv_heads, dv)).astype(dtype)
    q = rng.standard_normal((len(rows), heads, d)).astype(dtype)
    dst = np.array([s * per + (p % ring if ring else p) for s, p in rows], np.int32)
    pos = np.array([p for _, p in rows], np.int32)
    b = MLGraphBuilder(ctx)
    n = MLDynamicDimension("rows", 8)
    ins = {
        "q": b.input("q", data_type=dtype, shape=[n, heads, d]),
        "k": b.input("k", data_type=dtype, shape=list(k.shape)),
        "v": b.input("v", data_type=dtype, shape=list(v.shape)),
        "dst": b.input("dst", data_type="int32", shape=[n]),
        "pos": b.input("pos", data_type="int32", shape=[n]),
    }
    scale = d**-0.5
    y = b._attention_rows(*ins.values(), scale=scale, max_len=SLOT, softcap=softcap, window=window, ring=ring)
    g = b.build_sync({"y": y})
    arrays = {"q": q, "k": k, "v": v, "dst": dst, "pos": pos}
    (name,) = g.kernels_run({n: a.shape for n, a in arrays.items()})
    assert name.endswith("_cpu") == (kernel == "cpu"), name
    feeds = {}
    for n, a in arrays.items():
        feeds[n] = ctx.create_tensor_sync(data_type=str(a.dtype), shape=list(a.shape), writable=True)
        ctx.write_tensor(feeds[n], a)
    out = ctx.create_tensor_sync(data_type=dtype, shape=[len(rows), heads, dv], readable=True)
    ctx.dispatch(g, feeds, {"y": out})
    got = ctx.read_tensor_sync(out)
    want = _reference(q, k, v, rows, scale, window, softcap, ring)
    tol = 2e-3 if dtype == "float16" else 2e-6
    np.testing.assert_allclose(got.astype(np.float64), want, atol=tol, rtol=tol)
