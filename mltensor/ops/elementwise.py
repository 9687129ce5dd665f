"""Elementwise operators: binary arithmetic, unary math, cast and activations.

Each operator is a WGSL expression over its operands; the compiler fuses chains of them into one
kernel (shaders/elementwise.wgsl), and unary activations and binary nodes (residual adds, scales)
into conv2d/matmul/gemm epilogues (epilogue_fn).
Inputs broadcast numpy-style; the kernel computes each input's index from the output index with
strides baked in (0 along broadcast dimensions).

float16 in f16 (dtypes.py): arithmetic, comparisons, abs/neg/sign, relu, clamp, prelu and casts are
plain f16; every float-only unary and activation is evaluated in f32 on the widened input and
rounded once (`_in_f32`): shaders/common.wgsl's GPU-safe helpers (tanh_f32, erf_f32, sin_f32, ...)
are f32-only, and numpy's float16 math is exactly that (float32, then rounded).
"""

from __future__ import annotations

import inspect
import math
import re as _re
from typing import Any

from .. import dtypes
from ..dynamic.dims import wgsl
from ..dynamic import kernels as dynamic_kernels
from ..dynamic.kernels import SizeParams, grid
from ..ir.graph import MLOperand, external_inputs, inline_scalar, scalar_value
from ..ir.registry import OPS, builder_op, register
from ..runtime.wgsl import EMULATED, WORKGROUP, Binding, Kernel, binop, compare, convert, lit, unop
from ._checks import broadcast_shapes, check_number, check_support, same_type
from ._index import merge_dims, radix, row_strides

ALL = dtypes.ALL
FLOAT = dtypes.FLOATS
SIGNED = dtypes.SIGNED

# Every operator here takes dynamic dimensions (mltensor/dynamic/): broadcasting compares sizes
# structurally and the fused kernels index with sizes read at dispatch.
DYNAMIC_OPS = frozenset(
    (
        "add sub mul div max min pow prelu abs ceil cos erf exp floor identity log neg reciprocal sign "
        "sin sqrt tan clamp elu gelu hard_sigmoid hard_swish leaky_relu linear relu sigmoid softplus "
        "softsign tanh cast"
    ).split()
)


def _t(kc, node, i=0):
    return kc.wtype(node.inputs[i])


# -- binary ---------------------------------------------------------------------------------


def _div(kc, node, a, b):
    t = _t(kc, node)
    if t in dtypes.FLOAT_COMPUTE:
        return f"({a} / {b})"
    if t in EMULATED:
        return f"{t}_div({a}, {b})"  # truncating, 0 for division by zero
    # integers: truncating division; division by zero gives 0 rather than WGSL's `a`
    z = lit(0, t)
    return f"select({a} / {b}, {z}, {b} == {z})"


def _arith(op):
    return lambda kc, n, a, b: binop(op, _t(kc, n), a, b)


def _pow(kc, node, a, b):
    t = _t(kc, node)
    if t == "f16":
        return f"f16_of(pow_f32(f32({a}), f32({b})))"
    return f"{t}_pow({a}, {b})" if t in EMULATED else f"pow_{t}({a}, {b})"


BINARY = {
    "add": (ALL, _arith("+")),
    "sub": (ALL, _arith("-")),
    "mul": (ALL, _arith("*")),
    "div": (ALL, _div),
    "max": (ALL, _arith("max")),
    "min": (ALL, _arith("min")),
    "pow": (ALL, _pow),
}


