"""Operator families: one file each, holding the builder methods (validation, shape and type
inference, attached to MLGraphBuilder with @builder_op) and the lowering of their nodes to WGSL
kernels from shaders/.

A family registers each operator with `ir.registry.register`: the data types and ranks it supports
per operand (the single source of both validation and `op_support_limits()`), and either
- `expr`: an elementwise operator given as a WGSL expression; the compiler fuses chains of these
  into one kernel (and into conv2d/matmul/gemm epilogues: unary ones when `activation=True`,
  binary ones whose other operand broadcasts to the conv/matmul output, e.g. residual adds), or
- `lower`: a function `lower(kc, node)` that emits launches through the compiler's KernelContext.

Shared helpers live in the modules whose names start with `_` (never loaded as families):
`_checks` (validation), `_index` (WGSL index arithmetic), `_gemm` (the GEMM engine). This file
only loads the families: importing `mltensor.ops` registers every operator.
"""

import importlib
import pkgutil

from ..ir.registry import DYNAMIC


def _load_families():
    # Import every family module in this package so that each registers itself and attaches its
    # builder methods (adding a family is adding a file).
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            mod = importlib.import_module(f"{__name__}.{m.name}")
            DYNAMIC.update(getattr(mod, "DYNAMIC_OPS", ()))


_load_families()
