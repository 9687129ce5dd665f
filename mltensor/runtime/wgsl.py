"""WGSL templates from shaders/, binding declarations, and the per-device pipeline cache.

Templates use jinja2 with WGSL-friendly delimiters (`{$ ... $}` blocks, `{{ ... }}` values) and
StrictUndefined, as pygfx does. Binding declarations are generated here, never written per kernel.
Pipelines are cached on what defines them (template, parameters, bindings), not on rendered text.
Set MLTENSOR_DUMP_WGSL=1 to get the numbered source of a kernel that fails to compile.
"""

import os
import re
import struct
import threading
import weakref
from dataclasses import dataclass, field, replace

import wgpu

from ..dynamic.dims import Condition, Sym, high, hoisting, untag
from ..dynamic.dims import wgsl as dims_wgsl
from ..dynamic.kernels import declaration
from ..errors import NotSupportedError, OperationError

WORKGROUP = 256  # threads per 1-D workgroup: software adapters and GPUs both like 256
# Mesa's llvmpipe (lavapipe, the software Vulkan adapter CI and every no-GPU user runs on) ends
# the loops of an invocation silently once it has run 65535 loop iterations in total (all its
# loops, a nested loop's iterations each counted; loops the compiler unrolls not): no error, the
# results are just wrong (one thread summing 100000 ones wrote 65535). A kernel whose loops grow
# with a size declares its worst-case count per invocation (KernelContext.launch(iters=), through
# loop_guard) and its lowering picks a variant splitting the work across invocations before the
# count passes LOOP_BUDGET (margin for the few fixed loops a count leaves out: barriers' trees,
# combine loops); a declared count past it is refused with an error naming the operator.
LLVMPIPE_LOOP_CAP = 65535
LOOP_BUDGET = 60000


def loop_capped(device):
    """The device may cut loops (a CPU adapter: Mesa's llvmpipe), or MLTENSOR_LOOP_CAP=1 (tests on
    a GPU). Split variants are chosen from the sizes on every adapter (they are also what a GPU
    wants); a kernel with no variant below the budget is refused only where the cap may apply."""
    if os.environ.get("MLTENSOR_LOOP_CAP", "") not in ("", "0"):
        return True
    return cpu_device(device)


def cpu_device(device):
    """The device runs on a CPU adapter (Mesa's llvmpipe: lavapipe), where kernels' shapes are
    chosen for vector lanes and two cores rather than a GPU's memory system."""
    return str(device.adapter.info.get("adapter_type", "")).upper() == "CPU"


def loop_guard(where, iters):
    """NotSupportedError naming `where` when some allowed size gives an invocation more than
    LOOP_BUDGET loop iterations (`iters`: an int or a Sym, its largest value counts)."""
    n = high(iters)
    if n > LOOP_BUDGET:
        raise NotSupportedError(
            f"[{where}] a kernel would loop up to {n} times in one invocation, more than the "
            f"{LOOP_BUDGET} allowed (Mesa's llvmpipe silently stops an invocation's loops after "
            f"{LLVMPIPE_LOOP_CAP} iterations, giving wrong results); no split variant covers this size"
        )


def shader_dir():
    # The package mltensor.shaders, beside this module's package: installed or a checkout (a git
    # worktree imported through PYTHONPATH next to an editable install of another checkout
    # included), the templates of the mltensor that runs.
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shaders")


_env_made = None
_env_lock = threading.Lock()


def _finalize(v):
    if isinstance(v, Sym):
        return dims_wgsl(v)
    if isinstance(v, Condition):
        return v.wgsl()
    return v


