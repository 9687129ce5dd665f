"""matmul and gemm: one batched GEMM kernel family (shaders/matmul.wgsl).

Static sizes, strides, transposes and batch broadcasting are baked into the WGSL as constants.
Two paths: a shared-memory tiled, register-blocked kernel (64 or 256 threads with
8x8 to 4x4 outputs each: 128x128 down to 16x8 output tiles, optionally split-K) whose
configuration is autotuned per signature on hardware adapters (runtime/autotune.py), and a
GEMV kernel for M <= 4. The fused epilogue (activations,
residual operands; gemm's alpha, beta * c) is applied as each output is stored. conv.py reuses `gemm_launch`.

Dynamic dimensions (mltensor/dynamic/): matmul and gemm take M, N, K and batch dimensions known
only at dispatch. Such a size reaches the WGSL as an expression over the immediate `dims` (the
template reads every size through `sz`, which names its constant when static), workgroup counts
are evaluated per dispatch, and variants are chosen on what holds for every size: vec4 loads and
unchecked edges only where structurally valid (`K % 4 == 0` for `4*seq`), split-K with a fixed
chunk count (a chunk's length follows K). The range of M (or else N) is cut into at most
MAX_VARIANTS size buckets (_variants): the GEMV range (M <= GEMV_MAX_M) and the ranges where the
tile chosen at a bucket's maximum changes (lavapipe's 8 rows a thread from M >= 8*TY, the
candidates' 64- and 128-row tiles); each bucket's configuration is chosen (tuned) at its maximum,
and each is launched gated on its sizes at dispatch (outside its bucket, a single workgroup that
returns at once), so a size runs the tile a static build of the bucket's maximum runs, and the
path a static build of that size runs.
"""

from __future__ import annotations

from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import Sym, wgsl
from ..ir.graph import MLOperand
from ..ir.registry import MAX_RANK, builder_op, lowering, register
from ..runtime.wgsl import Binding, binop, f32_lit, store_fn
from ._gemm import batch_offset_expr, check_k, common_k, folds_batch, gemm_launch, vec_loads
from ._checks import broadcast_shapes, check_bool, check_number, check_support, same_type, unidirectional
from ._index import coords_of_batch, merge_dims, radix, row_strides
from .elementwise import broadcast_index, node_lines

FLOAT = dtypes.FLOATS

# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"matmul", "gemm"})


# -- matmul ---------------------------------------------------------------------------------

register(
    "matmul",
    {"a": FLOAT, "b": FLOAT, "output": FLOAT},
    ranks={"a": (2, MAX_RANK), "b": (2, MAX_RANK)},
)


@builder_op(renamed={"c": "b"})
def matmul(self: Any, a: MLOperand, b: MLOperand, *, label: str | None = None) -> MLOperand:
    """Matrix product of `a` [..., M, K] and `b` [..., K, N]
    -> [..., M, N], batch dimensions broadcast; 1-D operands are not allowed (rank >= 2).
    Runs on the tiled GEMM kernel family (or the GEMV path for M <= 4); activations and
    residual adds after it are fused into its stores."""
    # IDL: MLOperand matmul(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    self._operand(a, "matmul", "a")
    self._operand(b, "matmul", "b")
    check_support("matmul", a=a, b=b)
    same_type("matmul", ("a", a), ("b", b))
    check_k(
        self,
        a.shape[-1],
        b.shape[-2],
        f"[matmul] columns of a ({a.shape[-1]}) must equal rows of b ({b.shape[-2]}); "
        f"shapes {list(a.shape)} and {list(b.shape)}",
    )
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    return self._emit1("matmul", [a, b], {}, a.data_type, shape, label)