def binary_op(name, out_type=None, operands=("a", "b"), doc=None):
    """Attach the builder method of a broadcasting binary operator (arithmetic and prelu here,
    comparison and logical in compare.py): two operands (named `operands`, the spec's names:
    the method's parameters, in errors and support limits) of one data type, broadcast both
    ways; the output is out_type, else that type."""
    n0, n1 = operands

    def emit(self: Any, x: MLOperand, y: MLOperand, label: str | None) -> MLOperand:
        self._operand(x, name, n0)
        self._operand(y, name, n1)
        check_support(name, **{n0: x, n1: y})
        same_type(name, (n0, x), (n1, y))
        shape = broadcast_shapes(name, x.shape, y.shape, self)
        return self._emit1(name, [x, y], {}, out_type or x.data_type, shape, label)

    if operands == ("input", "slope"):

        def op(self: Any, input: MLOperand, slope: MLOperand, *, label: str | None = None) -> MLOperand:
            return emit(self, input, slope, label)

        renamed = {"a": "input", "c": "slope"}
    else:

        def op(self: Any, a: MLOperand, b: MLOperand, *, label: str | None = None) -> MLOperand:
            return emit(self, a, b, label)

        renamed = {"c": "b"}
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc or BINARY_DOCS.get(name)
    builder_op(op, renamed=renamed)


# Docstrings of the generated binary methods (what MLGraphBuilder.<name> shows; comparison and
# logical ones in compare.py).
BINARY_DOCS = {
    "add": "Elementwise sum a + b, the operands broadcast numpy-style.",
    "sub": "Elementwise difference a - b, the operands broadcast numpy-style.",
    "mul": "Elementwise product a * b, the operands broadcast numpy-style.",
    "div": "Elementwise quotient a / b, the operands broadcast numpy-style (integers: truncated, 0 for a "
    "division by zero).",
    "max": "Elementwise maximum of a and b, the operands broadcast numpy-style.",
    "min": "Elementwise minimum of a and b, the operands broadcast numpy-style.",
    "pow": "Elementwise a to the power b, the operands broadcast numpy-style.",
    "prelu": "input where input >= 0, else slope * input (input and slope broadcast numpy-style).",
}


def _binary(name, types, fn):
    register(name, {"a": types, "b": types, "output": types}, expr=fn)
    binary_op(name)


for _name, (_types, _fn) in BINARY.items():
    _binary(_name, _types, _fn)


# -- unary ----------------------------------------------------------------------------------


def _f(expr):
    """Float-only unary given as a format string over {x}."""
    return lambda kc, n, x: expr.format(x=x)


def _keep_nan(kc, n, x, expr):
    """`expr`, but NaN for a NaN float input: GPU min/max/sign return a number for NaN."""
    t = _t(kc, n)
    return f"select({expr}, {x}, is_nan_{t}({x}))" if t in dtypes.FLOAT_COMPUTE else expr


def _un(op):
    return lambda kc, n, x: unop(op, _t(kc, n), x)


UNARY = {
    "abs": (("float32", "float16", "int32", "int64", "int8"), _un("abs")),
    "ceil": (FLOAT, _f("ceil({x})")),
    "cos": (FLOAT, _f("cos_f32({x})")),
    "erf": (FLOAT, _f("erf_f32({x})")),
    "exp": (FLOAT, _f("exp({x})")),
    "floor": (FLOAT, _f("floor({x})")),
    "identity": (ALL, lambda kc, n, x: x),
    "log": (FLOAT, _f("log({x})")),
    "neg": (("float32", "float16", "int32", "int64", "int8"), _un("neg")),
    "reciprocal": (FLOAT, _f("(1.0 / {x})")),
    "sign": (
        ("float32", "float16", "int32", "int64", "int8"),
        lambda kc, n, x: _keep_nan(kc, n, x, unop("sign", _t(kc, n), x)),
    ),
    "sin": (FLOAT, _f("sin_f32({x})")),
    "sqrt": (FLOAT, _f("sqrt({x})")),
    "tan": (FLOAT, _f("tan_f32({x})")),
}


def _in_f32(fn):
    """A float-only operator's expression (written for f32) for f16 too: evaluated on the input
    widened to f32 and rounded once to f16 (f16_of: +-inf past 65504, as numpy's float16)."""

    def expr(kc, n, x):
        if _t(kc, n) != "f16":
            return fn(kc, n, x)
        return f"f16_of({fn(kc, n, f'f32({x})')})"

    return expr


