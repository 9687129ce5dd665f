"""WGSL templates from shaders/, binding declarations, and the per-device pipeline cache.

Templates use jinja2 with WGSL-friendly delimiters (`{$ ... $}` blocks, `{{ ... }}` values) and
StrictUndefined, as pygfx does. Binding declarations are generated here, never written per kernel.
Pipelines are cached on what defines them (template, parameters, bindings), not on rendered text.
Set MLTENSOR_DUMP_WGSL=1 to get the numbered source of a kernel that fails to compile.
"""

import os
import re
import struct
import weakref
from dataclasses import dataclass, field
from importlib import resources

import jinja2
import wgpu

from ..errors import OperationError

WORKGROUP = 256  # threads per 1-D workgroup: software adapters and GPUs both like 256
MAX_GROUPS = 65535


def _shader_dir():
    # Installed: shaders/ is shipped as the package mltensor.shaders. Source tree: ../../shaders.
    try:
        d = resources.files("mltensor.shaders")
        if d.joinpath("common.wgsl").is_file():
            return str(d)
    except (ModuleNotFoundError, TypeError):
        pass
    return os.path.join(os.path.dirname(__file__), "..", "..", "shaders")


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_shader_dir()),
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
)


def f32_lit(x):
    """An exact WGSL f32 literal for any Python float, inf and NaN included."""
    (bits,) = struct.unpack("<I", struct.pack("<f", float(x)))
    return f"bitcast<f32>({bits}u)"


def lit(x, wtype):
    """A WGSL literal of compute type `wtype` ("f32", "i32", "u32", "i64", "u64"). Integers
    saturate into the type's range (negative values give 0 for unsigned types)."""
    if wtype == "f32":
        return f32_lit(x)
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
    v = int(x) & 0xFFFFFFFF if int(x) >= 0 else 0
    return f"{v}u"


# Kernels that use 64-bit integers (only compiled on a device with "shader-int64") are rendered
# with `wide64` true, which adds the 64-bit helpers to common.wgsl; other kernels must not contain
# them (they would not compile on a device without the feature).
_WIDE_RE = re.compile(r"\b[iu]64\b|\dl[iu]\b")
_COMMENT_RE = re.compile(r"//[^\n]*")

def main_1d(count, index="i"):
    """The entry point of a kernel with one thread per item, as WGSL: `index` is the item (the
    1-D launch is folded into 2-D by grid()), threads past `count` return at once. Templates
    write `{{ main_1d(n) }}` and close the function themselves."""
    count = f"{count}u" if isinstance(count, int) else count
    return (
        f"@compute @workgroup_size({WORKGROUP})\n"
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n"
        "        @builtin(local_invocation_index) lid: u32) {\n"
        f"    let {index} = linear_id(wid, nwg, lid);\n"
        f"    if ({index} >= {count}) {{ return; }}"
    )


_env.globals.update(f32_lit=f32_lit, lit=lit, main_1d=main_1d, WORKGROUP=WORKGROUP, wide64=False)


@dataclass(frozen=True)
class Binding:
    name: str
    elem: str  # WGSL element type of the array: f32, i32, u32 (i64, u64 with native 64-bit ints)
    writable: bool = False


@dataclass
class Kernel:
    """One specialized compute shader. `name` is readable and encodes the specialization; it is
    the wgpu label. `template` renders with `params`; `bindings` are group 0, in order."""

    name: str
    template: str
    params: dict
    bindings: tuple
    key: tuple = field(init=False)

    def __post_init__(self):
        self.bindings = tuple(self.bindings)
        self.key = (self.template, _freeze(self.params), self.bindings)

    def source(self):
        decls = "\n".join(
            f"@group(0) @binding({i}) var<storage, {'read_write' if b.writable else 'read'}> "
            f"{b.name}: array<{b.elem}>;"
            for i, b in enumerate(self.bindings)
        )
        template = _env.get_template(self.template)
        src = template.render(bindings=decls, **self.params)
        if _WIDE_RE.search(_COMMENT_RE.sub("", src)):
            src = template.render(bindings=decls, wide64=True, **self.params)
        return src


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def grid(n_groups):
    """Workgroup counts for n_groups 1-D groups, folded into 2-D past the per-dimension limit.
    Kernels rebuild the linear group index with `wid.y * nwg.x + wid.x`."""
    n_groups = max(1, int(n_groups))
    if n_groups <= MAX_GROUPS:
        return (n_groups, 1, 1)
    y = -(-n_groups // MAX_GROUPS)
    x = -(-n_groups // y)
    return (x, y, 1)


_caches = weakref.WeakKeyDictionary()


def pipeline(device, kernel):
    """(pipeline, bind group layout) for a kernel, compiled once per device and key."""
    cache = _caches.setdefault(device, {})
    hit = cache.get(kernel.key)
    if hit is not None:
        return hit
    src = kernel.source()
    try:
        module = device.create_shader_module(label=kernel.name, code=src)
        entries = [
            {
                "binding": i,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {
                    "type": wgpu.BufferBindingType.storage
                    if b.writable
                    else wgpu.BufferBindingType.read_only_storage
                },
            }
            for i, b in enumerate(kernel.bindings)
        ]
        bgl = device.create_bind_group_layout(label=kernel.name, entries=entries)
        layout = device.create_pipeline_layout(label=kernel.name, bind_group_layouts=[bgl])
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
    cache[kernel.key] = (pipe, bgl)
    return pipe, bgl