def template_env():
    """The jinja2 environment of shaders/ (made on first use: a process that loads its graphs
    from the graph cache renders nothing and never imports jinja2)."""
    global _env_made
    if _env_made is None:
        with _env_lock:
            if _env_made is None:
                import jinja2

                env = jinja2.Environment(
                    loader=jinja2.FileSystemLoader(shader_dir()),
                    block_start_string="{$",
                    block_end_string="$}",
                    variable_start_string="{{",
                    variable_end_string="}}",
                    comment_start_string="{#",
                    comment_end_string="#}",
                    undefined=jinja2.StrictUndefined,
                    trim_blocks=True,
                    lstrip_blocks=True,
                    keep_trailing_newline=True,
                    # a size (Sym) or a condition on sizes in `{{ }}` renders as WGSL reading
                    # it at dispatch, a derived field where the kernel has room (dims.hoisting)
                    finalize=_finalize,
                )
                # LD / ST: conversions templates put around loads and stores of kernels that
                # compute float16 in f32 (LD = "f32", ST = "f16_of"); empty (no conversion)
                # unless a lowering sets them.
                env.globals.update(
                    f32_lit=f32_lit,
                    lit=lit,
                    main_1d=main_1d,
                    WORKGROUP=WORKGROUP,
                    wide64=False,
                    emu64=False,
                    f16=False,
                    fast_div=False,
                    LD="",
                    ST="",
                    u=lambda x: size(x),
                )
                _env_made = env
    return _env_made


def f32_lit(x):
    """An exact WGSL f32 literal for any Python float, inf and NaN included."""
    (bits,) = struct.unpack("<I", struct.pack("<f", float(x)))
    return f"bitcast<f32>({bits}u)"


def f16_lit(x):
    """An exact WGSL f16 expression for any Python float, rounded to float16 as numpy does (so
    beyond 65504 it is +-inf). Finite values are decimal literals converted by f16(), exact
    because the decimal is the float16 value itself; inf and NaN, which have no literal, are f32
    bit patterns converted (naga rejects bitcast<vec2<f16>>, which would keep a NaN payload)."""
    import numpy as np

    with np.errstate(over="ignore"):
        v = float(np.float16(x))
    if v != v or v in (float("inf"), float("-inf")):
        return f"f16({f32_lit(v)})"
    return f"f16({v!r})"


def lit(x, wtype):
    """A WGSL literal of compute type `wtype` ("f32", "f16", "i32", "u32", "i64", "u64", "i64e",
    "u64e"). Integers saturate into the type's range (negative values give 0 for unsigned types)."""
    if wtype == "f32":
        return f32_lit(x)
    if wtype == "f16":
        return f16_lit(x)
    if wtype == "i32":
        v = int(x)
        v = max(-(2**31), min(2**31 - 1, v))
        return f"i32({v})" if v != -(2**31) else "i32(-2147483647 - 1)"
    if wtype == "i64":
        v = max(-(2**63), min(2**63 - 1, int(x)))
        # -(2**63) has no literal (the negation of 2**63 overflows)
        return f"i64({v}li)" if v != -(2**63) else "(-9223372036854775807li - 1li)"
    if wtype == "u64":
        v = max(0, min(2**64 - 1, int(x)))
        return f"{v}lu"
    if wtype in EMULATED:
        lo, hi = (-(2**63), 2**63 - 1) if wtype == "i64e" else (0, 2**64 - 1)
        v = max(lo, min(hi, int(x))) & (2**64 - 1)  # two's complement words
        return f"vec2<u32>({v & 0xFFFFFFFF}u, {v >> 32}u)"
    v = int(x) & 0xFFFFFFFF if int(x) >= 0 else 0
    return f"{v}u"


# -- typed expressions ------------------------------------------------------------------------
# int64/uint64 on a device without "shader-int64" compute in "i64e"/"u64e": two 32-bit words
# (vec2<u32>, shaders/int64e.wgsl), where WGSL's operators and builtins would work per word. Code
# that generates arithmetic, comparisons or conversions for a value that may be 64-bit spells them
# with the functions below: WGSL operators for the other types, int64e.wgsl calls for these.

EMULATED = ("i64e", "u64e")
_E64 = {"+": "e64_add", "-": "e64_sub", "*": "e64_mul"}


