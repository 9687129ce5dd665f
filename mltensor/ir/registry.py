"""The operator registry: what each operator supports (the single source of validation and of
`op_support_limits()`), how its nodes lower to kernels, and the builder methods that record them.

Families (mltensor/ops/*.py, and extensions such as llm/kernels.py) register here; the builder
class is attached once (front/builder.py) and gets every method registered before or after.
"""

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

from .. import dtypes
from ..errors import NotSupportedError
from . import opdocs
from .graph import MLOperand

MAX_RANK = 8


@dataclass
class OpDef:
    name: str
    support: dict  # operand name -> tuple of data types ("output" included)
    ranks: dict = field(default_factory=dict)  # operand name -> (min, max)
    lower: object = None
    expr: object = None
    activation: bool = False


OPS = {}


def register(name, support, *, ranks=None, lower=None, expr=None, activation=False):
    OPS[name] = OpDef(name, support, ranks or {}, lower, expr, activation)
    return OPS[name]


def lowering(name):
    """Decorator: set the lowering function of an already registered operator."""

    def deco(fn):
        OPS[name].lower = fn
        return fn

    return deco


DYNAMIC = set()  # builder methods that accept dynamic dimensions (each family's DYNAMIC_OPS)
BUILDER_METHODS = {}  # method name -> the builder method (builder_op)
_attached = []  # builder classes the methods are set on (attach)


def builder_op(fn=None, *, renamed=None):
    """Attach an operator function `fn(self, ...)` as MLGraphBuilder.<fn name> (now if the
    builder class is attached already, else when `attach` runs). Operands with dynamic
    dimensions reach only operators in DYNAMIC (their family's DYNAMIC_OPS: shape inference and
    kernels that handle sizes known at dispatch); any other raises NotSupportedError first.

    `fn`'s parameters after `self` carry the WebNN spec's names in snake_case (`input`, `a`, `b`,
    `filter`, `true_value`, ...). `renamed` maps keywords the method took before (one release of
    deprecation, issue 46) to those names: an old keyword still works, with a DeprecationWarning.
    A public method's docstring is completed from opdocs.py: Parameters (each one's type and
    default from `fn`'s signature, its description from the table), Returns and Raises.
    Use as `@builder_op` or `@builder_op(renamed={"x": "input"})`."""
    if fn is None:
        return functools.partial(builder_op, renamed=renamed)
    name = fn.__name__
    renamed = dict(renamed or {})

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        if renamed and kwargs:
            kwargs = _new_keywords(name, renamed, kwargs)
        self._check_state(name)
        if self._dims and name not in DYNAMIC:
            refuse_dynamic(name, args, kwargs)
        return fn(self, *args, **kwargs)

    method.renamed = renamed
    if not name.startswith("_"):
        method.__doc__ = opdocs.compose(name, fn, renamed)
    BUILDER_METHODS[name] = method
    for cls in _attached:
        setattr(cls, name, method)
    return fn


def _new_keywords(name, renamed, kwargs):
    """kwargs with each deprecated keyword replaced by its WebNN name (with a DeprecationWarning)."""
    out = {}
    for k, v in kwargs.items():
        new = renamed.get(k)
        if new is None:
            out[k] = v
            continue
        if new in kwargs:
            raise TypeError(f"[{name}] got both {new}= and its deprecated name {k}=")
        warnings.warn(
            f"[{name}] the keyword {k}= is deprecated: use {new}= (the WebNN operand name); "
            "the old name goes in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        out[new] = v
    return out


def refuse_dynamic(name, args, kwargs):
    for v in [*args, *kwargs.values()]:
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(x, MLOperand) and x.dynamic:
                raise NotSupportedError(
                    f"[{name}] operand shape {list(x.shape)} has dynamic dimensions, which {name} does not "
                    "support yet (it needs sizes fixed at build)"
                )


def attach(cls):
    """Set every registered builder method on `cls`, and those registered later too."""
    _attached.append(cls)
    for name, method in BUILDER_METHODS.items():
        setattr(cls, name, method)


def support_limits(ctx: Any) -> dict[str, Any]:
    """The WebNN MLOpSupportLimits dictionary, in snake_case."""

    def entry(types, rank=(0, MAX_RANK)):
        return {"data_types": list(types), "rank_range": {"min": rank[0], "max": rank[1]}}

    limits = {
        "preferred_input_layout": "nchw",
        "max_tensor_byte_length": ctx._max_bytes,
        "input": entry(dtypes.ALL),
        "constant": entry(dtypes.ALL),
        "output": entry(dtypes.ALL),
    }
    for name, op in sorted(OPS.items()):
        if name.startswith("_"):
            continue
        limits[name] = {w: entry(t, op.ranks.get(w, (0, MAX_RANK))) for w, t in op.support.items()}
    return limits
