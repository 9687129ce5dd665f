"""`_llm_gemv`: one row of activations times 4/8-bit block weights (shaders/llm_gemv.wgsl), the
decode step's projections on CPU adapters.

An internal builder operator (leading underscore, not WebNN), registered when mltensor.llm is
imported. It reads the buffers `_matmul_nbits` reads (packed uint32 words, float32 scales, float32
zero points or the default 2^(bits-1); blocks of 32), so a model may use both on the same weight
constants, which the context's constant store keeps once. Measured on lavapipe (2 cores,
SmolLM2-135M's projections): `_matmul_nbits`' GEMV, whose workgroups split a row's words and
reduce them in workgroup memory, spends 96% of a decode step; this kernel's threads of two output
rows each (no barriers, nibbles extracted as vec4s) are the lavapipe choice (see model.py). On GPUs
`_matmul_nbits` keeps the decode step (its workgroups use the memory system as GPUs want).

a: float32 [M, K] (or [K]) with K a multiple of 32, M static or dynamic (a serving step's rows,
mltensor/llm/model.py "rows"); output float32 [M, N] (or [N]). A thread computes R output columns
for MT rows of a (`rows_tile`; 0: one row where a has one, eight otherwise, chosen at
dispatch: STEP_TILE_*), the weights' words decoded once for them; each output's sum runs
in the same order for every M and MT, so a row's result does not depend on the rows beside it.
"""

from ..dynamic.dims import Sym, cdiv, size_at_least, wgsl
from ..dynamic.kernels import grid
from ..ir.registry import DYNAMIC, builder_op, lowering, register
from ..runtime.wgsl import Binding, cpu_device, Kernel

BLOCK = 32
# Threads a workgroup and output rows a thread, measured on lavapipe (2 cores, SmolLM2-135M's
# decode step, runs alternated): 32 threads of 2 rows 142-150 ms a step, 64 of 2
# 152-186 ms, 64 of 1 185-203 ms, 256 of 1 200-220 ms. Small workgroups spread even a 192-row
# projection over several (lavapipe runs one workgroup per core at a time). More output rows a
# thread share a's loads: alternated in one process (session 49, host shared, SmolLM2's decode
# step), 16 rows 0.77x the time of 2, 8 rows 0.79x (the 49152-row output head dominates).
WG = 32
ROWS_CPU = 16
ROWS_GPU = 2  # (GPUs want threads: unmeasured, the serving step's only use there)
# (rows of a, output rows) a thread of a serving step with several rows (rows_tile 0), CPU
# adapters: SmolLM2-135M's step of 8 rows, variants alternated in one process (host shared):
# against (8, 4): (8, 16) 0.56-0.77x, (8, 24) 0.73x, (8, 12) 0.55-0.90x, (8, 8) 0.63-0.80x,
# (4, 8) 0.69x, (4, 4) 1.23x, (8, 2) 1.64x, (16, 4) 2.05x. A thread's words are decoded once for
# its 8 rows of a, a's loads shared by its 16 output rows. GPUs: unmeasured.
STEP_TILE_CPU = (8, 16)
STEP_TILE_GPU = (8, 2)

register(
    "_llm_gemv",
    {
        "a": ("float32",),
        "b": ("uint32",),
        "scales": ("float32", "float16"),
        "zero_points": ("float32",),
        "output": ("float32",),
    },
    ranks={"a": (1, 2), "b": (1, 1), "scales": (1, 1), "zero_points": (1, 1)},
)
DYNAMIC.add("_llm_gemv")  # a's rows may be known at dispatch only


