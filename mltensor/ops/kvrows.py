"""`_kv_scatter` and `_attention_rows`: a step over rows of several sequences (internal operators;
shaders/kvrows.wgsl), the serving engine's batched decode (mltensor/llm/model.py "rows").

A step of continuous batching mixes sequences: row r of the step is one token of some sequence,
at position pos[r] of that sequence, whose keys and values live in a slot of a KV cache shared by
all sequences, [slots * positions, kv_heads, head_dim] (position-major within a slot). `dst[r]` is
the cache row of that token (slot * positions + pos[r]). So the rows' positions differ, and a
row's keys are those of its own sequence only: keys 0 .. pos[r] of its slot, the cache rows
dst[r] - pos[r] .. dst[r].

- `_kv_scatter(values, dst, rows=N)`: each value [R, ...] written into row dst[r] of a cache of N
  rows; the result [N, ...] is a graph output stored in place (as `_kv_append`'s, ops/kvcache.py:
  the kernel writes only the R rows given, the other rows are what earlier dispatches wrote into
  the same tensor). Every row of a step must name a different cache row.
- `_attention_rows(q, k, v, dst, pos, scale=, softcap=, window=, max_len=)`: q [R, H, D] against
  the keys k [N, Hkv, D] and values v [N, Hkv, DV] of each row's own sequence (grouped-query:
  head h reads kv head h / (H / Hkv)), causal by construction (keys up to the row's position:
  rows of one sequence in one step see each other's keys in order, since the scatter precedes
  the attention), `window` W > 0 keeping the last W positions, `softcap` c > 0 (c * tanh(s / c)
  of each scaled score), out [R, H, DV]. One workgroup per (row, head) walks its keys in tiles
  of WG (one key a thread for the scores, online softmax, the head dimension spread over the
  threads for the outputs). Each row is computed alone: its result does not depend on the
  other rows of the step, which is what makes a batched greedy reply equal to the same request
  served alone. `max_len` (the positions of a slot) bounds the keys a row walks, for the loop
  budget. `ring` P > 0 (a sliding-window layer): each slot holds only P positions, position j in
  its row j mod P (dst[r] is then slot * P + pos[r] mod P); P >= W + the most rows of a step - 1
  keeps every key a row needs (a later row of the same step writes position q over q - P, older
  than any row of the step still reads).
"""

import math

from ..dynamic.dims import Sym, cdiv, wgsl
from ..dynamic.kernels import grid
from ..errors import NotSupportedError
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, cpu_device, f32_lit, ld_st
from ._checks import check_number

TYPES = ("float32", "float16")
DYNAMIC_OPS = frozenset({"_kv_scatter", "_attention_rows"})
WG = 64  # threads of an attention workgroup: keys a tile
# CPU adapters: 8 threads a workgroup (one SIMD group of llvmpipe's 256-bit lanes), each a (row,
# head); head sizes up to 256 keep q and the outputs in named vec4s (128 of them at 256)
CPU_WG = 8
CPU_MAX_HEAD = 256