@lowering("matmul")
def _lower_matmul(kc, node):
    a, b = node.inputs
    out = kc.out(node)
    M, ka, kb, N = a.shape[-2], a.shape[-1], b.shape[-2], b.shape[-1]
    K = common_k(ka, kb)  # ka and kb are equal at dispatch (matmul's check_k)
    ob = out.shape[:-2]
    batch = math.prod(ob)
    fold = folds_batch(a.shape[:-2], b.shape[:-2], ob)
    if fold:  # one GEMM of batch * M rows (the output's flat indices, which act() reads, stay)
        M, batch = batch * M, 1
    params = {
        "a_base": "0u" if fold else batch_offset_expr(a.shape[:-2], ob, M * ka),
        "b_base": "0u" if fold else batch_offset_expr(b.shape[:-2], ob, kb * N),
        "a_sm": ka,
        "a_sk": 1,
        "b_sk": N,
        "b_sn": 1,
        "alpha": 1.0,
        "beta": 0.0,
        "has_c": False,
    }
    # 16-byte loads where rows are whole vec4s (row-major A with K % 4, B with N % 4): for a
    # dynamic size, only where that holds for every size (4*seq)
    vec = vec_loads(kc, direct=True)
    params.update(vec_a=vec and ka % 4 == 0, vec_b=vec and N % 4 == 0)
    t = kc.wtype(a)  # f32, or f16 (loaded into f32 accumulators, stored through ST)
    params["ST"] = store_fn(t)
    bindings = [
        Binding("a", f"vec4<{t}>" if params["vec_a"] else t),
        Binding("b", f"vec4<{t}>" if params["vec_b"] else t),
        Binding("out", t, True),
    ]
    args = [a, b, out]
    params["act"] = kc.epilogue(bindings, args)
    ln = _post_norm(kc, params, bindings, args, "out")
    name = f"matmul_{t}_{f'b{batch}_' if isinstance(batch, Sym) or batch > 1 else ''}{M}x{K}x{N}{ln}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, batch)


# -- gemm -----------------------------------------------------------------------------------

register(
    "gemm",
    {"a": FLOAT, "b": FLOAT, "c": FLOAT, "output": FLOAT},
    ranks={"a": (2, 2), "b": (2, 2), "c": (0, 2)},
)


@builder_op(renamed={"bb": "b"})
def gemm(
    self: Any,
    a: MLOperand,
    b: MLOperand,
    *,
    c: MLOperand | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    a_transpose: bool = False,
    b_transpose: bool = False,
    label: str | None = None,
) -> MLOperand:
    """General matrix multiply of 2-D operands: alpha * A' @ B' + beta * C, where A' is `a`
    (transposed when `a_transpose`), B' is `b` (transposed when `b_transpose`) and `c` an optional operand that broadcasts to the [M, N] output."""
    # IDL: MLOperand gemm(MLOperand a, MLOperand b, optional MLGemmOptions options = {});
    self._operand(a, "gemm", "a")
    self._operand(b, "gemm", "b")
    if c is not None:
        self._operand(c, "gemm", "c")
    check_support("gemm", a=a, b=b, c=c)
    same_type("gemm", ("a", a), ("b", b), ("c", c))
    alpha = check_number("gemm", "alpha", alpha)
    beta = check_number("gemm", "beta", beta)
    a_transpose = check_bool("gemm", "a_transpose", a_transpose)
    b_transpose = check_bool("gemm", "b_transpose", b_transpose)
    sa = a.shape[::-1] if a_transpose else a.shape
    sb = b.shape[::-1] if b_transpose else b.shape
    check_k(
        self,
        sa[1],
        sb[0],
        f"[gemm] K of a ({sa[1]}) must equal K of b ({sb[0]}); shapes {list(a.shape)} "
        f"(a_transpose={a_transpose}) and {list(b.shape)} (b_transpose={b_transpose})",
    )
    shape = (sa[0], sb[1])
    if c is not None:
        unidirectional("gemm", c.shape, shape)
    attrs = {"alpha": alpha, "beta": beta, "a_transpose": a_transpose, "b_transpose": b_transpose}
    return self._emit1("gemm", [a, b, c], attrs, a.data_type, shape, label)