def binop(op, t, a, b):
    """`a op b` in compute type t; op is one of + - * max min (integer division is
    elementwise.py's, which defines division by zero). f16 arithmetic is plain f16 (IEEE: results
    past 65504 are +-inf, as numpy's float16)."""
    if t in EMULATED:
        return f"{_E64[op]}({a}, {b})" if op in _E64 else f"{t}_{op}({a}, {b})"
    return f"{op}({a}, {b})" if op in ("max", "min") else f"({a} {op} {b})"


def compare(op, t, a, b):
    """The bool `a op b` in compute type t; op is one of == != < <= > >=."""
    if t not in EMULATED:
        return f"({a} {op} {b})"
    if op in ("==", "!="):
        return f"{'!' if op == '!=' else ''}e64_eq({a}, {b})"
    fn = f"{t}_{'lt' if op in ('<', '>') else 'le'}"
    return f"{fn}({a}, {b})" if op[0] == "<" else f"{fn}({b}, {a})"


def unop(op, t, x):
    """neg, abs or sign of x in compute type t (abs of an unsigned value is itself)."""
    if t in ("u32", "u64", "u64e") and op == "abs":
        return x
    if t in EMULATED:
        return "e64_neg({x})".format(x=x) if op == "neg" else f"{t}_{op}({x})"
    if op == "neg":
        return f"(-{x})"
    return f"sign_i64({x})" if (op, t) == ("sign", "i64") else f"{op}({x})"


def to_f32(x, t):
    """x of compute type t (f32 or f16) as f32: where f16 kernels compute what needs f32."""
    return f"f32({x})" if t == "f16" else x


def from_f32(x, t):
    """An f32 expression as compute type t (f32 or f16): f16_of rounds to nearest and gives +-inf
    past 65504 and NaN for NaN (a plain f16() of an out-of-range f32 is undefined in WGSL)."""
    st = store_fn(t)
    return f"{st}({x})" if st else x


def store_fn(t):
    """The templates' ST parameter for compute type t: the function an f32 result goes through to
    be stored as t, "f16_of" for f16 (see from_f32), "" (nothing) for f32."""
    return "f16_of" if t == "f16" else ""


def ld_st(t):
    """The LD / ST template parameters of kernels that accumulate in f32: f16 values are loaded
    through LD = "f32" and stored through ST = "f16_of"; both empty for every other type."""
    return {"LD": "f32" if t == "f16" else "", "ST": store_fn(t)}


def convert(x, src, dst):
    """x of compute type `src` as compute type `dst`: integers wrap (narrowing truncates, widening
    extends by the source's signedness, as numpy and C), float -> integer truncates toward zero
    (negative floats to unsigned wrap through the signed type, as C casts do)."""
    if src == dst or {src, dst} <= set(EMULATED):
        return x  # i64e <-> u64e: the same two's complement words
    if src == "f16":  # to f32 exactly, then as from f32
        return convert(f"f32({x})", "f32", dst)
    if dst == "f16":  # through f32 (exact for f16's range), rounded once by f16_of
        return f"f16_of({convert(x, src, 'f32')})"
    if dst in EMULATED:
        if src == "f32":
            return (
                f"{dst}_from_f32({x})"
                if dst == "i64e"
                else f"select(u64e_from_f32({x}), i64e_from_f32({x}), {x} < 0.0)"
            )
        return f"i64e_from_i32({x})" if src == "i32" else f"e64_from_u32({x})"
    if src in EMULATED:
        if dst == "f32":
            return f"{src}_to_f32({x})"
        return f"({x}).x" if dst == "u32" else f"bitcast<i32>(({x}).x)"
    if dst in ("u32", "u64") and src == "f32":
        s = "i32" if dst == "u32" else "i64"
        return f"select({dst}({x}), bitcast<{dst}>({s}({x})), {x} < 0.0)"
    # naga's i64(u32) sign-extends and u64(i32) zero-extends: go through the source's 64-bit kind
    if dst == "i64" and src == "u32":
        return f"i64(u64({x}))"
    if dst == "u64" and src == "i32":
        return f"u64(i64({x}))"
    return f"{dst}({x})"


