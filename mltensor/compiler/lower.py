"""Lowering: steps -> launches (KernelContext, the API the operators' lowerings see) and edge
conversions; the liveness-based memory plan over the launches is compiler/memory.py.

Every value a kernel touches lives in one of: the caller's input/output tensor (`Ext`), a
constant or constant-folded buffer owned by the graph, or a pooled intermediate buffer. Values in
the compute form (see dtypes.compute_type) are contiguous row-major. Intermediates share a few pooled buffers:
a buffer is reused as soon as the last launch reading its previous value has been recorded.
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from .. import dtypes
from ..dynamic.dims import cdiv, high, is_static
from ..dynamic.kernels import (
    SizeParams,
    concrete_groups,
    const_field,
    derived_enabled,
    grid,
    is_dynamic,
    params_enabled,
    room,
    words,
)
from ..ir.registry import OPS
from ..ops.elementwise import epilogue_fn, lower_group
from ..ops.pool import lower_gate
from ..runtime.program import Ext
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, lit, loop_capped, loop_guard
from .steps import epilogue_operands


class Scratch:
    """A temporary buffer private to one step (multi-pass kernels)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.shape = (nbytes // 4,)


@dataclass
class Launch:
    kernel: Kernel
    args: list  # MLOperand | Scratch | Ext, in binding order
    groups: tuple
    prologue: bool


def compute_nbytes(v, f16=False):
    """Bytes of a value in compute form (4 per element; 8 for int64/uint64; 2 for float16 in f16);
    for a value with dynamic dimensions, at their maximum sizes (what its buffer holds)."""
    return dtypes.compute_itemsize(v.data_type, f16) * high(math.prod(v.shape))


# immediate words a fused epilogue's float constants may take (KernelContext.epilogue_const)
CONST_ROOM = 8


class KernelContext:
    """What an operator's lowering sees: value types, launches, aliases, scratch, epilogues.

    int64: int64/uint64 compute natively in i64/u64 (the device has "shader-int64" and the context
    uses it); None means "whenever the device has the feature". f16: float16 computes in f16
    (the device has "shader-f16"), likewise."""

    def __init__(self, device, int64=None, f16=None, dims=()):
        self.device = device
        # Names of the graph's dynamic dimensions, sorted (dynamic/kernels.py): kernels whose
        # parameters read one get them declared as immediate data
        self.dims = tuple(dims)
        self.int64 = ("shader-int64" in device.features) if int64 is None else bool(int64)
        self.f16 = ("shader-f16" in device.features) if f16 is None else bool(f16)
        self.launches = []
        self.loop_capped = loop_capped(device)  # (runtime/wgsl.py LOOP_BUDGET)
        self.alias_of = {}  # id(value) -> value it aliases (reshape and friends)
        self.out_slot = {}  # id(value) -> Ext it is written to directly
        self._prologue = False
        self.step = None
        # Copy-free placement (see place()): id(root value) -> (value it lives inside, byte offset);
        # spans: id(root) -> byte intervals already given to values placed inside it.
        self.placed = {}
        self.spans = {}
        self.fixed = set()  # ids of values bound to the caller's tensors or constants (never placed)
        self.placement = True
        self.align = device.limits.get("min-storage-buffer-offset-alignment", 256)
        # launch parameters a kernel may declare (SizeParams; MLTENSOR_NO_SIZE_PARAMS=1: none)
        # room for dynamic kernels' derived sizes (Kernel.with_dims; MLTENSOR_NO_DERIVED_SIZES=1:
        # only the dimensions) and for launch parameters
        words = room(device)
        self.imm_room = words if derived_enabled() else 0
        # fused epilogues' float constants as immediates too (epilogue_const: layers that differ
        # only in them, PP-OCRv4's learnable scale and bias per block, share a pipeline), with
        # room kept for them out of the launch parameters'
        self.const_room = CONST_ROOM if params_enabled() and words - len(self.dims) >= 16 else 0
        self.param_room = words - self.const_room if params_enabled() else 0
        self._consts = []  # the current epilogue's constants (f32 bits), attached at launch
        self.tune_seconds = 0.0  # kernel autotuning of this build (runtime/autotune.py)
        self.tune_count = 0

    # -- used by lowerings ---------------------------------------------------------------------

    def wtype(self, v):
        """WGSL compute type of a value: f32, f16, i32, u32, i64/u64 or i64e/u64e (dtypes.py)."""
        return dtypes.compute_type(v.data_type, self.int64, self.f16)

    def is_native(self, data_type):
        """`data_type` is stored in its compute form (bound in place, no edge conversion)."""
        return dtypes.is_native(data_type, self.f16)

    def nbytes(self, v):
        """Bytes of a value in compute form."""
        return compute_nbytes(v, self.f16)

    def move_type(self, v):
        """WGSL element type for kernels that move a value's elements without looking at them:
        u32, for 64-bit integers u64 (native) or u64e (two words), for float16 in f16 f16 (its
        loads and stores keep every bit, NaN payloads and subnormals included:
        tests/test_f16.py checks it on the device)."""
        t = self.wtype(v)
        return {"i64": "u64", "u64": "u64", "i64e": "u64e", "u64e": "u64e", "f16": "f16"}.get(t, "u32")

    def size_params(self):
        """A SizeParams for one kernel's static sizes (dynamic/kernels.py): parameters where the
        device passes immediates, else (and in graphs with dynamic dimensions, whose kernels
        read those, and in the build-time prologue, which sets no immediates) every size stays
        a WGSL constant."""
        on = not self.dims and not self._prologue and self.param_room > 0
        return SizeParams(self.param_room if on else 0)

    def launch(self, kernel, args, groups, iters=None):
        """Record a launch. `iters`: the kernel's worst-case loop iterations per invocation (an int
        or a Sym), where its loops grow with a size: past runtime.wgsl.LOOP_BUDGET the build
        fails naming the operator (llvmpipe would silently cut the loops)."""
        assert len(args) == len(kernel.bindings), kernel.name
        if iters is not None:
            node = self.step.node if self.step is not None else None
            self.check_loops(node.op if node is not None else kernel.name, iters)
        kernel = self._immediate_form(kernel)
        if kernel.sizes:  # workgroup counts of launch parameters: this launch's values
            groups = concrete_groups(groups, {}) if is_dynamic(groups) else groups
        if not isinstance(groups, tuple):  # a Fold (dynamic/kernels.py) stays as it is
            groups = groups if hasattr(groups, "n") else tuple(groups)
        self.launches.append(Launch(kernel, list(args), groups, self._prologue))

    def _immediate_form(self, kernel):
        """The kernel as launched: with the current epilogue's constants where it reads them,
        and with the graph's dynamic dimensions (and its derived sizes) where it reads those
        or has constants (a dispatch's immediate data in such a graph is blocks led by the
        dimensions: dynamic/kernels.py dims_blocks; the constants' kernel declares them too,
        unread, so that its block is laid out as every other)."""
        if self._consts and not kernel.consts and kernel.reads_consts():
            kernel = replace(kernel, consts=tuple(self._consts))
        if self.dims and (kernel.reads_dims() or kernel.consts):
            kernel = kernel.with_dims(self.dims, self.imm_room)
        return kernel

    def timing_form(self, launches, values=None):
        """[(Kernel, args, groups, immediate data or None)] not launched but timed by the
        autotuner, in runtime/autotune.time_launches form: each argument as (slot, bytes) (the
        same object one slot: bindings shared as in the graph), the kernels as launch makes them
        (_immediate_form); with dynamic dimensions `values` {name: size} the sizes they are
        timed at (the kernels reading them get their immediate data, and their workgroup counts
        for those sizes)."""

        slots, out = {}, []
        for kern, args, groups in launches:
            kern = self._immediate_form(kern)
            sizes = [
                (slots.setdefault(id(a), len(slots)), a.nbytes if isinstance(a, Scratch) else self.nbytes(self.root(a)))
                for a in args
            ]
            # its immediate data: the dimensions' block (at 1 where only its epilogue's constants
            # made it declare them), else launch parameters then constants
            imm = None
            if kern.dims:
                imm = words(kern, values if values is not None else dict.fromkeys(kern.dims, 1))
            elif kern.sizes or kern.consts:
                imm = np.array(kern.sizes + kern.consts, dtype=np.uint32)
            out.append((kern, sizes, groups if values is None else concrete_groups(groups, values), imm))
        return out

    def check_loops(self, where, iters):
        """runtime.wgsl.loop_guard where the device may cut loops (loop_capped)."""
        if self.loop_capped:
            loop_guard(where, iters)

    def out(self, node, i=0):
        """The value a node's kernel writes for output i: with a fused epilogue, the
        last epilogue node's output; with a normalization after it (Step.post_norm), the sum
        it normalizes: the normalization's output (normalized in place) unless the sum is a
        value of its own (Step.outputs[1])."""
        step = self.step
        if step is not None and step.post_norm is not None and node is step.node:
            return step.outputs[-1]
        if step is not None and step.epilogue and node is step.node:
            return step.outputs[0]
        return node.outputs[i]

    def alias(self, out, src):
        """`out` has the same elements as `src` in the same order (reshape): share its storage,
        unless `out` is written straight into a caller's tensor, which needs a copy."""
        if id(out) in self.out_slot:
            self.copy(src, out)
        else:
            self.alias_of[id(out)] = self.root(src)

    def root(self, v):
        return self.alias_of.get(id(v), v)

    def is_caller_tensor(self, v):
        """v is written straight into a caller's output tensor (an Ext slot), not to the pool."""
        return isinstance(self.out_slot.get(id(v)), Ext)

    def placed_root(self, v):
        """(value owning v's storage, byte offset of v inside it), through aliases and placements."""
        r, off = self.root(v), 0
        while id(r) in self.placed:
            p, o = self.placed[id(r)]
            r, off = self.root(p), off + o
        return r, off

    def place(self, x, out, byte_off, slabs=()):
        """Make `x` live at bytes [byte_off, byte_off + nbytes(x)) of `out`'s storage, so its
        producer writes straight into that slab (concat then launches nothing). True if done.

        Placement moves x's whole storage tree (x may already sit inside an earlier concat, as in
        densenet, where every concat extends the previous one) into out's. Refused when: the
        offset is not a multiple of minStorageBufferOffsetAlignment (views are bound with an
        offset), the size is not a multiple of 16 bytes (vec4 kernels must not spill into the next
        slab), x is a caller's tensor, either side is a caller's input, a constant or a build-time
        value (out may be a graph output: its slabs are then views of the caller's tensor), the slab
        overlaps another value's, or some launch would bind one buffer both for reading and for
        writing (WebGPU forbids that in one dispatch)."""
        if not self.placement or self._prologue or not (is_static(x.shape) and is_static(out.shape)):
            return False  # a slab at an offset known only at dispatch cannot be bound
        n = self.nbytes(x)
        xr, xo = self.placed_root(x)
        orr, oo = self.placed_root(out)
        target = oo + byte_off
        if xr is orr:
            return xo == target
        if n == 0 or n % 16 or target % self.align or xo % self.align:
            return False
        for r in (xr, orr):
            # the output may be written straight into a caller's output tensor (bound with an
            # offset at dispatch); x itself must be an ordinary intermediate
            out_ok = r is orr and id(r) in self.out_slot
            if (
                isinstance(r, Scratch)
                or (id(r) in self.fixed and not out_ok)
                or (id(r) in self.out_slot and not out_ok)
                or getattr(r, "_kind", "op") != "op"
            ):
                return False
        base = target - xo
        size = self.nbytes(xr)
        if base < 0 or base + size > self.nbytes(orr):
            return False
        if size != n and not self._tree_matches(xr, base, oo, slabs):  # base: root bytes
            return False
        spans = self.spans.setdefault(id(orr), [])
        if any(s < base + size and base < e for s, e in spans):
            return False
        if any(
            l.prologue and any(self.placed_root(a)[0] is xr for a in l.args if not isinstance(a, (Ext, Scratch, tuple)))
            for l in self.launches
        ):
            return False
        self.placed[id(xr)] = (orr, base)
        spans.append((base, base + size))
        if self._shared_binding():
            del self.placed[id(xr)]
            spans.pop()
            return False
        return True

    def _tree_matches(self, xr, base, oo, slabs):
        """x's storage tree (xr) is larger than x: it may move into out's only if the slabs of
        `out` it would cover are exactly values already inside it at the same places (densenet:
        the previous concat is a prefix of the next), else a fallback copy into out could
        overwrite parts of xr that are still read. slabs: (value, byte offset in out) of all
        the concat's inputs."""
        lo, hi, covered = base, base + self.nbytes(xr), 0  # in the root's bytes, as oo + off
        for v, off in slabs:
            s, e = oo + off, oo + off + self.nbytes(v)
            if e <= lo or s >= hi:
                continue
            if s < lo or e > hi:
                return False
            vr, vo = self.placed_root(v)
            if vr is not xr or vo != s - lo:
                return False
            covered += e - s
        return covered == hi - lo

    def view(self, out, src, byte_off):
        """`out` is bytes [byte_off, byte_off + nbytes(out)) of `src` (a slice or split part that
        is one contiguous range): read it in place, bound with an offset. True if done."""
        if (
            not self.placement
            or self._prologue
            or id(out) in self.out_slot
            or not (is_static(out.shape) and is_static(src.shape))
        ):
            return False
        sr, so = self.placed_root(src)
        if (
            isinstance(sr, Scratch)
            or id(sr) in self.fixed
            or id(sr) in self.out_slot
            or getattr(sr, "_kind", "op") != "op"
        ):
            return False
        n, off = self.nbytes(out), so + byte_off
        if n == 0 or n % 16 or off % self.align:
            return False
        self.placed[id(out)] = (sr, off)
        return True

    def _shared_binding(self):
        """Some launch binds one storage root twice with a writable binding among them."""
        for l in self.launches:
            if l.prologue:
                continue
            seen = {}
            for a, b in zip(l.args, l.kernel.bindings):
                if isinstance(a, (Ext, Scratch, tuple)):
                    continue
                k = id(self.placed_root(a)[0])
                if k in seen and (seen[k] or b.writable):
                    return True
                seen[k] = seen.get(k, False) or b.writable
        return False

    def words(self, v):
        """32-bit words of a value in compute form, at its actual (dispatch-time) size."""
        size = dtypes.compute_itemsize(v.data_type, self.f16)
        n = math.prod(v.shape)
        return n * (size // 4) if size % 4 == 0 else cdiv(size * n, 4)

    def scratch(self, nbytes):
        return Scratch(dtypes.padded(nbytes))

    def epilogue(self, bindings, args):
        """WGSL `fn act(x: T, i: u32) -> T` for the step's fused epilogue (identity if none): the
        value about to be stored at flat index `i` of `kc.out(node)` (row-major, the output's own
        layout) goes through the fused activations and binary nodes in order. The other operands
        of binary nodes are read at `i` (broadcast through baked strides) from extra read-only
        bindings `e0`, `e1`, ...: they are inserted into the lists `bindings` and `args` before
        their last entry (the output). Every store of the kernel must go through act()."""

        step = self.step
        extra = epilogue_operands(step)
        for k, v in enumerate(extra):
            bindings.insert(len(bindings) - 1, Binding(f"e{k}", self.wtype(v)))
            pad = step.views.get(id(v))  # a constant pad read through: bind its input
            args.insert(len(args) - 1, v if pad is None else pad.inputs[0])
        self._consts = []
        return epilogue_fn(self, step, extra, self.wtype(step.outputs[0]))

    def epilogue_const(self, value, wtype):
        """WGSL of a float scalar constant of the current epilogue: a field of the kernel's
        immediate data (`dims.c<k>`, its f32 bits; Kernel.consts, attached by launch) where there
        is room, else a literal (f16 values, build-time prologues, which set no immediates)."""
        if wtype != "f32" or self._prologue or not self.const_room:
            return lit(value, wtype)
        bits = int(np.float32(value).view(np.uint32))
        if bits not in self._consts:
            if len(self._consts) >= self.const_room:
                return lit(value, wtype)
            self._consts.append(bits)
        return f"bitcast<f32>(dims.{const_field(self._consts.index(bits))})"

    def copy(self, src, dst):
        # 32-bit words, whatever the element type; an odd number of f16 elements rounds up into
        # the buffer's padding, never into a neighbour (values placed inside another value's
        # storage are whole multiples of 16 bytes: see place())
        n = self.words(src)
        k = Kernel(
            f"copy_n{n}",
            "edge.wgsl",
            {"mode": "copy", "n": n},
            (Binding("src", "u32"), Binding("dst", "u32", True)),
        )
        self.launch(k, [src, dst], grid(cdiv(n, WORKGROUP)))

    # -- edges ---------------------------------------------------------------------------------

    def unpack(self, ext, value):
        """Caller's tensor in a packed storage type (float16, int8, uint8) -> compute-form value."""
        n = math.prod(ext.shape)
        dt = ext.data_type
        k = Kernel(
            f"unpack_{dt}_n{n}",
            "edge.wgsl",
            {"mode": "unpack", "dtype": dt, "n": n},
            (Binding("src", "u32"), Binding("dst", self.wtype(ext), True)),
        )
        self.launch(k, [ext, value], grid(cdiv(n, WORKGROUP)))

    def pack(self, value, ext):
        """Compute-form value -> caller's tensor in its storage type (one thread per word)."""
        n = math.prod(ext.shape)
        dt = ext.data_type
        words = cdiv(n, {"float16": 2, "int8": 4, "uint8": 4}[dt])
        k = Kernel(
            f"pack_{dt}_n{n}",
            "edge.wgsl",
            {"mode": "pack", "dtype": dt, "n": n, "words": words},
            (Binding("src", self.wtype(ext)), Binding("dst", "u32", True)),
        )
        self.launch(k, [value, ext], grid(cdiv(words, WORKGROUP)))


def lower_steps(kc, steps):
    """Record the launches of all steps into kc; returns nothing (kc.launches is the result)."""

    for step in steps:
        kc.step = step
        kc._prologue = step.const
        if step.chain:
            lower_gate(kc, step)
        elif OPS[step.nodes[-1].op].expr is not None and not step.epilogue:
            lower_group(kc, step.nodes, step.outputs[0])
        else:
            node = step.node
            op = OPS[node.op]
            if op.lower is None:
                raise NotImplementedError(f"operator {node.op} has no kernel yet")
            op.lower(kc, node)
    kc.step = None
    kc._prologue = False