@lowering("gemm")
def _lower_gemm(kc, node):
    a, b, c = node.inputs
    out = kc.out(node)
    at, bt = node.attrs["a_transpose"], node.attrs["b_transpose"]
    M, N = out.shape
    ka, kb = a.shape[0 if at else 1], b.shape[1 if bt else 0]
    K = common_k(ka, kb)  # equal at dispatch (gemm's check_k)
    params = {
        "a_base": "0u",
        "b_base": "0u",
        # A is [M, K] or, transposed, [K, M]; B is [K, N] or [N, K]
        "a_sm": 1 if at else ka,
        "a_sk": M if at else 1,
        "b_sk": 1 if bt else N,
        "b_sn": kb if bt else 1,
        "alpha": node.attrs["alpha"],
        "beta": node.attrs["beta"],
        "has_c": c is not None,
        # B transposed ([N, K], an ONNX Gemm with transB: fully connected layers) has k
        # contiguous: staged k-major on hardware adapters, so threads read consecutive words
        "b_kmajor": vec_loads(kc) and bt,  # (a CPU adapter's DIRECT path reads B as it lies)
    }
    t = kc.wtype(a)  # f32, or f16 (loaded into f32 accumulators, stored through ST)
    params["ST"] = store_fn(t)
    bindings = [Binding("a", t), Binding("b", t)]
    args = [a, b]
    if c is not None:
        cs = (1,) * (2 - len(c.shape)) + tuple(c.shape)
        params["c_sm"] = cs[1] if cs[0] != 1 else 0
        params["c_sn"] = 1 if cs[1] != 1 else 0
        bindings.append(Binding("c", t))
        args.append(c)
    bindings.append(Binding("out", t, True))
    args.append(out)
    params["act"] = kc.epilogue(bindings, args)
    name = f"gemm_{t}_{M}x{K}x{N}{'_at' if at else ''}{'_bt' if bt else ''}{'_c' if c is not None else ''}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, 1)


# -- _fused_matmul (compiler/fusion/gemm_views.py: views, rotary pairs, gated units, merged projections) ------

register("_fused_matmul", {"a": FLOAT, "b": FLOAT, "output": FLOAT})


def _post_norm(kc, params, bindings, args, out_name):
    """The normalization after the GEMM's epilogue (compiler/fusion/norm.py fuse_post_norms: the
    step's post_norm node): its scale and bias bound before the output (the last binding),
    `post_ln` the output binding holding the sums, `ln_dst` the one the normalized rows go to:
    the same one (in place), or where the sum is a value of its own (Step.outputs[1]) the
    normalization's output, bound last. Nothing where the step has none."""
    step = kc.step
    ln = step.post_norm if step is not None else None
    params.setdefault("post_ln", "")
    if ln is None:
        return ""
    _, scale, bias = ln.inputs
    for name, v in (("ln_s", scale), ("ln_b", bias)):
        if v is not None:
            bindings.insert(len(bindings) - 1, Binding(name, kc.wtype(v)))
            args.insert(len(args) - 1, v)
    dst = out_name
    if len(step.outputs) > 1:
        bindings.append(Binding("ln_o", kc.wtype(step.outputs[0]), True))
        args.append(step.outputs[0])
        dst = "ln_o"
    params.update(
        post_ln=out_name,
        ln_dst=dst,
        ln_eps=f32_lit(ln.attrs["epsilon"]),
        ln_scale=scale is not None,
        ln_bias=bias is not None,
        ln_rms=ln.op == "_rms_normalization",
    )
    tag = "_rmsn" if ln.op == "_rms_normalization" else "_ln"
    return tag if dst == out_name else tag + "2"


