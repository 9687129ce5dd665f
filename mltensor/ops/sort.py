"""Sorting: `_topk`, the k first elements along one axis and their indices (shaders/topk.wgsl). An
internal operator (WebNN has no top-k) behind ONNX TopK (onnx/ops/sort.py).

Order, as onnxruntime's TopK: largest: NaN first (NaN counts as larger than +inf), then
descending; smallest: ascending, NaN last; ties (-0 equals +0, every NaN equals every NaN) give
the lower index first. The result is always sorted (ONNX allows any order for sorted=0; sorted
costs nothing here). Each element becomes an unsigned sort key whose ascending order is that
order (32 bits, or two words for 64-bit integers: exact for every value), and the kernels sort
(key, index) pairs, a strict total order: every kernel gives the same answer, bit for bit.

Plans (autotune candidates, each correct for every shape: `runtime/autotune.choose` times them
on hardware adapters; elsewhere `heuristic` chooses, measured on lavapipe). A plan is a chunk
kernel, which turns each chunk of a row into a sorted run of its first min(k, chunk) pairs, then,
when a row has S > 1 chunks, ceil(log2 S) "merge" launches: one thread per pair, its rank in
the partner run by binary search, merged runs cut to k; the last one writes the outputs.
- ("row", CL): one thread per chunk of CL elements keeps its best min(k, CL) <= 16 in named
  registers: whole rows (CL = n <= ROW_MAX_N, k <= 16: many short rows), chunks of ROW_CHUNK
  (k <= 16), or chunks of 16 (any k: sorted runs of 16, then merges; with no barrier, 2-4x the
  speed of the bitonic sort on lavapipe).
- ("reg", S, WG) (k <= 16): one workgroup per row, or per chunk for few long rows (S chunks):
  each thread keeps its best k of a strided part in named registers, the lists merged pairwise
  through workgroup memory (log2 WG rounds; WG * k / 2 pairs within 16 KiB).
- ("block", B): chunks of B (a power of two, cut to the row; B pairs within the workgroup
  memory, at most 32 KiB) bitonic-sorted in workgroup memory.
Any row length works (rows * n below 2^32); the scratch holds two generations of runs (at most
about 2 * rows * n pairs, when k is large). Not in DYNAMIC_OPS: sizes are fixed at build.
"""

import math

from .. import dtypes
from ..errors import NotSupportedError
from ..ir.registry import builder_op, lowering, register
from ..runtime import autotune
from ..runtime.wgsl import LOOP_BUDGET, WORKGROUP, Binding, cpu_device, Kernel
from ._checks import check_bool, check_support
from .reduce import groups

REG_MAX_K = 16  # k kept in registers by the "row" and "reg" kernels
ROW_MAX_N = 1024  # rows a single thread scans whole ("row")
ROW_CHUNK = 256  # elements a thread scans in the chunked "row" plan for k <= 16
BLOCKS = (512, 1024, 2048, 4096)  # chunk sizes of the bitonic kernel (pairs in workgroup memory)
WG_STORAGE = 16384  # WebGPU's default workgroup memory: the heuristic's choices fit it
SPLIT_MIN = 2048  # elements a chunk at least when a long row is split across workgroups ("reg")
TARGET_GROUPS = 264  # workgroups that fill a large GPU (two per SM of an H100)

register("_topk", {"input": dtypes.ALL, "values": dtypes.ALL, "indices": ("int64",)}, ranks={"input": (1, 8)})


@builder_op
def _topk(b, x, *, k, axis, largest=True, sorted=True, label=None):
    """(values, indices): the k largest (or smallest) elements of `x` along `axis` (negative
    counts from the end) and their indices (int64), both of x's shape with the axis of size k,
    sorted (also with sorted=False). 1 <= k <= x.shape[axis]."""
    where = "_topk"
    b._operand(x, where, "input")
    check_support(where, input=x)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -x.rank <= axis < x.rank:
        raise TypeError(f"[{where}] axis must be an integer in [{-x.rank}, {x.rank}), got {axis!r}")
    axis %= x.rank
    n = x.shape[axis]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise TypeError(f"[{where}] k must be an integer in [1, {n}] (the axis' size), got {k!r}")
    check_bool(where, "largest", largest)
    check_bool(where, "sorted", sorted)
    shape = list(x.shape)
    shape[axis] = k
    attrs = {"axis": axis, "k": k, "largest": largest}
    outs = [(x.data_type, tuple(shape)), ("int64", tuple(shape))]
    values, indices = b._emit(where, [x], attrs, outs, label)
    return values, indices


