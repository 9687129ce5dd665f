"""Scans along one axis: arg_min, arg_max and cumulative_sum (shaders/scan.wgsl).

A line is all elements sharing the coordinates outside the axis: `lines` lines of `n` elements,
`inner` apart. Why lines are cut into chunks: lavapipe's llvmpipe silently ends every loop of an
invocation past 65535 iterations in total (one thread walking a line of 100000 ones summed to
65535, then wrote zeros), and one thread per long line leaves a GPU idle. Plans (autotune
candidates, runtime/autotune.py, each correct for every shape; `autotune.force(i)` in the tests):
- ("chunks",): one thread per (line, chunk of CT elements) walks its chunk serially (CT = 1024,
  more only past 16M elements a line, at most MAXM = 16384 either way). A line of one chunk is the
  one-thread-per-line kernel: one launch. Several chunks: arg_* 2 launches (each chunk's first
  best (value, index); one thread per line combines its chunks in order), cumulative_sum 3 (each
  chunk's sum; one thread per line turns its chunk sums into exclusive offsets; each chunk
  scanned from its offset). No barriers: measured on lavapipe (2 cores) 3-25x faster than the
  tiles below, and the heuristic on CPU adapters.
- ("tiles", EMAX), EMAX 16 or 4: a workgroup of 256 threads takes LW adjacent lines (lanes: the
  largest power of two <= min(inner, 32), so that an axis that is not the last still reads whole
  runs of memory) and R = 256 / LW rows along the axis; each thread takes E = min(EMAX,
  ceil(n / R)) consecutive elements, so a workgroup covers a chunk of CA = R * E elements of each
  of its lines (4096 or 1024 for a contiguous line). One chunk: one launch. Several: arg_* 2
  launches (each chunk's best by a workgroup reduction; one workgroup per line combines its
  chunks), cumulative_sum 3 (each chunk's sum by a workgroup reduction; one workgroup per line
  scans its chunk sums into offsets; each chunk scanned in workgroup memory, Hillis-Steele over
  the threads' partial sums, from its offset). Short lines (reduce.thread_flag: n <= 32, or
  n <= 256 with 16384+ lines, where the threads alone fill a GPU) keep one thread per line.
  ("tiles", 4) is the heuristic on GPUs: a 32000-entry logits row gets 32 workgroups (8 with 16).
No invocation loops more than max(CT, number of chunks) <= 16384 times (chunks) or 2 EMAX + 16
times plus 2 ceil(NC / 256) over chunk results (tiles), and workgroup memory is written before it
is read (lavapipe does not zero it).

arg_min / arg_max keep numpy's rule (the first NaN wins, otherwise the better value, of equal
values the first index) across chunks: in order (chunks), or with explicit indices whatever the
grouping (tiles). cumulative_sum of float16 accumulates in f32; integers wrap as before.

Dynamic dimensions (mltensor/dynamic/): the axis and the others may be sizes known at dispatch.
The kernels read them there (wgsl(); constants when static) and compute the plan's chunking from
them as a static build would; a launch that applies to some sizes only (the several-chunk passes,
the tiles plans' one-thread-per-line kernel) is sized to 0 workgroups where it does not apply, so
a dynamic build computes bit for bit what the static build at the same sizes computes (with the
same plan: tuning on GPUs may choose differently for the two).
"""

from __future__ import annotations

from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, smax, smin, wgsl
from ..errors import NotSupportedError
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, lowering, register
from ..runtime import autotune
from ..runtime.wgsl import WORKGROUP, Binding, binop, compare, convert, cpu_device, Kernel, ld_st, lit
from ._checks import check_axis, check_bool, check_support
from .reduce import at_least, groups, thread_flag
from ._gemm import dim_maxes

ALL = dtypes.ALL
INDEX_OUT = ("int32", "int64")
# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"arg_min", "arg_max", "cumulative_sum"})

WG = 256  # threads of a "tiles" workgroup (shaders/scan.wgsl's WG; a power of two)
MAX_LANES = 32  # lines a "tiles" workgroup takes side by side (inner > 1)
EMAX = (16, 4)  # "tiles" plans: elements per thread (chunks of 4096 / 1024 of a contiguous line)
CT0 = 1024  # "chunks" plan: elements per thread (at least; more for lines over CT0 * MAXM)
MAXM = 16384  # "chunks" plan: chunks of a line at most (its per-line pass loops over them)
MAX_TRIPS = 8192  # "tiles" plans: bound on the per-line pass's loop over chunk results


def _split(shape, axis):
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