@lowering("_fused_matmul")
def _lower_fused(kc, node):
    """One GEMM over the plan's segments side by side (compiler/fusion/gemm_views.py FusedPlan). Columns of a
    pair segment come in octets: rotary "rope" (head size D): GEMM column c of head h, octet o,
    half j, lane l is channel o*4 + l + j*D/2, so channels d and d + D/2 are columns c and c + 4
    of one octet; "glu": quad 2o holds gate columns 4o..4o+3, quad 2o + 1 the same up columns.
    Every quad is one run of a B operand's columns (read as one quad: load_b4n). A thread (the
    tiled path with 8 columns a thread, or the GEMV's row thread) stores an octet through store8
    (any pair segment) or a quad through store4."""

    plan = node.attrs["plan"]
    segs = plan.segments
    src, A = node.inputs[0], plan.a
    mm0 = segs[0].mms[0]
    M = A.shape[-2]
    K = common_k(A.shape[-1], mm0.inputs[1].shape[-2])
    ob = mm0.outputs[0].shape[:-2]
    batch = math.prod(ob)
    # B operands are one [K, N] matrix (plain_b): where A is not a view and not broadcast, the
    # GEMM is one of batch * M rows, its stores finding (bt, m) of row batch * M + m (store_fn)
    fold = folds_batch(A.shape[:-2], (), ob)
    N = sum(s.width for s in segs)
    W = 8 if any(s.kind != "plain" for s in segs) else 4  # columns a store call takes
    t = kc.wtype(src)
    ST = store_fn(t)
    vec_a = vec_loads(kc, direct=True) and plan.a_view is None and A.shape[-1] % 4 == 0
    bindings = [Binding("a", f"vec4<{t}>" if vec_a else t)]
    args = [src]
    bname = []
    for j, s in enumerate(segs):
        bname.append([])
        for q, b in enumerate(s.bs):
            bname[-1].append(f"b{j}_{q}")
            bindings.append(Binding(bname[-1][-1], t))
            args.append(b)
    nb = sum(len(s.bs) for s in segs)
    extras = node.inputs[1 + nb :]
    rms = plan.rms  # (scale or None, epsilon): A is x, the GEMM computes rms_norm(x) * scale @ B
    rw = ""
    if rms is not None and rms[0] is not None:
        extras = extras[:-1]  # (the scale is the last input)
        bindings.append(Binding("rw", t))
        args.append(node.inputs[-1])
        rw = " * f32(rw[k])"
    xname = {}
    for k, v in enumerate(extras):
        xname[id(v)] = f"xb{k}"
        bindings.append(Binding(f"xb{k}", kc.wtype(v)))
        args.append(v)
    outs = list(node.outputs)
    single = len(outs) == 1
    oname = {}
    for k, v in enumerate(outs):
        oname[id(v)] = f"o{k}"
        w = kc.out(node, k)
        bindings.append(Binding(f"o{k}", kc.wtype(w), True))
        args.append(w)
    act = kc.epilogue(bindings, args) if single else ""

    params = {
        "a_base": "0u" if fold else batch_offset_expr(A.shape[:-2], ob, M * A.shape[-1]),
        "b_base": "0u",
        "a_sm": A.shape[-1],
        "a_sk": 1,
        "b_sk": N,
        "b_sn": 1,
        "alpha": 1.0,
        "beta": 0.0,
        "has_c": False,
        "vec_a": vec_a,
        "vec_b": False,
        "ST": ST,
        "act": act,
        "a_at": "",
        "fused_w": W,
        "fused_rms": f32_lit(rms[1]) if rms is not None else "",
    }
    if plan.a_view is not None:  # (folded: load_a's row m is row m % M of matrix m / M)
        rows = [f"(m / {wgsl(M)})", f"(m % {wgsl(M)})"] if fold else ["bt", "m"]
        params["a_at"] = plan.a_view.load_index(coords_of_batch(A.shape[:-2], rows[0]) + [rows[1], "k"])

    # B: the segment of column n, its operand and the column there (quad base for load_b4n)
    def col_of(s, c):
        """(operand index, WGSL column) of segment column c (c a WGSL expression)."""
        if s.kind == "plain":
            return 0, c
        if s.kind == "rope":
            h = s.head
            return (
                0,
                f"({c} / {h}u) * {h}u + (({c} % {h}u) / 8u) * 4u + ((({c} % {h}u) / 4u) % 2u) * {h // 2}u + ({c} % 4u)",
            )
        return None, f"({c} / 8u) * 4u + ({c} % 4u)"  # glu: operand by ((c / 4) % 2)

    one, where, start = [], [], 0
    ops = [(j, q) for j, s in enumerate(segs) for q in range(len(s.bs))]  # operand codes
    for j, s in enumerate(segs):
        c = f"(n - {start}u)" if start else "n"
        end = start + s.width
        q, col = col_of(s, c)
        code = ops.index((j, 0))
        if q is None:  # glu: gate quads, up quads alternate
            b1 = (
                f"let q = {col}; if ((({c} / 4u) % 2u) == 0u) {{ return f32({bname[j][0]}[k * {s.n}u + q]){rw}; }} "
                f"return f32({bname[j][1]}[k * {s.n}u + q]){rw};"
            )
            w4 = f"return vec2<u32>({code}u + (({c} / 4u) % 2u), {col});"
        else:
            b1 = f"return f32({bname[j][q]}[k * {s.n}u + {col}]){rw};"
            w4 = f"return vec2<u32>({code + q}u, {col});"
        last = j == len(segs) - 1
        one.append(f"    {b1}" if last else f"    if (n < {end}u) {{ {b1} }}")
        where.append(f"    {w4}" if last else f"    if (n < {end}u) {{ {w4} }}")
        start = end
    params["b_fused"] = "\n".join(one)
    cases = []
    for code, (j, q) in enumerate(ops):
        b = bname[j][q]
        ld = f"let r = k * {segs[j].n}u + w.y; return vec4<f32>(f32({b}[r]), f32({b}[r + 1u]), f32({b}[r + 2u]), f32({b}[r + 3u])){rw};"
        cases.append(f"        case {code}u: {{ {ld} }}" if code < len(ops) - 1 else f"        default: {{ {ld} }}")
    # the fused GEMV's loops over k: one per segment, B operands and columns fixed outside them
    loops, start = [], 0
    for j, s in enumerate(segs):
        c = f"(n - {start}u)" if start else "n"
        end = start + s.width
        body = [
            "        let av = vec4<f32>(load_a(bt, 0u, k), load_a(bt, 1u, k), load_a(bt, 2u, k), load_a(bt, 3u, k));"
        ]
        if rms is not None:
            body.append("        ssq = fma(av, av, ssq);")
        head = []
        for qq in range(W // 4):
            cq = f"({c} + {4 * qq}u)" if qq else c
            q, col = col_of(s, cq)
            b = bname[j][qq % 2 if q is None else q]  # glu: the octet's quads are gate, then up
            head.append(f"        let c{qq} = {col};")
            body.append(f"        let r{qq} = k * {s.n}u + c{qq};")
            body.append(
                f"        let b{qq} = vec4<f32>(f32({b}[r{qq}]), f32({b}[r{qq} + 1u]), f32({b}[r{qq} + 2u]), f32({b}[r{qq} + 3u])){rw};"
            )
            body += [f"        acc{qq}[{e}] = fma(av, vec4<f32>(b{qq}.{'xyzw'[e]}), acc{qq}[{e}]);" for e in range(4)]
        loop = (
            head
            + [f"        for (var k = li; k < {wgsl(K)}; k = k + 64u) {{"]
            + ["    " + x for x in body]
            + ["        }"]
        )
        cond = f"n < {end}u" if j < len(segs) - 1 else "true"
        loops.append(f"    {'if' if j == 0 else 'else if'} ({cond}) {{\n" + "\n".join(loop) + "\n    }")
        start = end
    params["gemv_loop"] = "\n".join(loops)
    # where a quad of columns is (operand, first column): computed once per quad, outside the loops
    # over k where the kernel can (the GEMV); load_bq reads row k there
    params["b4_fused"] = "    return load_bq(k, bquad(n));"
    params["b_quad"] = (
        "fn bquad(n: u32) -> vec2<u32> {\n" + "\n".join(where) + "\n}\n\n"
        "fn load_bq(k: u32, w: vec2<u32>) -> vec4<f32> {\n    switch w.x {\n" + "\n".join(cases) + "\n    }\n}\n"
    )

    # stores
    fns = []

    def writes(leaf, val, f, pad="        "):
        return [f"{pad}{oname[id(v)]}[{f}] = {f'act({val}, {f})' if single else val};" for v in leaf.values]

    def pre_lines(s, names, tag):
        names.update(
            {
                id(v): f"{xname[id(v)]}[{broadcast_index(v.shape, s.x.shape, 'i')}]"
                for n in s.pre
                for v in n.inputs
                if v is not None and id(v) in xname
            }
        )
        return node_lines(kc, s.pre, names, tag)

    def guarded(conds, lines):
        if not conds:
            return lines
        return [f"    if ({' && '.join(conds)}) {{"] + ["    " + x for x in lines] + ["    }"]

    for j, s in enumerate(segs):
        xs = s.x.shape
        nn = wgsl(xs[-1])
        bc = coords_of_batch(xs[:-2])

        def idx(c, nn=nn):
            return f"bt * ({wgsl(M)} * {nn}) + m * {nn} + {c}" if any(not _is1(d) for d in ob) else f"m * {nn} + {c}"

        if s.kind == "plain":
            names = {id(s.mms[0].outputs[0]): "x"}
            pl, last = pre_lines(s, names, "p")
            val = last or "x"
            body = [f"    let i = {idx('c')};"] + pl
            for k, leaf in enumerate(s.leaves):
                f, conds = leaf.view.store_index(bc + ["m", "c"], leaf.into())
                body.append(f"    let f{k} = {f};")
                body += guarded(conds, writes(leaf, val, f"f{k}", "    "))
            fns.append(f"fn put{j}(bt: u32, m: u32, c: u32, x: {t}) {{\n" + "\n".join(body) + "\n}")
            fns.append(
                f"fn seg{j}(bt: u32, m: u32, c: u32, v: vec4<f32>) {{\n"
                + "".join(f"    put{j}(bt, m, c + {q}u, {ST}(v.{'xyzw'[q]}));\n" for q in range(4))
                + "}"
            )
            if W == 8:
                fns.append(
                    f"fn oct{j}(bt: u32, m: u32, c: u32, lo: vec4<f32>, hi: vec4<f32>) {{\n"
                    f"    seg{j}(bt, m, c, lo);\n    seg{j}(bt, m, c + 4u, hi);\n}}"
                )
        elif s.kind == "rope":
            h = s.head
            leaf = s.leaves[0]
            cos, sin = leaf.rope
            tv = leaf.values[0]
            tt = kc.wtype(tv)
            body, vals = [], []
            for q in (0, 1):
                names = {id(s.mms[0].outputs[0]): f"y{q}"}
                pl, last = pre_lines(s, names, f"p{q}_")
                body.append(f"    let i{q} = {idx(f'c{q}')};")
                body += _reindex(pl, f"i{q}")
                vals.append(last or f"y{q}")
            f, conds = leaf.view.store_index(bc + ["m", "c0"], leaf.into())
            rshape = leaf.view.shape  # the rotation's own shape (cos / sin broadcast to it)

            def at(v, var):
                return f"{xname[id(v)]}[{broadcast_index(v.shape, rshape, var)}]"

            y0, y1 = vals
            r0 = binop("+", tt, binop("*", tt, y0, at(cos, "t0")), binop("*", tt, f"(-{y1})", at(sin, "t0")))
            r1 = binop("+", tt, binop("*", tt, y1, at(cos, "t1")), binop("*", tt, y0, at(sin, "t1")))
            body += [f"    let f0 = {f};", f"    let f1 = f0 + {h // 2}u;"]
            if leaf.cat is not None:  # (f0: the place in the concat; t0: in the rotation)
                body += [f"    let t0 = {leaf.view.store_index(bc + ['m', 'c0'])[0]};", f"    let t1 = t0 + {h // 2}u;"]
            else:
                body += ["    let t0 = f0;", "    let t1 = f1;"]
            inner = [f"    let r0: {tt} = {r0};", f"    let r1: {tt} = {r1};"]
            inner += writes(leaf, "r0", "f0", "    ") + writes(leaf, "r1", "f1", "    ")
            body += guarded(conds, inner)
            fns.append(
                f"fn pair{j}(bt: u32, m: u32, c0: u32, y0: {t}, y1: {t}) {{\n    let c1 = c0 + {h // 2}u;\n"
                + "\n".join(body)
                + "\n}"
            )
            # octet c (a multiple of 8) of head h: channels d .. d+3 and d + D/2 .. d + D/2 + 3
            fns.append(
                f"fn oct{j}(bt: u32, m: u32, c: u32, lo: vec4<f32>, hi: vec4<f32>) {{\n"
                f"    let d = (c / {h}u) * {h}u + ((c % {h}u) / 8u) * 4u;\n"
                + "".join(
                    f"    pair{j}(bt, m, d + {q}u, {ST}(lo.{'xyzw'[q]}), {ST}(hi.{'xyzw'[q]}));\n" for q in range(4)
                )
                + "}"
            )
        else:  # glu
            g, u = (mm.outputs[0] for mm in s.mms)
            names = {id(g): "g", id(u): "u"}
            pl, last = pre_lines(s, names, "p")
            body = [f"    let i = {idx('c')};"] + pl
            leaf = s.leaves[0]
            f, conds = leaf.view.store_index(bc + ["m", "c"], leaf.into())
            body.append(f"    let f = {f};")
            body += guarded(conds, writes(leaf, last, "f", "    "))
            fns.append(f"fn pair{j}(bt: u32, m: u32, c: u32, g: {t}, u: {t}) {{\n" + "\n".join(body) + "\n}")
            fns.append(
                f"fn oct{j}(bt: u32, m: u32, c: u32, lo: vec4<f32>, hi: vec4<f32>) {{\n"
                f"    let o = (c / 8u) * 4u;\n"
                + "".join(
                    f"    pair{j}(bt, m, o + {q}u, {ST}(lo.{'xyzw'[q]}), {ST}(hi.{'xyzw'[q]}));\n" for q in range(4)
                )
                + "}"
            )
    disp, start = [], 0
    call = "oct{j}(bt, m, {c}, lo, hi)" if W == 8 else "seg{j}(bt, m, {c}, v)"
    for j, s in enumerate(segs):
        c = f"n - {start}u" if start else "n"
        end = start + s.width
        cj = call.format(j=j, c=c)
        disp.append(f"    if (n < {end}u) {{ {cj}; return; }}" if j < len(segs) - 1 else f"    {cj};")
        start = end
    sig = "lo: vec4<f32>, hi: vec4<f32>" if W == 8 else "v: vec4<f32>"
    if fold:  # the kernel's row r of batch * M is row r % M of matrix r / M
        head = (
            f"fn store{W}(b0: u32, r: u32, n: u32, {sig}) {{\n"
            f"    if (r >= {wgsl(batch * M)} || n >= {N}u) {{ return; }}\n"
            f"    let bt = r / {wgsl(M)};\n    let m = r % {wgsl(M)};\n"
        )
    else:
        head = f"fn store{W}(bt: u32, m: u32, n: u32, {sig}) {{\n    if (m >= {wgsl(M)} || n >= {N}u) {{ return; }}\n"
    fns.append(head + "\n".join(disp) + "\n}")
    params["fused_store"] = "\n\n".join(fns)
    # the inputs before the rows this kernel writes into concats (a KV cache's past), copied by
    # every workgroup's threads in turn (grid-stride) before the GEMM
    copies = []
    for s in segs:
        for leaf in s.leaves:
            if leaf.cat is None:
                continue
            p, axis = leaf.cat
            rs = row_strides(leaf.values[0].shape)
            idx = radix("e", merge_dims([(d, (st,)) for d, st in zip(p.shape, rs)]))[0]
            writes_ = " ".join(f"{oname[id(v)]}[{idx}] = {xname[id(p)]}[e];" for v in leaf.values)
            copies.append(
                f"    for (var e = g * nt + li; e < {wgsl(math.prod(p.shape))}; e = e + ng * nt) {{ {writes_} }}"
            )
    params["fused_copy"] = (
        ("fn copy_in(g: u32, ng: u32, li: u32, nt: u32) {\n" + "\n".join(copies) + "\n}") if copies else ""
    )
    kinds = "+".join(s.kind if s.kind != "rope" else f"rope{s.head}" for s in segs)
    if plan.a_view is not None:
        kinds = "aview+" + kinds
    if rms is not None:
        kinds = "rms+" + kinds
    kinds += _post_norm(kc, params, bindings, args, "o0")
    if fold:
        M, batch = batch * M, 1
    name = f"matmul_{t}_{f'b{batch}_' if isinstance(batch, Sym) or batch > 1 else ''}{M}x{K}x{N}_{kinds}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, batch)


def _is1(d):
    return isinstance(d, int) and d == 1


def _reindex(lines, var):
    """Lines reading element `i` of bound values, made to read `var` instead."""
    import re

    return [re.sub(r"\bi\b", var, ln) for ln in lines]
