"""build -> Program: lower the builder's live nodes into launches, plan their memory, upload the
constants, make the pipelines and bind groups and run the build-time prologue (constant
folding); front/graph.py MLGraph(ctx, program) dispatches the result (runtime/program.py).

Copy-free placement (KernelContext.place / view): concat inputs are written straight into their
slab of the concat's storage and contiguous slice/split parts are read in place, bound with an
offset. MLTENSOR_NO_PLACEMENT=1 (or MLTENSOR_NO_FUSION=1) turns it off for comparison.
"""

import wgpu

from .. import dtypes
from ..errors import InvalidStateError
from ..runtime.compile import compile_kernels, warm
from ..runtime.constants import UPLOAD_BATCH, digest
from ..runtime.program import Ext, Program, instantiate
from ..runtime.timeline import Task
from ..runtime.wgsl import cpu_device
from ..dynamic.kernels import check_device, may_be_zero
from ..ir.graph import live_nodes
from ..switches import switch
from .lower import KernelContext, Scratch, lower_steps
from .memory import plan_memory
from .plan import plan_steps
from .steps import binding_cap


def compile_graph(builder, outputs, placement=None):
    if placement is None:
        placement = not switch("MLTENSOR_NO_FUSION") and not switch("MLTENSOR_NO_PLACEMENT")
    ctx = builder._context
    device = ctx.device
    nodes = live_nodes(builder, outputs)
    used_inputs = {id(x) for n in nodes for x in n.inputs if x is not None and x._kind == "input"}
    inputs = builder._inputs
    # MLTENSOR_NO_FUSION=1: one kernel per node (benchmarks count launches before fusion with it).
    report = []
    steps = plan_steps(
        nodes,
        outputs,
        fuse=not switch("MLTENSOR_NO_FUSION"),
        max_inputs=binding_cap(device) - 1,
        cpu=cpu_device(device),
        report=report,
    )
    fusion_notes = [(kind, n.op, n.label, why) for kind, n, why in report]

    dims = tuple(sorted(builder._dims))  # dynamic dimensions (dynamic/): sizes read at dispatch
    if dims:
        check_device(device, dims)
    kc = KernelContext(device, int64=ctx._int64, f16=ctx._f16, dims=dims)
    kc.placement = placement
    loc = {}  # id(value) -> Ext (caller's tensor) | ("buf", GPUBuffer); absent: pooled intermediate

    # Edges in: native inputs are read in place, others are unpacked into an intermediate.
    for name, x in inputs.items():
        ext = Ext("in", name, x.data_type, x.shape)
        if kc.is_native(x.data_type):
            loc[id(x)] = ext
        elif id(x) in used_inputs:
            kc.unpack(ext, x)

    # Edges out: a native output is written straight into the caller's tensor by its producer.
    pending_out = []
    for name, v in outputs.items():
        ext = Ext("out", name, v.data_type, v.shape)
        if kc.is_native(v.data_type) and id(v) not in kc.out_slot:
            kc.out_slot[id(v)] = ext
            loc[id(v)] = ext
        else:
            pending_out.append((v, ext))

    # Constants: uploaded once in compute form, or bound in place (native constant tensors).
    keep = []  # objects the graph must keep alive (constant tensors)
    persist = []
    shared = []  # constant buffers from the context's store (one reference each)
    read = 0
    const_ops = {}
    for n in nodes:
        for x in n.inputs:
            if x is not None and x._kind == "constant":
                const_ops[id(x)] = x
    for s in steps:  # constants the passes made (a convolution prologue's folded normalization,
        # fusion/linear.py's transposed weights, fusion/sdpa.py's scales): absent from `nodes`
        if s.prologue is not None and s.prologue.const is not None:
            const_ops[id(s.prologue.const)] = s.prologue.const
        for n in list(s.nodes) + list(s.epilogue) + list(s.views.values()) + [s.post_norm]:
            for x in getattr(n, "inputs", None) or ():
                if x is not None and x._kind == "constant":
                    const_ops[id(x)] = x
    for x in const_ops.values():
        # a constant tensor bound in place (create_constant_tensor): known by its buffer, since
        # compiler/ does not import front/ (a host constant is a numpy array, or None once
        # forget_host_constants ran)
        if hasattr(x._value, "_buffer"):
            keep.append(x._value)
            if kc.is_native(x.data_type):
                loc[id(x)] = ("buf", x._value._buffer)
            else:
                kc._prologue = True
                kc.unpack(Ext("const", "", x.data_type, x.shape), x)
                kc.launches[-1].args[0] = ("buf", x._value._buffer)
                kc._prologue = False
        else:  # held once per context whatever builds bind it (runtime/constants.py)
            if x._value is None:  # (forget_host_constants ran: internal callers only)
                raise InvalidStateError("[build] the builder has already built a graph")
            data = dtypes.to_compute_numpy(x.data_type, x._value, kc.f16)
            key = digest(data)  # (hashed without the lock)
            with ctx._lock:
                ctx._check("build")
                buf = ctx._constants.acquire(key, data)
            shared.append(buf)
            loc[id(x)] = ("buf", buf)
            read += data.nbytes
            if builder._release_host is not None and read >= UPLOAD_BATCH:
                builder._release_host()  # weights mapped from the model file: uploaded, drop the pages
                read = 0
    if builder._release_host is not None:
        builder._release_host()

    kc.fixed = set(loc)
    lower_steps(kc, steps)
    for v, ext in pending_out:
        if kc.is_native(v.data_type):
            kc.copy(v, ext)
        else:
            kc.pack(v, ext)

    # Values computed once at build (constant-folded) get their own buffers; the rest are pooled.
    prologue_values = {}
    for l in kc.launches:
        if l.prologue:
            for a, b in zip(l.args, l.kernel.bindings):
                if b.writable and not isinstance(a, (Ext, Scratch, tuple)):
                    prologue_values[id(kc.root(a))] = kc.root(a)

    def resolve(a):
        if isinstance(a, (Ext, tuple, Scratch)):
            return a
        r = kc.placed_root(a)[0]
        return loc.get(id(r), r)

    def view(a):
        """(byte offset, size) of a placed value's binding, None for a whole buffer."""
        if isinstance(a, (Ext, tuple, Scratch)) or (id(kc.root(a)) not in kc.placed):
            return None
        return kc.placed_root(a)[1], dtypes.padded(kc.nbytes(a))

    def is_temp(r):
        return not isinstance(r, (Ext, tuple)) and id(r) not in loc and id(r) not in prologue_values

    launches = [(l, [resolve(a) for a in l.args]) for l in kc.launches]
    views = [[view(a) for a in l.args] for l in kc.launches]
    assign, sizes = plan_memory([args for _, args in launches], is_temp, kc.nbytes)
    pool = [
        device.create_buffer(label=f"mltensor-pool{i}", size=s, usage=wgpu.BufferUsage.STORAGE)
        for i, s in enumerate(sizes)
    ]
    for k, v in prologue_values.items():
        buf = device.create_buffer(
            label="mltensor-folded",
            size=dtypes.padded(kc.nbytes(v)),
            usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC,  # (save_graph reads it back)
        )
        persist.append(buf)
        loc[k] = ("buf", buf)

    def buffer_of(a):
        if isinstance(a, Ext):
            return a
        if isinstance(a, tuple):
            return a[1]
        if id(a) in loc:
            return buffer_of(loc[id(a)])
        return pool[assign[id(a)]]

    # The graph keeps only buffers its dispatches read: constants consumed by constant folding
    # alone and folded intermediates are dropped once the build-time prologue has run (its bind
    # groups hold them until then), so e.g. int8 weights behind a folded dequantize_linear do not
    # stay resident next to their float32 result.
    at_dispatch = {id(buffer_of(a)) for l, args in launches if not l.prologue for a in args}
    persist = [b for b in persist if id(b) in at_dispatch]
    unused = [b for b in shared if id(b) not in at_dispatch]  # given back after the prologue
    shared = [b for b in shared if id(b) in at_dispatch]
    memory = {
        "constants": sum(b.size for b in shared),
        "constant_tensors": sum(t._buffer.size for t in keep),
        "folded_constants": sum(b.size for b in persist),
        "intermediates": sum(b.size for b in pool),
    }
    # A launch whose workgroup count is 0 at some sizes (a size bucket's variant of a GEMM or
    # convolution, gated off outside it) gets its pipeline and bind groups at the first dispatch
    # that runs it (MLGraph._create): a start pays only for the buckets its sizes use.
    lazy = [bool(dims) and not l.prologue and may_be_zero(l.groups) for l, _ in launches]
    # in parallel (runtime/compile.py); with dynamic dimensions, Mesa's warm-up of the kernels a
    # dispatch runs waits for the first dispatch, which warms them with its size buckets' at once
    compile_kernels(ctx, [l.kernel for (l, _), z in zip(launches, lazy) if not z], warm=not dims)
    if dims:
        warm(ctx, [l.kernel for l, _ in launches if l.prologue])  # (they run at build)
    bound = []
    for (l, args), vs in zip(launches, views):
        bufs = [buffer_of(a) for a in args]
        if placement and _shares_buffer(bufs, l.kernel.bindings):
            # a case place() did not foresee (e.g. a fallback copy inside one concat's storage):
            # build again without placement rather than bind one buffer for reading and writing
            # (nothing has run on this build's buffers: they go after the next submit, as a
            # destroyed graph's)
            with ctx._lock:
                mine = persist + pool
                ctx._timeline.after_submit(lambda: [b.destroy() for b in mine])
                ctx._constants.release(shared)
                ctx._constants.release(unused)
            return compile_graph(builder, outputs, placement=False)
        bound.append(
            (l.kernel, [b if v is None else (b, v) for b, v in zip(bufs, vs)], l.groups)
        )  # views: (buffer, (offset, size))
    entries = instantiate(device, bound, {i for i, z in enumerate(lazy) if z})
    prologue = [e for (l, _), e in zip(launches, entries) if l.prologue]
    run = [l for l, _ in launches if not l.prologue]
    in_desc = {n: (x.data_type, x.shape) for n, x in builder._inputs.items()}
    out_desc = {n: (v.data_type, v.shape) for n, v in outputs.items()}
    dyn_args = None
    if dims:
        dyn_args = (
            dims,
            dict(builder._dims),
            {n: s for n, (_, s) in in_desc.items()},
            {n: s for n, (_, s) in out_desc.items()},
            list(builder._constraints),
            [l.groups for l in run],
            [bool(l.kernel.dims) for l in run],
        )
    program = Program(
        in_desc,
        out_desc,
        [l.kernel for l in run],
        [e for (l, _), e in zip(launches, entries) if not l.prologue],
        pool,
        folded=persist,
        shared=shared,
        keep=keep,
        unwarmed=[l.kernel for (l, _), z in zip(launches, lazy) if not z and not l.prologue] if dims else (),
        kernel_names=[l.kernel.name for l in run],
        fusion_notes=fusion_notes,
        memory=memory,
        autotune={"seconds": kc.tune_seconds, "signatures_tuned": kc.tune_count},
        dyn_args=dyn_args,
    )
    if prologue:
        tl = ctx._timeline

        def run_prologue():
            p = tl.compute_pass()
            for pipe, _, _, groups, bg in prologue:
                p.set_pipeline(pipe)
                p.set_bind_group(0, bg)
                p.dispatch_workgroups(*groups)
            tl.launched(len(prologue))
            ctx._constants.release(unused)  # (freed after the submit holding the prologue)

        with ctx._lock:
            tl.enqueue(Task(tuple(keep), (), run_prologue))
    elif unused:
        with ctx._lock:
            ctx._constants.release(unused)
    return program


def _shares_buffer(bufs, bindings):
    seen = {}
    for b, bd in zip(bufs, bindings):
        if isinstance(b, Ext):
            continue
        if id(b) in seen and (seen[id(b)] or bd.writable):
            return True
        seen[id(b)] = seen.get(id(b), False) or bd.writable
    return False