# Kernels that use native 64-bit integers (only compiled on a device with "shader-int64") are
# rendered with `wide64` true, which adds the 64-bit helpers to common.wgsl; other kernels must not
# contain them (they would not compile on a device without the feature). Kernels that use the
# emulated ones are rendered with `emu64` true, which adds shaders/int64e.wgsl.
_WIDE_RE = re.compile(r"\b[iu]64\b|\dl[iu]\b")
# Kernels that use f16 (bindings, values or the f16 helpers of common.wgsl) are rendered with `f16`
# true, which adds those helpers, and start with `enable f16;` (only compiled on a device with
# "shader-f16"). f32_to_f16_bits / f16_bits_to_f32 (packed float16 in u32 words) are not f16 uses.
_F16_RE = re.compile(r"\bf16\b|\w_f16\b|\bf16_of\b")
_EMU_RE = re.compile(r"\b(?:[iu]64e\w*|e64_\w+|wrap_i64e)\b")
_FAST_DIV_RE = re.compile(r"\bdiv_fast\(")  # common.wgsl's f32 division by a dispatch-time size
_COMMENT_RE = re.compile(r"//[^\n]*")


def main_1d(count, index="i"):
    """The entry point of a kernel with one thread per item, as WGSL: `index` is the item (the
    1-D launch is folded into 2-D by dynamic/kernels.grid()), threads past `count` return at once. Templates
    write `{{ main_1d(n) }}` and close the function themselves. `count`: an int, a Sym (a size
    known at dispatch) or a WGSL expression."""
    count = size(count) if isinstance(count, (int, Sym)) else count
    return (
        f"@compute @workgroup_size({WORKGROUP})\n"
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n"
        "        @builtin(local_invocation_index) lid: u32) {\n"
        f"    let {index} = linear_id(wid, nwg, lid);\n"
        f"    if ({index} >= {count}) {{ return; }}"
    )


@dataclass(frozen=True)
class Binding:
    name: str
    elem: str  # WGSL element type of the array: a compute type (or vec4 of one)
    writable: bool = False


# Kernel.source's renderings by key (the key names everything a rendering reads; templates do not
# change while a process runs), bounded
_RENDERED = {}
_RENDERED_LOCK = threading.Lock()
_RENDERED_MAX = 4096