def _unary(name, types, fn, attrs_of=None, activation=False):
    if tuple(types) == FLOAT:
        fn = _in_f32(fn)
    register(name, {"input": types, "output": types}, expr=fn, activation=activation)

    def op(self: Any, input: MLOperand, *, label: str | None = None, **options: Any) -> MLOperand:
        self._operand(input, name, "input")
        check_support(name, input=input)
        attrs = attrs_of(name, input, **options) if attrs_of else _no_options(name, options)
        return self._emit1(name, [input], attrs, input.data_type, input.shape, label)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = _UNARY_DOCS.get(name)
    # The options as the keywords they are (signature, docs, the type stub): `**options` is
    # checked against them (_opts, _clamp_attrs)
    P = inspect.Parameter
    defaults = getattr(attrs_of, "defaults", {})
    op.__signature__ = inspect.Signature(
        [
            P("self", P.POSITIONAL_OR_KEYWORD),
            P("input", P.POSITIONAL_OR_KEYWORD, annotation="MLOperand"),
            *(
                P(k, P.KEYWORD_ONLY, default=d, annotation="float" if d is not None else "float | None")
                for k, d in defaults.items()
            ),
            P("label", P.KEYWORD_ONLY, default=None, annotation="str | None"),
        ],
        return_annotation="MLOperand",
    )
    builder_op(op, renamed={"x": "input"})


# Docstrings of the generated unary and activation methods (what MLGraphBuilder.<name> shows).
_UNARY_DOCS = {
    "abs": "Elementwise absolute value.",
    "ceil": "Elementwise ceiling (round toward +inf).",
    "cos": "Elementwise cosine (radians).",
    "erf": "Elementwise Gauss error function.",
    "exp": "Elementwise e to the power x.",
    "floor": "Elementwise floor (round toward -inf).",
    "identity": "The input unchanged (a copy; fused away where it can be).",
    "log": "Elementwise natural logarithm (NaN below 0, -inf at 0).",
    "neg": "Elementwise negation.",
    "reciprocal": "Elementwise 1 / x.",
    "sign": "Elementwise sign: -1, 0 or 1 (NaN stays NaN).",
    "sin": "Elementwise sine (radians).",
    "sqrt": "Elementwise square root.",
    "tan": "Elementwise tangent (radians).",
    "clamp": "Clamp to [`min_value`, `max_value`] (options; default -inf and +inf). Fuses into the "
    "producing convolution / matmul as an activation.",
    "elu": "x where x >= 0, else `alpha` * (exp(x) - 1) (option `alpha`, default 1.0).",
    "gelu": "Gaussian error linear unit: 0.5 * x * (1 + erf(x / sqrt(2))).",
    "hard_sigmoid": "max(0, min(1, `alpha` * x + `beta`)) (options, defaults 0.2 and 0.5).",
    "hard_swish": "x * max(0, min(1, x / 6 + 0.5)).",
    "leaky_relu": "x where x >= 0, else `alpha` * x (option `alpha`, default 0.01).",
    "linear": "`alpha` * x + `beta` (options, defaults 1.0 and 0.0).",
    "relu": "max(0, x) (NaN stays NaN). Fuses into the producing convolution / matmul.",
    "sigmoid": "1 / (1 + exp(-x)).",
    "softplus": "log(1 + exp(x)), computed without overflow.",
    "softsign": "x / (1 + abs(x)).",
    "tanh": "Elementwise hyperbolic tangent.",
}


def _no_options(name, options):
    if options:
        raise TypeError(f"[{name}] unexpected options {sorted(options)}")
    return {}


for _name, (_types, _fn) in UNARY.items():
    _unary(_name, _types, _fn, activation=_name == "identity")


# -- activations ----------------------------------------------------------------------------


def _opts(defaults):
    def attrs_of(name, x, **options):
        extra = set(options) - set(defaults)
        if extra:
            raise TypeError(f"[{name}] unexpected options {sorted(extra)}")
        return {k: check_number(name, k, options.get(k, d)) for k, d in defaults.items()}

    attrs_of.defaults = defaults
    return attrs_of