@builder_op
def _llm_gemv(b, a, packed, scales, *, K, N, bits, zero_points=None, rows_tile=1, label=None):
    where = "_llm_gemv"
    for what, v in (("a", a), ("b", packed), ("scales", scales), ("zero_points", zero_points)):
        if v is not None:
            b._operand(v, where, what)
    for what, v in (("K", K), ("N", N)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TypeError(f"[{where}] {what} must be a positive integer, got {v!r}")
    if bits not in (4, 8):
        raise TypeError(f"[{where}] bits must be 4 or 8, got {bits!r}")
    if K % BLOCK:
        raise TypeError(f"[{where}] K must be a multiple of {BLOCK}, got {K}")
    if a.data_type != "float32" or a.shape[-1] != K or isinstance(a.shape[-1], Sym):
        raise TypeError(f"[{where}] a must be float32 [M, {K}] or [{K}], got {a.data_type} {list(a.shape)}")
    if rows_tile not in (0, 1, 2, 4, 8):
        raise TypeError(
            f"[{where}] rows_tile must be 0 (chosen by the rows at dispatch), 1, 2, 4 or 8, got {rows_tile!r}"
        )
    kb = K // BLOCK
    if packed.data_type != "uint32" or tuple(packed.shape) != (N * kb * bits,):
        raise TypeError(f"[{where}] b must be uint32 [{N * kb * bits}], got {packed.data_type} {list(packed.shape)}")
    for what, v, types in (("scales", scales, ("float32", "float16")), ("zero_points", zero_points, ("float32",))):
        if v is not None and (v.data_type not in types or tuple(v.shape) != (N * kb,)):
            raise TypeError(
                f"[{where}] {what} must be {' or '.join(types)} [{N * kb}], got {v.data_type} {list(v.shape)}"
            )
    attrs = {"K": K, "N": N, "bits": bits, "has_zp": zero_points is not None, "MT": rows_tile}
    ins = [a, packed, scales] + ([zero_points] if zero_points is not None else [])
    return b._emit1(where, ins, attrs, "float32", tuple(a.shape[:-1]) + (N,), label)


@lowering("_llm_gemv")
def _lower(kc, node):
    at = node.attrs
    K, N, bits = at["K"], at["N"], at["bits"]
    M = node.inputs[0].shape[0] if node.inputs[0].rank == 2 else 1
    p = {
        "M": wgsl(M) if isinstance(M, Sym) else f"{M}u",
        "N": N,
        "KB": K // BLOCK,
        "BITS": bits,
        "has_zp": at["has_zp"],
        "ZP": float(1 << (bits - 1)),
        "WG": WG,
        "gate": "",
    }
    bindings = [Binding("a", "vec4<f32>"), Binding("b", "u32"), Binding("scales", kc.wtype(node.inputs[2]))]
    args = list(node.inputs[:3])
    if at["has_zp"]:
        bindings.append(Binding("zp", "f32"))
        args.append(node.inputs[3])
    bindings.append(Binding("out", "f32", True))
    args.append(kc.out(node))
    base = f"llm_gemv{bits}_{K}x{N}{'_zp' if at['has_zp'] else ''}_s{kc.wtype(node.inputs[2])}"
    MT = at.get("MT", 1)
    # rows_tile 0 ("auto", a serving step): one row a thread where the step has one row,
    # STEP_TILE_* where it has more; both launched, each gated on M at dispatch (the same sums
    # either way): the gate is a factor 0 or 1 of its workgroup count, so the dispatch skips the
    # other tile (launched, its 0-row threads would still cost lavapipe ~0.1 ms a launch)
    cpu = cpu_device(kc.device)
    rows, step = (ROWS_CPU, STEP_TILE_CPU) if cpu else (ROWS_GPU, STEP_TILE_GPU)
    if MT:
        tiles = [(MT, rows, "", 1)]
    else:
        many = size_at_least(M, 2)
        tiles = [(1, rows, f"{p['M']} < 2u", 1 - many), (*step, f"{p['M']} >= 2u", many)]
    if not isinstance(M, Sym):
        tiles = [(t, r, "", 1) for t, r, gate, _ in tiles if not gate or (M < 2) == (t == 1)]
    for mt, r, gate, on in tiles:
        gn = -(-N // (WG * r))
        # loops: K / 32 blocks of `bits` words (runtime/wgsl.py LOOP_BUDGET; K past ~190000
        # refused where the cap may apply)
        kc.launch(
            Kernel(f"{base}_mt{mt}r{r}", "llm_gemv.wgsl", dict(p, MT=mt, R=r, GN=gn, gate=gate), bindings),
            args,
            grid(gn * cdiv(M, mt) * on),
            iters=(K // BLOCK) * (bits + 2) + 16,
        )
