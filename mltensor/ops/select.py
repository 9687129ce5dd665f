"""Data-dependent selections computed on the GPU with static output shapes (issue #27): the
output holds the maximum number of rows, a count says how many are valid, and only that count
(4 bytes) needs to cross to the host. Internal operators (leading underscore) behind ONNX's
NonZero and NonMaxSuppression; shaders/nonzero.wgsl and shaders/nms.wgsl.

`_nonzero(x)` -> (indices, count): indices int64 [r, N] (r = x's rank, 1 for a scalar; N = its
number of elements), ONNX NonZero's layout: column k holds the coordinates of the k-th nonzero
element in row-major order; the columns from `count` on are 0. count: int32 [1]. NaN is nonzero,
-0.0 is zero. An order-preserving compaction: per-block counts, a scan of them, a scatter (one
launch for up to SMALL_BLOCKS blocks of BLOCK elements, else three).

`_nms(boxes, scores, *, max_per_class, iou_threshold, score_threshold, center_point_box)` ->
(selected, count): onnxruntime's NonMaxSuppression, exactly (its order, comparisons and f32
arithmetic; the IoU's division rounded as the CPU rounds it). boxes float32 [B, S, 4], scores
float32 [B, C, S]; selected int64 [B * C * max(1, min(max_per_class, S)), 3] rows (batch, class,
box index) batch-major, then class, then selection order, the rows from `count` on 0; count:
int32 [1]. Three launches: one workgroup per (batch, class) (candidates, sort, greedy pass), a
scan of their counts, the compaction into rows.
"""

import math
import struct

import numpy as np

from .. import dtypes
from ..dynamic.kernels import grid
from ..errors import NotSupportedError
from ..ir.registry import MAX_RANK, builder_op, lowering, register
from ..runtime.wgsl import WORKGROUP, Binding, cpu_device, Kernel
from ._index import chained_coords
from ._checks import check_number, check_support

EPT = 4  # elements a thread owns in a block of the compaction
BLOCK = WORKGROUP * EPT
SMALL_BLOCKS = 8  # up to this many blocks: one single-workgroup launch
SORT_LOCAL = 1024  # NMS keys sorted in workgroup memory at once (8 KiB)
CPU_MAX_KEYS = 1 << 16  # NMS boxes a (batch, class) at most on CPU adapters (greedy_cap)
UNROLL = 8  # NMS candidates a thread tests per iteration of the greedy pass's inner loop
U32_LIMIT = 1 << 32

register("_nonzero", {"input": dtypes.ALL, "indices": ("int64",), "count": ("int32",)}, ranks={"input": (0, MAX_RANK)})
register(
    "_nms",
    {"boxes": ("float32",), "scores": ("float32",), "selected": ("int64",), "count": ("int32",)},
    ranks={"boxes": (3, 3), "scores": (3, 3)},
)


def _f32(x):
    """A Python number as the float32 it rounds to (its bits, its value)."""
    with np.errstate(over="ignore"):
        v = np.float32(x)
    bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    return bits, struct.unpack("<f", struct.pack("<I", bits))[0]


# -- _nonzero -----------------------------------------------------------------------------------


@builder_op
def _nonzero(b, x, *, label=None):
    """(indices int64 [max(rank, 1), N], count int32 [1]): see the module docstring."""
    where = "_nonzero"
    b._operand(x, where, "input")
    check_support(where, input=x)
    n = math.prod(x.shape)
    r = max(x.rank, 1)
    if 2 * r * n >= U32_LIMIT:  # (also keeps the count below 2^31)
        raise TypeError(f"[{where}] the indices of {n} elements (rank {x.rank}) exceed 2^32 words")
    return tuple(b._emit(where, [x], {}, [("int64", (r, n)), ("int32", (1,))], label))


def _input_kind(t):
    if t in ("i64", "u64", "i64e", "u64e"):
        return "b64"
    return {"f32": "f32", "f16": "f16"}.get(t, "b32")