def _bound_opt(name, what, v):
    """A clamp bound as a float, or as an int where the float would round it (64-bit integer
    bounds beyond 2**53 stay exact)."""
    if hasattr(v, "__index__") and not isinstance(v, bool) and float(int(v)) != int(v):
        return int(v)
    return check_number(name, what, v)


def _clamp_attrs(name, x, min_value=None, max_value=None):
    lo = float("-inf") if min_value is None else _bound_opt(name, "min_value", min_value)
    hi = float("inf") if max_value is None else _bound_opt(name, "max_value", max_value)
    if lo > hi:
        raise TypeError(f"[{name}] min_value ({lo}) must not be greater than max_value ({hi})")
    return {"min_value": lo, "max_value": hi}


_clamp_attrs.defaults = {"min_value": None, "max_value": None}


def _clamp(kc, n, x):
    t = _t(kc, n)
    lo, hi = n.attrs["min_value"], n.attrs["max_value"]
    if t not in dtypes.FLOAT_COMPUTE:
        # integers: saturate the float bounds into the compute type's range
        bound = dtypes.INT_RANGE[t]
        lo = max(bound[0], min(bound[1], lo)) if lo != float("-inf") else bound[0]
        hi = max(bound[0], min(bound[1], hi)) if hi != float("inf") else bound[1]
        lo, hi = math.ceil(lo), math.floor(hi)
    if t in EMULATED:
        return f"{t}_clamp({x}, {lit(lo, t)}, {lit(hi, t)})"
    return f"clamp({x}, {lit(lo, t)}, {lit(hi, t)})"


def _a(n, k):
    return lit(n.attrs[k], "f32")


ACTIVATIONS = {
    # name: (types, expr, option defaults or custom attrs function)
    "clamp": (ALL, _clamp, _clamp_attrs),
    "elu": (
        FLOAT,
        lambda kc, n, x: f"select({_a(n, 'alpha')} * expm1_f32({x}), {x}, {x} >= 0.0)",
        _opts({"alpha": 1.0}),
    ),
    # 0.5 x erfc(-x / sqrt 2): no 1 + erf cancellation in the left tail; the limit 0 at -inf
    "gelu": (
        FLOAT,
        lambda kc, n, x: f"select(0.5 * {x} * erfc_f32({x} * -0.70710678118654752), 0.0, {x} <= -3.0e38)",
        None,
    ),
    # clamp() of NaN is a bound on GPUs (min/max drop NaN): keep NaN explicitly
    "hard_sigmoid": (
        FLOAT,
        lambda kc, n, x: f"select(clamp({_a(n, 'alpha')} * {x} + {_a(n, 'beta')}, 0.0, 1.0), {x}, is_nan_f32({x}))",
        _opts({"alpha": 0.2, "beta": 0.5}),
    ),
    # exactly 0 at and below -3 (so -inf gives 0, not -inf * 0)
    "hard_swish": (FLOAT, lambda kc, n, x: f"select({x} * clamp({x} / 6.0 + 0.5, 0.0, 1.0), 0.0, {x} <= -3.0)", None),
    "leaky_relu": (FLOAT, lambda kc, n, x: f"select({_a(n, 'alpha')} * {x}, {x}, {x} >= 0.0)", _opts({"alpha": 0.01})),
    "linear": (
        FLOAT,
        lambda kc, n, x: f"({_a(n, 'alpha')} * {x} + {_a(n, 'beta')})",
        _opts({"alpha": 1.0, "beta": 0.0}),
    ),
    "relu": (
        ("float32", "float16", "int32", "int64", "int8"),
        lambda kc, n, x: _keep_nan(kc, n, x, binop("max", _t(kc, n), x, lit(0, _t(kc, n)))),
        None,
    ),
    "sigmoid": (FLOAT, lambda kc, n, x: f"sigmoid_f32({x})", None),
    "softplus": (FLOAT, lambda kc, n, x: f"softplus_f32({x})", None),
    # beyond 1e7 the quotient is +-1 in f32; computing it would divide inf by inf (or, with a
    # GPU's reciprocal-based division, flush 1 / 1e38 to 0)
    "softsign": (FLOAT, lambda kc, n, x: f"select({x} / (1.0 + abs({x})), sign({x}), abs({x}) > 1.0e7)", None),
    "tanh": (FLOAT, lambda kc, n, x: f"tanh_f32({x})", None),
}