def _sizes(outer, n, inner):
    """Template sizes of a scan over `outer` x `n` x `inner` (WGSL u32 expressions)."""
    return {
        "lines": wgsl(outer * inner),
        "len": wgsl(n),
        "inner": wgsl(inner),
        "stride": wgsl(n * inner),
        "last": wgsl(n - 1),
    }


def _lanes(inner):
    """LW: the largest power of two <= min(inner, 32), as an int or a size read at dispatch."""
    if isinstance(inner, int):
        return 1 << (min(inner, MAX_LANES).bit_length() - 1)
    lw = 1
    for c in (2, 4, 8, 16, 32):
        lw = lw + (c // 2) * at_least(inner, c)
    return lw


class _Chunks:
    """The "chunks" plan's split of a line of n elements: chunks of CT elements (CT0, more where a
    line would have more than MAXM chunks), NCT per line; `multi`: 1 where lines have several
    chunks (0, 1, or a size that is 0 or 1 at dispatch)."""

    def __init__(self, lines, n):
        self.ct = smax(CT0, cdiv(n, MAXM))
        self.nct = cdiv(n, self.ct)
        self.multi = at_least(self.nct, 2)
        self.most = high(lines) * min(MAXM, cdiv(high(n), CT0))  # chunk results, for scratch

    @staticmethod
    def fits(n):
        return cdiv(high(n), MAXM) <= MAXM  # CT <= MAXM elements a thread too


class _Tiles:
    """The "tiles" plans' tiling of `lines` lines of n elements for EMAX e (shaders/scan.wgsl
    computes the same from the sizes): lanes LW, rows R, elements per thread E, chunk CA, chunks
    per line NC, line groups G; `multi` as in _Chunks."""

    def __init__(self, lines, n, inner, emax):
        self.lw = _lanes(inner)
        self.r = WG // self.lw
        self.e = smin(emax, cdiv(n, self.r))
        self.ca = self.r * self.e
        self.nc = cdiv(n, self.ca)
        self.g = cdiv(lines, self.lw)
        self.multi = at_least(self.nc, 2)
        self.most = high(lines) * _Tiles.chunks_max(n, inner, emax)

    @staticmethod
    def chunks_max(n, inner, emax):
        """The most chunks of a line (with several, E is EMAX and R = 256 / LW)."""
        return max(1, cdiv(high(n), (WG // high(_lanes(inner))) * emax))

    @staticmethod
    def fits(n, inner, emax):
        """The per-line pass loops at most MAX_TRIPS times over a line's chunks."""
        return cdiv(_Tiles.chunks_max(n, inner, emax), WG) <= MAX_TRIPS


def _measure(kc, launches, sizes):
    """Launches in autotune.time_launches form (dynamic sizes at their maxima)."""

    values = None
    if any(isinstance(x, Sym) for x in sizes):
        values = dict.fromkeys(kc.dims, 1)
        values.update(dim_maxes(*sizes))
    return kc.timing_form(launches, values)


def _launch(kc, where, problem, outer, n, inner, serial, chunks, tiles):
    """Choose a plan and launch it. `serial(count)`: the one-thread-per-line kernel's launches,
    sized by `count` (1, or 0 / 1 at dispatch); `chunks(_Chunks)`, `tiles(_Tiles, count, emax)`:
    the plans' launches (tiles sized by count). Plans (autotune candidates, each correct for
    every shape): ("chunks",) where lines fit it, and where reduce.thread_flag's rule does not
    always choose one thread per line, ("tiles", e) for each EMAX (with the serial kernel for the
    sizes that rule gives it, sized to 0 workgroups elsewhere)."""
    lines = outer * inner
    ser = thread_flag(lines, n)
    cands = [("chunks",)] if _Chunks.fits(n) else []
    if ser != 1 or not cands:
        cands += [("tiles", e) for e in EMAX if _Tiles.fits(n, inner, e)]
    if not cands:
        raise NotSupportedError(
            f"[{where}] lines of {high(n)} elements: longer than every plan takes ({MAXM * MAXM} elements or more)"
        )
    cpu = cpu_device(kc.device)
    heur = 0 if cpu or len(cands) == 1 else len(cands) - 1

    def plan(c):
        if c[0] == "chunks":
            return chunks(_Chunks(lines, n))
        return (serial(ser) if ser != 0 else []) + tiles(_Tiles(lines, n, inner, c[1]), 1 - ser, c[1])

    best = autotune.choose(
        kc,
        autotune.signature_of(("scan.wgsl", *problem, outer, n, inner, cands)),
        cands,
        lambda i: _measure(kc, plan(cands[i]), (outer, n, inner)),
        heur,
    )
    for k, a, g in plan(cands[best]):
        kc.launch(k, a, g)


def _nbytes_of(t):
    return 8 if t in ("i64", "u64", "i64e", "u64e") else 4


# -- arg_min / arg_max ------------------------------------------------------------------------


def _arg_op(name, cmp):
    register(name, {"input": ALL, "output": INDEX_OUT}, ranks={"input": (1, 8)}, lower=_lower_arg)

    def op(
        self: Any,
        input: MLOperand,
        axis: int,
        *,
        keep_dimensions: bool = False,
        output_data_type: str = "int32",
        label: str | None = None,
    ) -> MLOperand:
        self._operand(input, name, "input")
        check_support(name, input=input)
        axis = check_axis(name, axis, input.rank)
        odt = dtypes.normalize(output_data_type, name)
        if odt not in INDEX_OUT:
            raise TypeError(f"[{name}] output_data_type must be one of {', '.join(INDEX_OUT)}, got {odt}")
        check_bool(name, "keep_dimensions", keep_dimensions)
        shape = list(input.shape)
        if keep_dimensions:
            shape[axis] = 1
        else:
            del shape[axis]
        return self._emit1(name, [input], {"axis": axis, "cmp": cmp}, odt, tuple(shape), label)

    op.__name__ = name
    builder_op(op)


def _lower_arg(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    outer, n, inner = _split(x.shape, node.attrs["axis"])
    t, ot, cmp = kc.wtype(x), kc.wtype(out), node.attrs["cmp"]
    lines = outer * inner
    name = f"{node.op}_{t}_o{outer}_n{n}_i{inner}"
    sizes = _sizes(outer, n, inner)
    result = convert("best_k", "u32", ot)
    vt = "f32" if t in dtypes.FLOAT_COMPUTE else t  # chunk results: f16 values compare exactly as f32
    pair = {"VT": vt, "VLD": "f32" if t == "f16" else "", "vzero": lit(0, vt), "result": result}
    first = {**sizes, "mode": "arg", "wtype": t, "better": compare(cmp, t, "v", "best"), "result": result}

    def serial(count):
        k = Kernel(
            name, "scan.wgsl", dict(first, chunks=False, part=False), (Binding("x", t), Binding("out", ot, True))
        )
        return [(k, [x, out], groups(node.op, cdiv(lines * count, WORKGROUP)))]

    def chunks(ch):
        if ch.multi == 0:
            return serial(1)
        pv, pk = kc.scratch(_nbytes_of(vt) * ch.most), kc.scratch(4 * ch.most)
        p = dict(first, **pair, chunks=True, part=True, CT=wgsl(ch.ct), NCT=wgsl(ch.nct))
        k1 = Kernel(
            f"{name}_chunks",
            "scan.wgsl",
            p,
            (Binding("x", t), Binding("pv", vt, True), Binding("pk", "u32", True), Binding("out", ot, True)),
        )
        k2 = Kernel(
            f"{name}_lines",
            "scan.wgsl",
            dict(p, mode="arg_lines", better=compare(cmp, vt, "v", "best")),
            (Binding("pv", vt), Binding("pk", "u32"), Binding("out", ot, True)),
        )
        return [
            (k1, [x, pv, pk, out], groups(node.op, cdiv(lines * ch.nct, WORKGROUP))),
            (k2, [pv, pk, out], groups(node.op, cdiv(lines * ch.multi, WORKGROUP))),
        ]

    def tiles(geo, count, emax):
        p = dict(sizes, **pair, better=compare(cmp, vt, "v", "best"), LW=wgsl(geo.lw), EMAX=emax)
        part, direct = geo.multi != 0, geo.multi != 1  # chunk results to combine / written directly
        binds, args, launches = [Binding("x", t)], [x], []
        if part:
            pv, pk = kc.scratch(_nbytes_of(vt) * geo.most), kc.scratch(4 * geo.most)
            binds += [Binding("pv", vt, True), Binding("pk", "u32", True)]
            args += [pv, pk]
        if direct:
            binds.append(Binding("out", ot, True))
            args.append(out)
        k1 = Kernel(f"{name}_tiles{emax}", "scan.wgsl", dict(p, mode="arg_chunk", part=part, direct=direct), binds)
        launches.append((k1, args, groups(node.op, geo.g * geo.nc * count)))
        if part:
            k2 = Kernel(
                f"{name}_tiles{emax}_final",
                "scan.wgsl",
                dict(p, mode="arg_final"),
                (Binding("pv", vt), Binding("pk", "u32"), Binding("out", ot, True)),
            )
            launches.append((k2, [pv, pk, out], groups(node.op, lines * count * geo.multi)))
        return launches

    _launch(kc, node.op, ("arg", node.op, t, ot), outer, n, inner, serial, chunks, tiles)


_arg_op("arg_min", "<")
_arg_op("arg_max", ">")


# -- cumulative_sum ---------------------------------------------------------------------------

register("cumulative_sum", {"input": ALL, "output": ALL}, ranks={"input": (1, 8)})


@builder_op(renamed={"x": "input"})
def cumulative_sum(
    self: Any, input: MLOperand, axis: int, *, exclusive: bool = False, reversed: bool = False, label: str | None = None
) -> MLOperand:
    self._operand(input, "cumulative_sum", "input")
    check_support("cumulative_sum", input=input)
    axis = check_axis("cumulative_sum", axis, input.rank)
    check_bool("cumulative_sum", "exclusive", exclusive)
    check_bool("cumulative_sum", "reversed", reversed)
    attrs = {"axis": axis, "exclusive": exclusive, "reversed": reversed}
    return self._emit1("cumulative_sum", [input], attrs, input.data_type, input.shape, label)


@lowering("cumulative_sum")
def _lower_cumsum(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    a = node.attrs
    outer, n, inner = _split(x.shape, a["axis"])
    st = kc.wtype(x)
    t = "f32" if st == "f16" else st  # running sums of f16 values are f32
    lines = outer * inner
    where = "cumulative_sum"
    name = (
        f"cumulative_sum_{st}_o{outer}_n{n}_i{inner}"
        + ("_excl" if a["exclusive"] else "")
        + ("_rev" if a["reversed"] else "")
    )
    base = {
        **_sizes(outer, n, inner),
        "zero": lit(0, t),
        **ld_st(st),
        "exclusive": a["exclusive"],
        "reversed": a["reversed"],
    }
    first = dict(base, mode="cumsum", add=binop("+", t, "acc", "v"))

    def serial(count):
        k = Kernel(
            name, "scan.wgsl", dict(first, chunks=False, part=False), (Binding("x", st), Binding("out", st, True))
        )
        return [(k, [x, out], groups(where, cdiv(lines * count, WORKGROUP)))]

    def chunks(ch):
        if ch.multi == 0:
            return serial(1)
        sums = kc.scratch(_nbytes_of(t) * ch.most)
        p = dict(first, chunks=True, part=True, CT=wgsl(ch.ct), NCT=wgsl(ch.nct))
        k1 = Kernel(
            f"{name}_chunks_sums",
            "scan.wgsl",
            dict(p, mode="sums", part=False),
            (Binding("x", st), Binding("sums", t, True)),
        )
        k2 = Kernel(f"{name}_lines", "scan.wgsl", dict(p, mode="sum_lines"), (Binding("sums", t, True),))
        k3 = Kernel(f"{name}_chunks", "scan.wgsl", p, (Binding("x", st), Binding("sums", t), Binding("out", st, True)))
        return [
            (k1, [x, sums], groups(where, cdiv(lines * ch.nct * ch.multi, WORKGROUP))),
            (k2, [sums], groups(where, cdiv(lines * ch.multi, WORKGROUP))),
            (k3, [x, sums, out], groups(where, cdiv(lines * ch.nct, WORKGROUP))),
        ]

    def tiles(geo, count, emax):
        p = dict(base, T=t, add=binop("+", t, "a", "b"), LW=wgsl(geo.lw), EMAX=emax)
        part = geo.multi != 0  # chunk offsets to compute first
        launches = []
        if part:
            sums = kc.scratch(_nbytes_of(t) * geo.most)
            k1 = Kernel(
                f"{name}_tiles{emax}_sums",
                "scan.wgsl",
                dict(p, mode="sum_chunk"),
                (Binding("x", st), Binding("sums", t, True)),
            )
            k2 = Kernel(
                f"{name}_tiles{emax}_offsets", "scan.wgsl", dict(p, mode="sum_scan"), (Binding("sums", t, True),)
            )
            launches += [
                (k1, [x, sums], groups(where, geo.g * geo.nc * count * geo.multi)),
                (k2, [sums], groups(where, lines * count * geo.multi)),
            ]
        binds = (Binding("x", st),) + ((Binding("sums", t),) if part else ()) + (Binding("out", st, True),)
        k3 = Kernel(f"{name}_tiles{emax}", "scan.wgsl", dict(p, mode="scan_chunk", part=part), binds)
        launches.append((k3, [x, sums, out] if part else [x, out], groups(where, geo.g * geo.nc * count)))
        return launches

    _launch(kc, where, ("cumsum", st, a["exclusive"], a["reversed"]), outer, n, inner, serial, chunks, tiles)
