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

a: float32 [1, K] (or [K]) with K a multiple of 32; output float32 [1, N] (or [N]).
"""

from ..dynamic.kernels import grid
from ..ir.registry import builder_op, lowering, register
from ..runtime.wgsl import Binding, Kernel

BLOCK = 32
# Threads a workgroup and output rows a thread, measured on lavapipe (2 cores, SmolLM2-135M's
# decode step, runs alternated): 32 threads of 2 rows 142-150 ms a step, 64 of 2
# 152-186 ms, 64 of 1 185-203 ms, 256 of 1 200-220 ms. Small workgroups spread even a 192-row
# projection over several (lavapipe runs one workgroup per core at a time); 2 rows share a's loads.
WG = 32
ROWS = 2

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


@builder_op
def _llm_gemv(b, a, packed, scales, *, K, N, bits, zero_points=None, label=None):
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
    if a.data_type != "float32" or tuple(a.shape) not in ((K,), (1, K)):
        raise TypeError(f"[{where}] a must be float32 [1, {K}] or [{K}], got {a.data_type} {list(a.shape)}")
    kb = K // BLOCK
    if packed.data_type != "uint32" or tuple(packed.shape) != (N * kb * bits,):
        raise TypeError(f"[{where}] b must be uint32 [{N * kb * bits}], got {packed.data_type} {list(packed.shape)}")
    for what, v, types in (("scales", scales, ("float32", "float16")), ("zero_points", zero_points, ("float32",))):
        if v is not None and (v.data_type not in types or tuple(v.shape) != (N * kb,)):
            raise TypeError(
                f"[{where}] {what} must be {' or '.join(types)} [{N * kb}], got {v.data_type} {list(v.shape)}"
            )
    attrs = {"K": K, "N": N, "bits": bits, "has_zp": zero_points is not None}
    ins = [a, packed, scales] + ([zero_points] if zero_points is not None else [])
    return b._emit1(where, ins, attrs, "float32", tuple(a.shape[:-1]) + (N,), label)


@lowering("_llm_gemv")
def _lower(kc, node):
    at = node.attrs
    K, N, bits = at["K"], at["N"], at["bits"]
    p = {
        "N": N,
        "KB": K // BLOCK,
        "BITS": bits,
        "has_zp": at["has_zp"],
        "ZP": float(1 << (bits - 1)),
        "WG": WG,
        "R": ROWS,
    }
    bindings = [Binding("a", "vec4<f32>"), Binding("b", "u32"), Binding("scales", kc.wtype(node.inputs[2]))]
    args = list(node.inputs[:3])
    if at["has_zp"]:
        bindings.append(Binding("zp", "f32"))
        args.append(node.inputs[3])
    bindings.append(Binding("out", "f32", True))
    args.append(kc.out(node))
    name = f"llm_gemv{bits}_{K}x{N}{'_zp' if at['has_zp'] else ''}_s{kc.wtype(node.inputs[2])}"
    # loops: K / 32 blocks of `bits` words (runtime/wgsl.py LOOP_BUDGET; K past ~190000 refused
    # where the cap may apply)
    kc.launch(
        Kernel(name, "llm_gemv.wgsl", p, bindings),
        args,
        grid(-(-N // (WG * ROWS))),
        iters=(K // BLOCK) * (bits + 2) + 16,
    )