@dataclass
class Kernel:
    """One specialized compute shader. `name` is readable and encodes the specialization; it is
    the wgpu label. `template` renders with `params`; `bindings` are group 0, in order. `dims`:
    the graph's dynamic dimension names when the kernel reads sizes at dispatch (set by
    KernelContext.launch; dynamic/kernels.py), which declares them as immediate data. `sizes`:
    the values of its launch parameters (dynamic/kernels.py SizeParams), declared after the
    dimensions; only their number is part of the key, so kernels differing only in them share
    one pipeline (and `name`, which may spell them, is no part of the key either). `hoist`:
    how many size expressions over the dimensions may become fields of their own (dims.py
    hoisting; set with `dims`); `derived`: those expressions, found by rendering (`with_dims`),
    declared after the dimensions and evaluated by the host per dispatch. `consts`: the f32
    bits of its fused epilogue's scalar constants (lower.KernelContext.epilogue_const),
    declared last; like `sizes`, only their number is part of the key."""

    name: str
    template: str
    params: dict
    bindings: tuple
    dims: tuple = ()
    sizes: tuple = ()
    consts: tuple = ()
    hoist: int = 0
    derived: tuple = ()
    key: tuple = field(init=False)
    _src: str = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.bindings = tuple(self.bindings)
        self.sizes = tuple(self.sizes)
        self.consts = tuple(self.consts)
        # (derived: a function of the rest, so no part of the key; sizes and consts: their
        # number, each launch its own values)
        self.key = (
            self.template,
            _freeze(self.params),
            self.bindings,
            self.dims,
            len(self.sizes),
            len(self.consts),
            self.hoist,
        )

    def immediates(self):
        """Bytes of immediate data the kernel declares (its dimensions', derived sizes', then its
        parameters')."""
        return 4 * (len(self.dims) + len(self.derived) + len(self.sizes) + len(self.consts))

    def with_dims(self, dims, room):
        """This kernel reading the graph's dynamic dimensions `dims` (sorted names), with up to
        room - len(dims) derived sizes: rendered once here to find them (the source is kept for
        its compile)."""
        k = replace(
            self, dims=tuple(dims), hoist=max(0, room - len(dims) - len(self.sizes) - len(self.consts)), derived=()
        )
        k.source()
        return k

    def reads_consts(self):
        """Some parameter reads a fused epilogue's constant from the immediate data (`dims.c`,
        KernelContext.epilogue_const)."""
        return any("dims.c" in v for v in _strings(self.params))

    def reads_dims(self):
        """Some parameter renders a dynamic dimension read at dispatch (`dims.d_` in the WGSL it
        inserts, or a Sym over dimensions a template renders with u()); launch parameters
        (`dims.p<k>`, Kernel.sizes) are not dimensions."""
        return any("dims.d_" in v for v in _strings(self.params))

    def source(self):
        if self._src is not None:
            return self._src
        # a graph launches the same kernel many times (a layer's projections in every layer):
        # rendered once a process (a serving graph of block GEMVs rendered 1330 times: 12 s)
        done = _RENDERED.get(self.key)
        if done is not None:
            src, self.derived = done
            if self.dims:
                self._src = src
            return src
        src = self._render()
        with _RENDERED_LOCK:
            if len(_RENDERED) >= _RENDERED_MAX:
                _RENDERED.clear()
            _RENDERED[self.key] = (src, self.derived)
        return src

    def _render(self):
        decls = "\n".join(
            f"@group(0) @binding({i}) var<storage, {'read_write' if b.writable else 'read'}> {b.name}: array<{b.elem}>;"
            for i, b in enumerate(self.bindings)
        )
        if self.dims or self.sizes or self.consts:
            decls += "\n" + _DECL_MARK  # (the declaration once the derived sizes are known)
        # (kernels reading dynamic dimensions mostly divide by them: common.wgsl's div_fast is in
        # their first rendering, which spares most of them a second one)
        pre = {"fast_div": True} if self.dims else {}
        with hoisting(self.hoist) as h:
            template = template_env().get_template(self.template)
            src = untag(template.render(bindings=decls, **pre, **self.params), h)
            code = _COMMENT_RE.sub("", src)
            flags = {
                "wide64": bool(_WIDE_RE.search(code)),
                "emu64": bool(_EMU_RE.search(code)),
                "f16": bool(_F16_RE.search(code)),
                "fast_div": bool(_FAST_DIV_RE.search(code)),
            }
            if any(v and not pre.get(k) for k, v in flags.items()):
                h.reset()  # (a second rendering: the same fields in the same order)
                flags = {k: v or bool(pre.get(k)) for k, v in flags.items()}
                src = untag(template.render(bindings=decls, **flags, **self.params), h)
        self.derived = h.syms
        if self.dims or self.sizes or self.consts:
            src = src.replace(
                _DECL_MARK, declaration(self.dims, len(self.sizes), len(self.derived), len(self.consts)), 1
            )
        if flags["f16"]:
            src = "enable f16;\n" + src
        if self.dims:  # (its derived sizes laid out the graph's immediates: rendered once)
            self._src = src
        return src

    def __getstate__(self):  # (the graph cache stores sources apart)
        state = dict(self.__dict__)
        state["_src"] = None
        return state