@lowering("_nonzero")
def _lower_nonzero(kc, node):
    x = node.inputs[0]
    idx, count = kc.out(node, 0), kc.out(node, 1)
    shape = tuple(x.shape) or (1,)
    n, r = math.prod(shape), len(shape)
    kind = _input_kind(kc.wtype(x))
    nb = -(-n // BLOCK)
    _, coords = chained_coords("e", shape)
    p = {"N": n, "EPT": EPT, "NB": nb, "R": r, "coords": coords, "kind": kind}
    name = f"nonzero_{kind}_{'x'.join(map(str, shape))}"
    if nb <= SMALL_BLOCKS:
        k = Kernel(
            f"{name}_small",
            "nonzero.wgsl",
            dict(p, path="small"),
            (Binding("x", "u32"), Binding("out", "u32", True), Binding("count", "i32", True)),
        )
        kc.launch(k, [x, idx, count], (1, 1, 1))
        return
    cnt = kc.scratch(4 * (nb + 1))
    k = Kernel(
        f"{name}_count", "nonzero.wgsl", dict(p, path="count"), (Binding("x", "u32"), Binding("cnt", "u32", True))
    )
    kc.launch(k, [x, cnt], grid(nb))
    _scan(kc, nb, cnt, count)
    k = Kernel(
        f"{name}_scatter",
        "nonzero.wgsl",
        dict(p, path="scatter"),
        (Binding("x", "u32"), Binding("cnt", "u32"), Binding("out", "u32", True)),
    )
    kc.launch(k, [x, cnt, idx], grid(nb))


def _scan(kc, nc, cnt, total):
    """cnt[0..nc) -> exclusive prefix sums in place, cnt[nc] and total[0] (int32) = their sum."""
    k = Kernel(
        f"select_scan_n{nc}",
        "nonzero.wgsl",
        {"path": "scan", "NC": nc, "CH": -(-nc // WORKGROUP)},
        (Binding("cnt", "u32", True), Binding("total", "i32", True)),
    )
    kc.launch(k, [cnt, total], (1, 1, 1))


# -- _nms ---------------------------------------------------------------------------------------


def _count(where, what, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"[{where}] {what} must be an integer, got {v!r}")
    return int(v)


@builder_op
def _nms(b, boxes, scores, *, max_per_class, iou_threshold=0.0, score_threshold=None, center_point_box=0, label=None):
    """(selected int64 [B * C * max(1, min(max_per_class, S)), 3], count int32 [1]): see the
    module docstring. max_per_class: an int (negative counts as 0, as onnxruntime);
    iou_threshold: a number in [0, 1]; score_threshold: a number or None (no threshold: every
    score but NaN is a candidate); center_point_box: 0 ([y1, x1, y2, x2], either corner first)
    or 1 ([x_center, y_center, width, height])."""
    where = "_nms"
    b._operand(boxes, where, "boxes")
    b._operand(scores, where, "scores")
    check_support(where, boxes=boxes, scores=scores)
    B, S, four = boxes.shape
    if four != 4:
        raise TypeError(f"[{where}] boxes must have shape [B, S, 4], got {list(boxes.shape)}")
    if scores.shape[0] != B or scores.shape[2] != S:
        raise TypeError(
            f"[{where}] scores must have shape [{B}, C, {S}] for boxes {list(boxes.shape)}, got {list(scores.shape)}"
        )
    C = scores.shape[1]
    mpc = max(_count(where, "max_per_class", max_per_class), 0)
    iou = check_number(where, "iou_threshold", iou_threshold)
    _, iou32 = _f32(iou)
    if not 0.0 <= iou32 <= 1.0:
        raise TypeError(f"[{where}] iou_threshold must be in [0, 1], got {iou_threshold!r}")
    if score_threshold is not None:
        score_threshold = check_number(where, "score_threshold", score_threshold)
    cpb = _count(where, "center_point_box", center_point_box)
    if cpb not in (0, 1):
        raise TypeError(f"[{where}] center_point_box must be 0 or 1, got {center_point_box!r}")
    ms = min(mpc, S)
    W = B * C
    pmax = 1 << (S - 1).bit_length()
    rows = W * max(ms, 1)
    limit = b._context._max_bytes
    for what, words in (
        ("the sort keys", 2 * W * pmax),
        ("the sorted boxes", 4 * W * S),
        ("the selected rows", 6 * rows),
        ("the boxes", 4 * B * S),
    ):
        if words >= U32_LIMIT or 4 * words > limit:
            raise TypeError(
                f"[{where}] {what} of {B} x {C} x {S} boxes exceed the 2^32 words or {limit} bytes a buffer may hold"
            )
    attrs = {"max_per_class": mpc, "iou_threshold": iou32, "score_threshold": score_threshold, "center_point_box": cpb}
    return tuple(b._emit(where, [boxes, scores], attrs, [("int64", (rows, 3)), ("int32", (1,))], label))


@lowering("_nms")
def _lower_nms(kc, node):
    boxes, scores = node.inputs
    sel_out, count = kc.out(node, 0), kc.out(node, 1)
    at = node.attrs
    B, S, _ = boxes.shape
    C = scores.shape[1]
    W = B * C
    ms = min(at["max_per_class"], S)
    st = at["score_threshold"]
    name = f"nms_b{B}c{C}s{S}"
    if ms == 0 or (st is not None and math.isnan(st)):  # nothing can be selected
        words = 6 * sel_out.shape[0]
        k = Kernel(
            f"{name}_none",
            "nms.wgsl",
            {"path": "fill", "WORDS": words},
            (Binding("out", "u32", True), Binding("count", "i32", True)),
        )
        kc.launch(k, [sel_out, count], grid(-(-words // WORKGROUP)))
        return
    thr_bits, thr = _f32(at["iou_threshold"])
    # THR = MT * 2^ET (MT with the implicit bit where normal); the rounding midpoint above it
    ex, frac = thr_bits >> 23, thr_bits & 0x7FFFFF
    mt, et = (frac, -149) if ex == 0 else (frac | 0x800000, ex - 150)
    # a quotient outside [THR_LO, THR_HI] decides without the exact test (WGSL's division is
    # within 2.5 ulp; these are 2^-16 away, 0 at the smallest normal float)
    thr_hi = _f32(thr * (1 + 2.0**-16))[1] if thr > 0 else 2.0**-126
    thr_lo = _f32(thr * (1 - 2.0**-16))[1]
    pmax = 1 << (S - 1).bit_length()
    if pmax > CPU_MAX_KEYS and cpu_device(kc.device):
        raise NotSupportedError(
            f"[_nms] {S} boxes: on a CPU adapter (lavapipe, whose shader loops stop "
            f"after 65535 iterations) up to {CPU_MAX_KEYS}"
        )
    lk = min(SORT_LOCAL, pmax)
    p = {
        "path": "select",
        "S": S,
        "C": C,
        "W": W,
        "PMAX": pmax,
        "MS": ms,
        "L": lk,
        "LP": -(-lk // (2 * WORKGROUP)),
        "LC": -(-lk // WORKGROUP),
        "center": at["center_point_box"] == 1,
        "has_threshold": st is not None,
        "ST_ORDER": _order(_f32(st)[0]) if st is not None else 0,
        "MID_M": 2 * mt + 1,
        "MID_E": et - 1,
        "MID_TIE": bool(mt & 1),
        "THR_HI": thr_hi,
        "THR_LO": thr_lo,
        "UNROLL": UNROLL,
    }
    keys = kc.scratch(8 * W * pmax)
    sbox = kc.scratch(16 * W * S)
    sel = kc.scratch(4 * W * ms)
    cnt = kc.scratch(4 * (W + 1))
    state = kc.scratch(8 * W)
    cap = greedy_cap(S) if cpu_device(kc.device) else ms
    bindings = (
        Binding("boxes", "f32"),
        Binding("scores", "f32"),
        Binding("keys", "vec2<u32>", True),
        Binding("sbox", "vec4<f32>", True),
        Binding("sel", "u32", True),
        Binding("cnt", "u32", True),
        Binding("state", "u32", True),
    )
    args = [boxes, scores, keys, sbox, sel, cnt, state]
    p["CAP"] = cap
    kc.launch(Kernel(f"{name}_m{ms}_select", "nms.wgsl", dict(p, resume=False), bindings), args, grid(W))
    for _ in range(-(-ms // cap) - 1):  # CPU adapters: the greedy pass in several launches
        kc.launch(Kernel(f"{name}_m{ms}_resume", "nms.wgsl", dict(p, resume=True), bindings), args, grid(W))
    _scan(kc, W, cnt, count)
    k = Kernel(
        f"{name}_m{ms}_scatter",
        "nms.wgsl",
        {"path": "scatter", "W": W, "C": C, "MS": ms},
        (Binding("cnt", "u32"), Binding("sel", "u32"), Binding("out", "u32", True)),
    )
    kc.launch(k, [cnt, sel, sel_out], grid(-(-(W * ms) // WORKGROUP)))


def greedy_cap(S):
    """Selections one launch of the greedy pass makes at most on a CPU adapter. Mesa's llvmpipe
    (lavapipe) ends every loop of a shader invocation once it has run 65535 loop iterations in all
    (loops then exit as if their condition failed: silently wrong results). A selection costs
    about 2 + ceil(S / (UNROLL * WORKGROUP)) of them, the first launch's sort about 13000 for
    S <= CPU_MAX_KEYS; each launch keeps its greedy pass under 30000. GPUs have no such budget:
    one launch."""
    return max(1, 30000 // (2 + -(-S // (UNROLL * WORKGROUP))))


def _order(bits):
    """shaders/nms.wgsl's order_of: an order-preserving u32 of a non-NaN float32's bits."""
    if bits == 0x80000000:
        bits = 0
    return (~bits & 0xFFFFFFFF) if bits & 0x80000000 else bits | 0x80000000