# -- lowering -----------------------------------------------------------------------------------


def _pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def _kind(t):
    return {"i64e": "i64", "u64e": "u64"}.get(t, t)


def candidates(rows, n, k, kw, storage):
    """The plans valid for `rows` rows of n elements and this k, pairs of kw + 1 words, `storage`
    bytes of workgroup memory: ("row", CL), ("reg", S, WG), ("block", B)."""
    out = []
    if k <= REG_MAX_K:
        if n <= ROW_MAX_N:
            out.append(("row", n))
        if n > 2 * ROW_CHUNK:
            out.append(("row", ROW_CHUNK))
        wg_max = WORKGROUP
        while wg_max > 32 and wg_max // 2 * k * (kw + 1) * 4 > WG_STORAGE:
            wg_max //= 2
        # one workgroup a row: n / WG elements a thread, only under llvmpipe's loop cap
        # (runtime/wgsl.py LOOP_BUDGET: 32 threads past ~1.9M elements silently kept a prefix)
        if _reg_iters(n, 1, 32, k) <= LOOP_BUDGET:
            out.append(("reg", 1, 32))
        if wg_max > 32 and n > 256 and _reg_iters(n, 1, wg_max, k) <= LOOP_BUDGET:
            out.append(("reg", 1, wg_max))
        s = min(-(-n // SPLIT_MIN), -(-TARGET_GROUPS // rows))
        if s > 1:
            out.append(("reg", s, wg_max))
    else:
        out.append(("row", REG_MAX_K))
    seen = set()
    for blk in BLOCKS:
        bc = min(blk, max(2, _pow2(n)))
        if bc * (kw + 1) * 4 <= storage and bc not in seen:
            seen.add(bc)
            out.append(("block", bc))
    return out


def _reg_iters(n, s, wg, k):
    """Loop iterations of a thread of the "reg" kernel: its strided part of a chunk, then log2(WG)
    merge rounds of up to k insertions."""
    return -(-(-(-n // s)) // wg) + 1 + wg.bit_length() * (k + 2) + 8


def heuristic(cands, rows, n, k, kw, cpu):
    """Index of the plan used without timing (CPU adapters, no timestamp queries, past the
    tuning budget). CPU adapters: measured on lavapipe (2 cores); GPUs: a guess, which tuning
    replaces where the adapter has timestamp queries."""

    def find(*want):
        return next((i for i, c in enumerate(cands) if c[: len(want)] == want), None)

    if k > REG_MAX_K:
        if cpu:  # registers and merges: 2-4x faster than the bitonic sort there (its barriers)
            return find("row", REG_MAX_K)
        blk = min(2048 if kw == 1 else 1024, max(2, _pow2(n)))  # 16 KiB of pairs
        i = find("block", blk)
        return find("row", REG_MAX_K) if i is None else i
    if cpu:
        i = find("row", n) if rows >= 16 else None
        i = find("reg", 1, 32) if i is None else i
        return find("row", ROW_CHUNK) if i is None else i  # (a row past the loop cap: chunks)
    if n <= 64 or (n <= ROW_MAX_N and rows >= 8192):  # a thread a row fills the GPU
        return find("row", n)
    for i, c in enumerate(cands):
        if c[0] == "reg" and c[1] > 1:  # few long rows: chunks in parallel, then merges
            return i
    if n > 2048:
        i = find("reg", 1)
        i = next((j for j, c in enumerate(cands) if c[0] == "reg" and c[1] == 1 and c[2] > 32), i)
        return find("row", ROW_CHUNK) if i is None else i  # (a row past the loop cap: chunks)
    return find("reg", 1, 32)


@lowering("_topk")
def _lower_topk(kc, node):
    x = node.inputs[0]
    vals, idxs = kc.out(node, 0), kc.out(node, 1)
    at = node.attrs
    axis, k = at["axis"], at["k"]
    shape = x.shape
    n = shape[axis]
    inner = math.prod(shape[axis + 1 :])
    rows = math.prod(shape) // n
    t = kc.wtype(x)
    kind = _kind(t)
    kw = 2 if kind in ("i64", "u64") else 1
    storage = min(kc.device.limits.get("max-compute-workgroup-storage-size", WG_STORAGE), 32768)
    cpu = cpu_device(kc.device)
    cands = candidates(rows, n, k, kw, storage)
    heur = heuristic(cands, rows, n, k, kw, cpu)
    xt = "f16" if t == "f16" else "u32"  # 32-bit values and 64-bit words move as u32
    base = {
        "kind": kind,
        "KW": kw,
        "XW": 2 if kw == 2 else 1,
        "N": n,
        "INNER": inner,
        "KO": k,
        "LARGEST": at["largest"],
        "K": 0,
        "has_x": True,
        "has_pin": False,
        "FINAL": False,
    }
    name = f"topk_{kind}_r{rows}_n{n}{f'_i{inner}' if inner > 1 else ''}_k{k}{'' if at['largest'] else '_min'}"
    pair_bytes = (kw + 1) * 4
    limit = min(
        kc.device.limits.get("max-storage-buffer-binding-size", 1 << 27),
        kc.device.limits.get("max-buffer-size", 1 << 28),
    )

    def final_args():
        return [Binding("x", xt), Binding("vals", xt, True), Binding("idxs", "u32", True)], [x, vals, idxs]

    def plan(c):
        """[(Kernel, args, groups)] of plan c."""
        launches = []
        if c[0] == "row":
            cl = c[1]
            s = -(-n // cl)
            run = min(k, cl)
            p = dict(base, mode="row", K=run, S=s, CL=cl, ROWS=rows, FINAL=s == 1)
            g = groups("_topk", -(-rows * s // WORKGROUP))
        elif c[0] == "reg":
            _, s, wg = c
            cl = -(-n // s)
            s = -(-n // cl)
            run = k
            p = dict(base, mode="reg", K=k, WG=wg, S=s, CL=cl, GROUPS=rows * s, FINAL=s == 1)
            g = groups("_topk", rows * s)
        else:
            blk = c[1]
            s = -(-n // blk)
            run = min(k, blk)
            p = dict(base, mode="block", WG=min(WORKGROUP, blk // 2), S=s, B=blk, L=run, GROUPS=rows * s, FINAL=s == 1)
            g = groups("_topk", rows * s)
        label = f"{name}_{c[0]}{c[1] if c[0] != 'reg' else ''}{f'_s{s}' if s > 1 else ''}"
        if s == 1:
            bnd, args = final_args()
            return [(Kernel(label, "topk.wgsl", p, bnd), args, g)]
        # chunk runs, then merges two by two (ping-pong between two scratch buffers)
        rounds, ss, ll = [], s, run
        while ss > 1:
            rounds.append((ss, ll))
            ss, ll = -(-ss // 2), min(k, 2 * ll)
        sizes = [rows * s * run] + [rows * -(-a // 2) * min(k, 2 * b) for a, b in rounds[:-1]]
        if max(sizes) * pair_bytes > limit:
            raise NotSupportedError(
                f"[_topk] {rows} rows of {n} elements need {max(sizes) * pair_bytes} "
                f"bytes of scratch, more than a buffer binding holds ({limit})"
            )
        bufs = [kc.scratch(max(sizes[0::2]) * pair_bytes)]
        if len(sizes) > 1:
            bufs.append(kc.scratch(max(sizes[1::2]) * pair_bytes))
        launches.append(
            (Kernel(label, "topk.wgsl", p, [Binding("x", xt), Binding("pout", "u32", True)]), [x, bufs[0]], g)
        )
        for j, (ss, ll) in enumerate(rounds):
            final = j == len(rounds) - 1
            total = rows * ss * ll
            pm = dict(
                base, mode="merge", S=ss, L=ll, LO=min(k, 2 * ll), TOTAL=total, FINAL=final, has_x=final, has_pin=True
            )
            src = bufs[j % 2]
            if final:
                bnd, args = final_args()
                bnd, args = [Binding("pin", "u32")] + bnd, [src] + args
            else:
                bnd, args = [Binding("pin", "u32"), Binding("pout", "u32", True)], [src, bufs[(j + 1) % 2]]
            launches.append(
                (
                    Kernel(f"{name}_merge_s{ss}l{ll}", "topk.wgsl", pm, bnd),
                    args,
                    groups("_topk", -(-total // WORKGROUP)),
                )
            )
        return launches

    def measure(i):
        return kc.timing_form(plan(cands[i]))

    problem = ("topk.wgsl", kind, rows, n, inner, k, at["largest"], cands)
    best = autotune.choose(kc, autotune.signature_of(problem), cands, measure, heur)
    for kern, args, g in plan(cands[best]):
        kc.launch(kern, args, g)