for _name, (_types, _fn, _attrs) in ACTIVATIONS.items():
    _unary(_name, _types, _fn, attrs_of=_attrs, activation=True)


# -- prelu (binary; input and slope broadcast both ways, as in the current spec) -----------------


def _prelu(kc, n, x, s):
    t = _t(kc, n)
    return f"select({binop('*', t, x, s)}, {x}, {compare('>=', t, x, lit(0, t))})"


register("prelu", {"input": SIGNED, "slope": SIGNED, "output": SIGNED}, expr=_prelu)
binary_op("prelu", operands=("input", "slope"))


# -- cast -----------------------------------------------------------------------------------

# Narrowing integers truncate (wrap), widening extends by the source's signedness, int <-> float
# converts the value, negative floats to unsigned wrap like C casts (see wgsl.convert).
register("cast", {"input": ALL, "output": ALL}, expr=lambda kc, n, x: convert(x, _t(kc, n), kc.wtype(n.outputs[0])))


@builder_op(renamed={"x": "input", "data_type": "type"})
def cast(self: Any, input: MLOperand, type: str, *, label: str | None = None) -> MLOperand:
    """Convert to the data type `type`: integers narrowing wrap, widening extend by the
    source's signedness; floats to integers truncate toward zero (negative floats to unsigned
    wrap, as C casts)."""
    # IDL: MLOperand cast(MLOperand input, MLOperandDataType type, optional MLOperatorOptions options = {});
    self._operand(input, "cast", "input")
    dt = dtypes.normalize(type, "cast")
    return self._emit1("cast", [input], {"to": dt}, dt, input.shape, label)


# -- lowering of fused groups -----------------------------------------------------------------


def _index_expr(in_shape, out_shape):
    """WGSL expression for the flat index into an input broadcast to out_shape, from `i`
    (stride 0 along the broadcast dimensions)."""
    s = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    strides = [0 if n == 1 else st for n, st in zip(s, row_strides(s))]
    return radix("i", merge_dims([(n, (st,)) for n, st in zip(out_shape, strides)]))[0]