def _int(where, what, v, least=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise TypeError(f"[{where}] {what} must be an integer >= {least}, got {v!r}")
    return v


@builder_op
def _kv_scatter(b, values, dst, *, rows, label=None):
    """values: operands [R, ...] (one R); dst: int32 [R]; rows: the cache's rows N. Returns the
    operands [N, ...] (module doc: only rows dst[r] are written)."""
    where = "_kv_scatter"
    if not isinstance(values, (list, tuple)) or not values:
        raise TypeError(f"[{where}] values must be a non-empty list of operands, got {values!r}")
    b._operand(dst, where, "dst")
    if dst.data_type != "int32" or dst.rank != 1:
        raise TypeError(f"[{where}] dst must be int32 of rank 1, got {dst.data_type} {list(dst.shape)}")
    _int(where, "rows", rows)
    for k, v in enumerate(values):
        b._operand(v, where, f"values[{k}]")
        if v.data_type not in TYPES or v.rank < 1 or v.shape[0] != dst.shape[0]:
            raise TypeError(
                f"[{where}] values[{k}] must be float32/float16 with dst's {dst.shape[0]} rows first, got "
                f"{v.data_type} {list(v.shape)}"
            )
        if any(isinstance(d, Sym) for d in v.shape[1:]):
            raise TypeError(f"[{where}] values[{k}]: only the rows may be dynamic")
    outs = [(v.data_type, (rows,) + tuple(v.shape[1:])) for v in values]
    return b._emit(where, list(values) + [dst], {"rows": rows}, outs, label)


def _lower_scatter(kc, node):
    values, dst = node.inputs[:-1], node.inputs[-1]
    srcs, dsts, sizes = [], [], []
    for k, (v, o) in enumerate(zip(values, node.outputs)):
        if not kc.is_caller_tensor(o) or kc.root(o) is not o:
            raise NotSupportedError(
                "[_kv_scatter] each result must be a graph output written in place: the rows not written "
                "live only in the caller's tensor"
            )
        srcs.append(Binding(f"src{k}", kc.move_type(v)))
        dsts.append(Binding(f"dst{k}", kc.move_type(v), True))
        sizes.append(math.prod(v.shape[1:]))
    R = values[0].shape[0]
    row = max(sizes)
    p = {"n": wgsl(R * row), "R": wgsl(R), "ROW": row, "rows": node.attrs["rows"], "sizes": sizes, "SCATTER": True}
    tag = "_".join(str(s) for s in sizes)
    k = Kernel(f"kv_scatter_{len(srcs)}_{tag}", "kvrows.wgsl", p, tuple(srcs + [Binding("dst", "i32")] + dsts))
    kc.launch(k, list(values) + [dst] + list(node.outputs), grid(cdiv(R * row, WORKGROUP)))


@builder_op
def _attention_rows(b, q, k, v, dst, pos, *, scale, max_len, softcap=0.0, window=0, ring=0, label=None):
    where = "_attention_rows"
    for what, x in (("q", q), ("k", k), ("v", v), ("dst", dst), ("pos", pos)):
        b._operand(x, where, what)
    for what, x in (("dst", dst), ("pos", pos)):
        if x.data_type != "int32" or x.rank != 1 or x.shape[0] != q.shape[0]:
            raise TypeError(f"[{where}] {what} must be int32 [{q.shape[0]}], got {x.data_type} {list(x.shape)}")
    if q.rank != 3 or k.rank != 3 or v.rank != 3:
        raise TypeError(f"[{where}] q, k and v must have rank 3 ([rows, heads, head size])")
    if not (q.data_type == k.data_type == v.data_type) or q.data_type not in TYPES:
        raise TypeError(
            f"[{where}] q, k and v must share one float type, got {q.data_type}, {k.data_type}, {v.data_type}"
        )
    R, H, D = q.shape
    N, HKV, DK = k.shape
    if any(isinstance(d, Sym) for d in (H, D, N, HKV, DK) + tuple(v.shape)):
        raise TypeError(f"[{where}] only q's rows may be dynamic")
    if DK != D or v.shape[0] != N or v.shape[1] != HKV or H % HKV:
        raise TypeError(
            f"[{where}] shapes do not match: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} "
            "(k's head size is q's, v's rows and heads are k's, q's heads a multiple of k's)"
        )
    DV = v.shape[2]
    if DV > 4 * WG:
        raise NotSupportedError(f"[{where}] a value head size of {DV} (at most {4 * WG})")
    _int(where, "max_len", max_len)
    _int(where, "window", window, 0)
    _int(where, "ring", ring, 0)
    if ring and (not window or ring < window):
        raise TypeError(
            f"[{where}] a ring of {ring} positions needs a sliding window of at most that many, got {window}"
        )
    attrs = {
        "scale": check_number(where, "scale", scale),
        "softcap": check_number(where, "softcap", softcap),
        "window": window,
        "max_len": max_len,
        "ring": ring,
    }
    return b._emit1(where, [q, k, v, dst, pos], attrs, q.data_type, (R, H, DV), label)


def _lower_attention(kc, node):
    q, k, v, dst, pos = node.inputs
    a = node.attrs
    R, H, D = q.shape
    HKV, DV = k.shape[1], v.shape[2]
    t = kc.wtype(q)
    cap = a["softcap"]
    p = {
        "SCATTER": False,
        "CPU": False,
        "V4": False,
        "R": wgsl(R),
        "H": H,
        "HKV": HKV,
        "D": D,
        "DV": DV,
        "WG": WG,
        "NC": -(-DV // WG),
        "scale": f32_lit(a["scale"]),
        "softcap": f32_lit(cap) if cap else "",
        "inv_softcap": f32_lit(1.0 / cap) if cap else "",
        "window": a["window"],
        "RING": a.get("ring", 0),
        **ld_st(t),
    }
    bindings = [Binding("q", t), Binding("k", t), Binding("v", t), Binding("dst", "i32"), Binding("pos", "i32")]
    bindings.append(Binding("out", t, True))
    win = (f"_w{a['window']}" if a["window"] else "") + (f"_ring{a['ring']}" if a.get("ring") else "")
    name = f"attention_rows_{t}_h{H}k{HKV}d{D}{f'v{DV}' if DV != D else ''}{win}{'_sc' if cap else ''}"
    keys = min(a["max_len"], a["window"] or a["max_len"])
    if cpu_device(kc.device) and D % 4 == 0 and DV % 4 == 0 and max(D, DV) <= CPU_MAX_HEAD:
        # a thread per (row, head), keys one at a time (kvrows.wgsl CPU; named vec4s for q and
        # the outputs: head sizes up to CPU_MAX_HEAD)
        # float32 keys and values read a quad a load (llvmpipe gathers every load per invocation)
        v4 = t == "f32"
        if v4:
            bindings[1:3] = [Binding("k", "vec4<f32>"), Binding("v", "vec4<f32>")]
        p.update(CPU=True, WG=CPU_WG, V4=v4)
        kc.launch(
            Kernel(name + "_cpu", "kvrows.wgsl", p, tuple(bindings)),
            [q, k, v, dst, pos, kc.out(node)],
            grid(cdiv(R * H, CPU_WG)),
            iters=keys + 1,
        )
        return
    # per tile of WG keys: a score (D), two reductions, the outputs' WG keys
    iters = cdiv(keys, WG) * (D + WG + 2 * int(math.log2(WG)) + 4) + cdiv(D, WG)
    kc.launch(
        Kernel(name, "kvrows.wgsl", p, tuple(bindings)), [q, k, v, dst, pos, kc.out(node)], grid(R * H), iters=iters
    )


register("_kv_scatter", {"values": TYPES, "dst": ("int32",), "output": TYPES}, lower=_lower_scatter)
register(
    "_attention_rows",
    {"q": TYPES, "k": TYPES, "v": TYPES, "dst": ("int32",), "pos": ("int32",), "output": TYPES},
    lower=_lower_attention,
)