def _strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, Sym):  # rendered by a template's u(): a size read at dispatch
        yield "dims.d_" if v.names() else ""
    elif isinstance(v, dict):
        for x in v.values():
            yield from _strings(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _strings(x)


def size(x):
    """WGSL u32 expression of a size: `12u`, or for a Sym the expression reading it at dispatch."""
    return dims_wgsl(x)


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


_DECL_MARK = "//@mltensor:immediates"

_caches = weakref.WeakKeyDictionary()
_compiling = {}  # (id(device), key) -> Event: compiled by one thread, waited for by the others
_cache_lock = threading.Lock()
_sources = weakref.WeakKeyDictionary()  # device -> {kernel key: WGSL}
_by_source = weakref.WeakKeyDictionary()  # device -> {WGSL: (pipeline, bind group layout)}


def compiled(device, kernel):
    """The kernel's pipeline is already in the device's cache."""
    cache = _caches.get(device)
    return cache is not None and kernel.key in cache


def pipeline(device, kernel, src=None):
    """(pipeline, bind group layout) for a kernel, compiled once per device and key, also when
    several threads build graphs at once (one compiles, the others wait for its result). `src`:
    its WGSL when the caller rendered it already (runtime/compile.py)."""
    cache = _caches.get(device)
    hit = cache.get(kernel.key) if cache is not None else None
    if hit is not None:
        return hit
    token = (id(device), kernel.key)
    while True:
        with _cache_lock:
            cache = _caches.setdefault(device, {})
            hit = cache.get(kernel.key)
            if hit is not None:
                return hit
            ev = _compiling.get(token)
            if ev is None:
                ev = _compiling[token] = threading.Event()
                break
        ev.wait()  # another thread compiles it; if that failed, try ourselves (and raise the same)
    try:
        return _compile(device, kernel, cache, src)
    finally:
        with _cache_lock:
            del _compiling[token]
        ev.set()


def _compile(device, kernel, cache, src=None):
    src = kernel.source() if src is None else src
    # Kernels of different keys may render the same WGSL (sizes that became derived fields of a
    # dynamic kernel's immediates, dims.hoisting): one pipeline for them (its text declares the
    # bindings and immediates, so the layout is the same too)
    with _cache_lock:
        same = _by_source.setdefault(device, {}).get(src)
    if same is not None:
        cache[kernel.key] = same
        with _cache_lock:
            _sources.setdefault(device, {})[kernel.key] = src
        return same
    try:
        module = device.create_shader_module(label=kernel.name, code=src)
        entries = [
            {
                "binding": i,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {
                    "type": wgpu.BufferBindingType.storage if b.writable else wgpu.BufferBindingType.read_only_storage
                },
            }
            for i, b in enumerate(kernel.bindings)
        ]
        bgl = device.create_bind_group_layout(label=kernel.name, entries=entries)
        layout = device.create_pipeline_layout(
            label=kernel.name, bind_group_layouts=[bgl], immediate_size=kernel.immediates()
        )
        pipe = device.create_compute_pipeline(
            label=kernel.name, layout=layout, compute={"module": module, "entry_point": "main"}
        )
    except Exception as e:
        msg = f"[build] kernel {kernel.name} failed to compile: {e}"
        if os.environ.get("MLTENSOR_DUMP_WGSL"):
            numbered = "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(src.splitlines()))
            msg += "\n" + numbered
        else:
            msg += "\n(set MLTENSOR_DUMP_WGSL=1 to see the WGSL source)"
        raise OperationError(msg) from None
    with _cache_lock:  # (two threads that made one source at once: the first one's for both)
        pipe, bgl = _by_source.setdefault(device, {}).setdefault(src, (pipe, bgl))
        _sources.setdefault(device, {})[kernel.key] = src
    cache[kernel.key] = (pipe, bgl)
    return pipe, bgl


def source_of(device, kernel):
    """The WGSL a kernel was compiled from on this device (rendered again if it was not):
    save_graph stores it, rendering ~100 templates would cost it 0.2 s."""
    src = _sources.get(device, {}).get(kernel.key)
    return kernel.source() if src is None else src