def lower_group(kc, nodes, out):
    """One kernel for a fused chain of elementwise nodes writing `out`: one thread per element,
    evaluating the chain through group_fn.

    vec4 path: when every input is either the output's shape or a single value and the size is a
    multiple of 4, each thread loads and stores vec4s (128-bit memory ops) and evaluates the
    scalar chain once per component, so any operator's expression works unchanged."""
    ext = external_inputs(nodes)
    size = math.prod(out.shape)
    t = kc.wtype(out)
    types = {kc.wtype(v) for v in ext + [out]} | {kc.wtype(n.outputs[0]) for n in nodes}
    vec = (
        size % 4 == 0
        and types <= {"f32", "f16", "i32", "u32"}
        and all(x.shape == out.shape or math.prod(x.shape) == 1 for x in ext)
    )
    # Static sizes as launch parameters (one pipeline for a chain at every size): the element
    # count where no input broadcasts; with broadcasting, the sizes and strides of a grid
    # launch (_grid_layout: coordinates from workgroup ids, no division). The flat path's
    # broadcast indices divide by sizes, and a division by a value read at dispatch (u32, or
    # through f32) made those kernels 1.2-1.3x slower on lavapipe (constant divisors compile
    # to multiplications; bench/test_bench_startup.py), so they keep their constants.
    plain = all(x.shape == out.shape or math.prod(x.shape) == 1 for x in ext)
    P = kc.size_params() if isinstance(size, int) else SizeParams(0)
    layout = None if plain or not P else _grid_layout(ext, out)
    if not plain and layout is None:
        P = SizeParams(0)
    if layout is not None:
        return _lower_grid(kc, nodes, out, ext, layout, P)
    if vec:
        fns, loads, body = "", [], []
        for k, x in enumerate(ext):
            loads.append(f"    let x{k} = in{k}[i];" if x.shape == out.shape else f"    let x{k}s = in{k}[0];")
        for c in "xyzw":
            names = {id(x): f"x{k}.{c}" if x.shape == out.shape else f"x{k}s" for k, x in enumerate(ext)}
            for j, n in enumerate(nodes):
                args = [names[id(x)] for x in n.inputs if x is not None]
                body.append(f"    let v{j}{c}: {kc.wtype(n.outputs[0])} = {OPS_EXPR(n)(kc, n, *args)};")
                names[id(n.outputs[0])] = f"v{j}{c}"
        last = len(nodes) - 1
        result = f"vec4<{t}>(" + ", ".join(f"v{last}{c}" for c in "xyzw") + ")"
    else:
        (fns, _), loads, body, result = group_fn(kc, nodes, "elem", "in"), [], [], "elem(i)"
    threads = size // 4 if vec else size
    name = "ew_" + "_".join(n.op for n in nodes[:6]) + ("_etc" if len(nodes) > 6 else "")
    name += f"_{'vec4' if vec else ''}{t}_n{size}"

    def elem(x):
        return f"vec4<{kc.wtype(x)}>" if vec and x.shape == out.shape else kc.wtype(x)

    bindings = [Binding(f"in{k}", elem(x)) for k, x in enumerate(ext)]
    bindings.append(Binding("out", f"vec4<{t}>" if vec else t, True))
    kernel = Kernel(
        name,
        "elementwise.wgsl",
        {"n": P(threads), "fns": fns, "loads": "\n".join(loads), "body": "\n".join(body), "result": result},
        bindings,
        sizes=P.values,
    )
    kc.launch(kernel, ext + [out], grid(-(-threads // WORKGROUP)))


def _grid_layout(ext, out):
    """(sizes, strides) of a grid launch of a broadcasting group: the output's dimensions merged
    where every input is contiguous along them, at most 3 left (z, y, x: outermost first), with
    each input's strides along them (0: broadcast); None where more remain or a grid dimension
    would exceed the workgroup-count limit (the flat path then)."""

    rank = len(out.shape)
    cols = []
    for x in ext:
        s = (1,) * (rank - len(x.shape)) + tuple(x.shape)
        cols.append([0 if n == 1 else st for n, st in zip(s, row_strides(s))])
    out_strides = row_strides(out.shape)
    dims = merge_dims([(n, (out_strides[d], *(c[d] for c in cols))) for d, n in enumerate(out.shape)])
    if not 2 <= len(dims) <= 3:
        return None
    dims = [(1, (0,) * (len(ext) + 1))] * (3 - len(dims)) + dims
    (sz, _), (sy, _), (sx, _) = dims
    wx = _grid_wx(sx)
    cap = dynamic_kernels.MAX_GROUPS  # (read at the call: tests shrink it)
    if -(-sx // wx) > cap or -(-sy // (WORKGROUP // wx)) > cap or sz > cap:
        return None
    return [d[0] for d in dims], [[d[1][k + 1] for d in dims] for k in range(len(ext))]


GRID_WX = 8  # threads of a grid workgroup along short rows, the other 32 along y: at most 7 idle
# at the end of a row whatever its width, so every width takes one kernel


def _grid_wx(sx):
    """Threads of a grid workgroup along x: WORKGROUP for rows of at least that many elements
    (one row a workgroup: a broadcast over a whole plane), else GRID_WX. Two kernels per chain
    at most; measured on lavapipe (bench/test_bench_startup.py), a grid launch reading its sizes
    as parameters runs as fast as the flat launch dividing by constants, GRID_WX-wide rows for
    planes of thousands of elements 10% slower."""
    return WORKGROUP if sx >= WORKGROUP else GRID_WX


def _lower_grid(kc, nodes, out, ext, layout, P):
    """lower_group for a broadcasting group as a grid launch: thread (x, y) of workgroup
    (gx, gy, z) computes output element (z, y, x) of the output merged into 3 dimensions
    (_grid_layout), each input read at the dot product of those coordinates and its strides.
    Sizes and strides are launch parameters: every size of a chain whose broadcast has this
    shape shares the pipeline, and nothing divides."""
    (sz, sy, sx), strides = layout
    wx = _grid_wx(sx)
    wy = WORKGROUP // wx
    X, Y = P(sx), P(sy)

    def index(k, x):
        if x.shape == out.shape:
            return "i"
        terms = [(c if st == 1 else f"{c} * {wgsl(P(st))}") for c, st in zip(("cz", "cy", "cx"), strides[k]) if st]
        return " + ".join(terms) or "0u"

    loads = [f"    let x{k} = in{k}[{index(k, x)}];" for k, x in enumerate(ext)]
    fns, _ = group_fn(kc, nodes, "elem", "in", loads=loads, signature="i: u32, cx: u32, cy: u32, cz: u32")
    t = kc.wtype(out)
    name = "ew_" + "_".join(n.op for n in nodes[:6]) + ("_etc" if len(nodes) > 6 else "")
    name += f"_{t}_n{math.prod(out.shape)}"
    bindings = [Binding(f"in{k}", kc.wtype(x)) for k, x in enumerate(ext)] + [Binding("out", t, True)]
    kernel = Kernel(
        name,
        "elementwise.wgsl",
        {
            "grid": {"wx": wx, "wy": wy, "sx": X, "sy": Y},
            "fns": fns,
            "loads": "",
            "body": "",
            "result": "elem(i, cx, cy, cz)",
        },
        bindings,
        sizes=P.values,
    )
    kc.launch(kernel, ext + [out], (-(-sx // wx), -(-sy // wy), sz))


def group_fn(kc, nodes, name, prefix, loads=None, signature="i: u32"):
    """(WGSL `fn name(i: u32) -> T` evaluating a fused elementwise group at flat index `i` of its
    output, T its compute type; the group's external inputs, which the function reads bound as
    `{prefix}0`, `{prefix}1`, ... in order, each loaded once at its broadcast index). Used by the
    group's own kernel (lower_group) and by a kernel that reads through the group instead of its
    output (a gate's pool, pool.py). loads: the `let x<k> = ...;` lines reading the inputs,
    when the caller indexes them itself (a grid launch, whose function takes `signature`)."""
    ext = external_inputs(nodes)
    out = nodes[-1].outputs[0]
    lines = (
        list(loads)
        if loads is not None
        else [f"    let x{k} = {prefix}{k}[{_index_expr(x.shape, out.shape)}];" for k, x in enumerate(ext)]
    )
    names = {id(x): f"x{k}" for k, x in enumerate(ext)}
    for j, n in enumerate(nodes):
        args = [names[id(x)] for x in n.inputs if x is not None]
        lines.append(f"    let v{j}: {kc.wtype(n.outputs[0])} = {OPS_EXPR(n)(kc, n, *args)};")
        names[id(n.outputs[0])] = f"v{j}"
    body = "\n".join(lines)
    return f"fn {name}({signature}) -> {kc.wtype(out)} {{\n{body}\n    return v{len(nodes) - 1};\n}}", ext


def OPS_EXPR(node):

    return OPS[node.op].expr


def activation_lines(kc, nodes, x, wtype):
    """(WGSL `let` lines, name of the result) applying unary nodes `nodes` in order to the value
    named `x` (a fused prologue's activations, conv.py)."""
    lines, cur = [], x
    for j, n in enumerate(nodes):
        lines.append(f"    let {x}{j}: {wtype} = {OPS_EXPR(n)(kc, n, cur)};")
        cur = f"{x}{j}"
    return lines, cur


def epilogue_fn(kc, step, extra, wtype):
    """WGSL `fn act(x: T, i: u32) -> T` applying a step's epilogue nodes to the value `x` stored at
    flat output index `i`; `extra` are the other operands of its binary nodes, bound as `e0`, ..."""

    out_shape = step.nodes[0].outputs[0].shape
    names = {id(v): f"e{k}[{_index_expr(v.shape, out_shape)}]" for k, v in enumerate(extra)}
    for n in step.epilogue:  # float scalar constants: literals (epilogue_operands leaves them out)
        for v in n.inputs:
            if v is not None and id(v) not in names and inline_scalar(v) is not None:
                names[id(v)] = kc.epilogue_const(inline_scalar(v), kc.wtype(v))
    views = []
    for k, v in enumerate(extra):
        pad = step.views.get(id(v))
        if pad is not None:
            names[id(v)] = f"e{k}_at(i)"
            views.append(_pad_view(kc, pad, f"e{k}"))
    names[id(step.nodes[0].outputs[0])] = "x"
    lines, cur = [], "x"
    for j, n in enumerate(step.epilogue):
        args = [names[id(x)] for x in n.inputs if x is not None]
        cur = f"a{j}"
        lines.append(f"    let {cur}: {wtype} = {OPS_EXPR(n)(kc, n, *args)};")
        names[id(n.outputs[0])] = cur
    body = "\n".join(lines)
    return "".join(views) + f"fn act(x: {wtype}, i: u32) -> {wtype} {{\n{body}\n    return {cur};\n}}"


def _pad_view(kc, pad, name):
    """WGSL `fn {name}_at(i: u32) -> T`: element i (row-major) of constant pad node `pad`'s output,
    read from its input bound as `name`: the pad value outside the input, else the input element."""
    x, out = pad.inputs[0], pad.outputs[0]
    t = kc.wtype(out)
    begin = pad.attrs["beginning_padding"]
    lines, terms, inner = [], [], 1
    strides = row_strides(x.shape)
    for d in range(len(out.shape) - 1, -1, -1):
        size = out.shape[d]
        c = f"((i / {inner}u) % {size}u)" if inner > 1 else f"(i % {size}u)"
        if size == x.shape[d] and not begin[d]:
            terms.append(f"{c} * {strides[d]}u")
        else:  # u32: a coordinate left of the input wraps past its size and fails the test too
            lines.append(f"    let c{d} = {c} - {begin[d]}u;")
            lines.append(f"    if (c{d} >= {x.shape[d]}u) {{ return {lit(pad.attrs['value'], t)}; }}")
            terms.append(f"c{d} * {strides[d]}u")
        inner *= size
    body = "\n".join(lines)
    return f"fn {name}_at(i: u32) -> {t} {{\n{body}\n    return {name}[{' + '.join(terms) or '0u'}];\n}}\n\n"


def node_lines(kc, nodes, names, tag="p"):
    """(WGSL `let` lines, name of the last result) evaluating elementwise `nodes` in order (a DAG:
    each reads values named in `names`, id(value) -> WGSL expression, or earlier nodes' results;
    host constants of one element are inlined as literals). `names` gains each result. Used by
    the fused GEMM's stores (matmul.py _lower_fused)."""

    lines, cur = [], None
    for j, n in enumerate(nodes):
        args = []
        for x in n.inputs:
            if x is None:
                continue
            if id(x) in names:
                args.append(names[id(x)])
            else:
                c = scalar_value(x)
                if c is None:
                    raise KeyError(f"{n.op}: operand {x} is not bound")
                args.append(lit(c, kc.wtype(x)))
        cur = f"{tag}{j}"
        lines.append(f"    let {cur}: {kc.wtype(n.outputs[0])} = {OPS_EXPR(n)(kc, n, *args)};")
        names[id(n.outputs[0])] = cur
    return lines, cur


def broadcast_index(in_shape, out_shape, var):
    """WGSL flat index into a value of `in_shape` broadcast to `out_shape`, at flat index `var`
    of the output."""
    e = _index_expr(in_shape, out_shape)
    return e if var == "i" else _re_i.sub(var, e)


_re_i = _re.compile(r"\bi\b")
