"""Dispatch: validating a dispatch's tensors (a fast path for the same tensors as the graph's last
one, which skips validation and allocates nothing) and recording the graph's launches into the
context's open compute pass: direct wgpu-native calls on raw handles (wgpu-py's wrappers for
other backends), skipping set_pipeline / set_bind_group where the pass already holds them; all
launches after the first go in one call to a compiled C loop where one could be built
(runtime/replay.py), else through cffi one call at a time. MLContext.dispatch is this module's
`dispatch`, bound in the class body (no method call in between).

This is the hot path: nothing here allocates per launch; wgpu-native's functions are module
globals so the loop looks each up once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from wgpu.backends.wgpu_native._ffi import ffi as _ffi
from wgpu.backends.wgpu_native._ffi import lib as _lib

from ..errors import DOMException, InvalidStateError, gpu_errors
from ..runtime.timeline import Task, Timeline
from .graph import MLGraph
from .tensor import MLTensor, exported_error

if TYPE_CHECKING:
    from ..dynamic.plan import DynamicPlan, LaunchData

_set_pipeline = _lib.wgpuComputePassEncoderSetPipeline
_set_bind_group = _lib.wgpuComputePassEncoderSetBindGroup
_dispatch = _lib.wgpuComputePassEncoderDispatchWorkgroups
_set_immediates = _lib.wgpuComputePassEncoderSetImmediates
_NULL = _ffi.NULL


def _valid_fast(ctx: Any, graph: Any, inputs: Any, outputs: Any) -> bool:
    """True when every dispatch rule holds, checked with the fewest operations (the common case).
    Anything unusual goes through _validate, which raises the precise error."""
    if (
        graph.__class__ is not MLGraph
        or graph._context is not ctx
        or graph._destroyed
        or ctx._lost_info is not None
        or inputs.__class__ is not dict
        or outputs.__class__ is not dict
    ):
        return False
    gi, go = graph._inputs, graph._outputs
    if len(inputs) != len(gi) or len(outputs) != len(go):
        return False
    seen = set()
    for name, t in outputs.items():
        d = go.get(name)
        if (
            d is None
            or t.__class__ is not MLTensor
            or t._context is not ctx
            or t._destroyed
            or t._constant
            or t._data_type != d[0]
            or t._shape != d[1]
            or t._exported is not None
        ):
            return False
        seen.add(t)
    if len(seen) != len(outputs):
        return False
    for name, t in inputs.items():
        d = gi.get(name)
        if (
            d is None
            or t.__class__ is not MLTensor
            or t._context is not ctx
            or t._destroyed
            or t._constant
            or t._data_type != d[0]
            or t._shape != d[1]
            or t in seen
            or t._exported is not None
        ):
            return False
    return True


def _validate(ctx: Any, graph: Any, inputs: Any, outputs: Any, shapes: bool = True) -> None:
    """Every dispatch rule, raising the precise error. shapes=False: data types only (a graph with
    dynamic dimensions checks shapes with its DynamicPlan)."""
    where = "dispatch"
    if not isinstance(graph, MLGraph):
        raise TypeError(f"[{where}] graph must be an MLGraph, got {type(graph).__name__}")
    if graph._context is not ctx:
        raise TypeError(f"[{where}] the graph belongs to another MLContext")
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise TypeError(f"[{where}] inputs and outputs must be dicts of name -> MLTensor")
    for kind, given, want in (("input", inputs, graph._inputs), ("output", outputs, graph._outputs)):
        if set(given) != set(want):
            missing = sorted(set(want) - set(given))
            extra = sorted(set(given) - set(want))
            raise TypeError(f"[{where}] {kind} names do not match the graph's: missing {missing}, unexpected {extra}")
        for name, t in given.items():
            if not isinstance(t, MLTensor):
                raise TypeError(f"[{where}] {kind} {name!r} must be an MLTensor, got {type(t).__name__}")
            if t._context is not ctx:
                raise TypeError(f"[{where}] {kind} {name!r} belongs to another MLContext")
            if t.constant:
                raise TypeError(f"[{where}] {kind} {name!r} is a constant tensor")
            if t._exported is not None:
                raise TypeError(exported_error(where, f"{kind} {name!r}"))
            dt, shape = want[name]
            if t.data_type != dt or (shapes and t.shape != shape):
                raise TypeError(
                    f"[{where}] {kind} {name!r} must be {dt} {list(shape)}, got {t.data_type} {list(t.shape)}"
                )
    outs = list(outputs.values())
    if len({id(t) for t in outs}) != len(outs):
        raise TypeError(f"[{where}] the same tensor is bound to two outputs")
    in_ids = {id(t) for t in inputs.values()}
    for name, t in outputs.items():
        if id(t) in in_ids:
            raise TypeError(f"[{where}] output {name!r} is also bound as an input")
    ctx._check(where)
    if graph._destroyed:
        raise InvalidStateError(f"[{where}] the graph is destroyed")
    for kind, given in (("input", inputs), ("output", outputs)):
        for name, t in given.items():
            if t._destroyed:
                raise InvalidStateError(f"[{where}] {kind} {name!r} is destroyed")


def dispatch(ctx: Any, graph: MLGraph, inputs: Mapping[str, MLTensor], outputs: Mapping[str, MLTensor]) -> None:
    """Run `graph` (WebNN ``dispatch``); returns at once. The work is recorded in call order and
    submitted in batches; everything is validated before anything is enqueued.

    Parameters
    ----------
    graph : MLGraph
        A graph of this context.
    inputs : mapping of str to MLTensor
        A tensor for each of the graph's inputs, by name, of exactly its data type and shape (with
        dynamic dimensions: any sizes up to the maxima). One tensor may feed several inputs.
    outputs : mapping of str to MLTensor
        A tensor for each of the graph's outputs, by name, none of them also an input or bound twice.

    Raises
    ------
    TypeError
        A wrong name, data type or shape, a value that is not an MLTensor, a tensor of another
        context, a constant tensor, or one tensor bound to two outputs (or an input and an output).
    InvalidStateError
        A destroyed graph or tensor, or a lost context.
    """
    # (MLContext.dispatch itself, bound as the method: one Python call on the hot path. The whole
    # call holds the device lock (runtime/timeline.py): validated tensors cannot be destroyed by
    # another thread before their work is recorded, and calls record in call order.)
    lock = ctx._lock
    lock.acquire()  # (not `with`: acquire/release cost half as much, measured on the hot path)
    try:
        try:
            # Hot path: the same tensors as this graph's last dispatch (a render loop, a
            # session). They were validated then; tensors are immutable but for destroy(), which
            # clears _last_call (MLGraph._evict), so two dict comparisons (identity of the
            # values, in C) re-validate them.
            if graph.__class__ is MLGraph and graph._context is ctx and graph._last_call is not None:
                last_in, last_out, tensors = graph._last_call
                try:  # a value that is not a tensor may raise from ==: the slow path says why
                    same = (
                        inputs.__class__ is dict
                        and outputs.__class__ is dict
                        and inputs == last_in
                        and outputs == last_out
                    )
                except Exception:
                    same = False
                if same:
                    ctx._check("dispatch")  # lost context, destroyed shared device
                    tl = ctx._timeline
                    if tl.lent or tl.held or tl.mapped:
                        _held_dispatch(tl, graph, inputs, outputs, tensors)
                    else:
                        _record(tl, graph, tensors)
                    return
            if graph.__class__ is MLGraph and graph._dyn is not None:
                _dispatch_dynamic(ctx, graph, inputs, outputs)
                return
            if not _valid_fast(ctx, graph, inputs, outputs):
                _validate(ctx, graph, inputs, outputs)
            ctx._check("dispatch")  # a shared device destroyed since the last call loses the context
            tensors = [inputs[n] for n in graph._in_names] + [outputs[n] for n in graph._out_names]
            graph._last_call = (dict(inputs), dict(outputs), tensors)
            for t in tensors:  # destroying one of them clears _last_call (also before a held task runs)
                if graph._evict not in t._on_destroy:
                    t._on_destroy.append(graph._evict)
            tl = ctx._timeline
            if tl.lent or tl.held or tl.mapped:  # may have to wait behind a lease or a mapping
                _held_dispatch(tl, graph, inputs, outputs, tensors)
            else:  # nothing to wait for: record now, no Task, no closure
                _record(tl, graph, tensors)
        except (TypeError, DOMException):
            raise
        except Exception as e:  # a wgpu error (out of memory making bind groups): not an abort
            with gpu_errors("dispatch"):
                raise e
    finally:
        lock.release()


def _dispatch_dynamic(
    ctx: Any, graph: MLGraph, inputs: Mapping[str, MLTensor], outputs: Mapping[str, MLTensor]
) -> None:
    """A dispatch of a graph with dynamic dimensions: the sizes come from the input tensors'
    shapes, each output tensor must have the resulting shape (a resizable one takes it), and the
    launches are recorded with those sizes (lock held)."""
    last = graph._last_dyn  # same tensors as the last dispatch: validated then (as _last_call)
    if (
        last is not None
        and inputs.__class__ is dict
        and outputs.__class__ is dict
        and inputs == last[0]
        and outputs == last[1]
    ):
        ctx._check("dispatch")
        tensors = last[2]
    else:
        _validate(ctx, graph, inputs, outputs, shapes=False)
        tensors = None
    plan = cast("DynamicPlan", graph._dyn)  # (set: a graph with dynamic dimensions)
    values = plan.bind({n: t._shape for n, t in inputs.items()})
    shapes = plan.output_shapes(values)
    for name, t in outputs.items():
        want = shapes[name]
        if t._shape != want and t._max_shape is None:
            raise TypeError(
                f"[dispatch] output {name!r} must be {t.data_type} {list(want)} for these input "
                f"sizes, got {t.data_type} {list(t.shape)}"
            )
    for name, t in outputs.items():
        t._fit(shapes[name], "dispatch", f"output {name!r}")
    if tensors is None:
        tensors = [inputs[n] for n in graph._in_names] + [outputs[n] for n in graph._out_names]
        for t in tensors:
            if graph._evict not in t._on_destroy:
                t._on_destroy.append(graph._evict)
        graph._last_dyn = (dict(inputs), dict(outputs), tensors)
    data = plan.launch_data(values)
    if (graph._lazy or graph._unwarmed) and not data.made:  # size buckets' variants these sizes run first
        skip = set(data.off or ())
        graph._create([i for i in range(len(graph._launches)) if i not in skip])
        data.made = True  # (the plan, so its LaunchData, is this graph's alone)
    tl = ctx._timeline
    if tl.lent or tl.held or tl.mapped:
        tl.enqueue(
            Task((*inputs.values(), graph), tuple(outputs.values()), lambda: _record_imm(tl, graph, tensors, data))
        )
    else:
        _record_imm(tl, graph, tensors, data)


def _record_imm(tl: Timeline, graph: MLGraph, tensors: Sequence[MLTensor], data: LaunchData) -> None:
    """_record for a graph whose kernels take immediate data (runtime/replay.c mlt_replay_imm):
    `data` (dynamic/plan.LaunchData) holds the workgroup counts and the immediate bytes, each
    launch's at graph._imm_rows, set where graph._imm_at says."""
    bound, raw, buffers, tail, rest, native, (rows, at, imm0, imm_last, imm_c) = graph._replay_skipping(
        tensors, data.off
    )
    g, base = data.run, data.imm_addr  # (the counts of the launches kept)
    if not graph._native:
        p = tl.compute_pass()
        for i, (pipe, bg, _) in enumerate(bound):
            p.set_pipeline(pipe)  # (every launch: so every launch with immediates sets them)
            off, size = rows[i]
            if size:
                p.set_immediates(0, data.imm, off, size)
            p.set_bind_group(0, bg)
            p.dispatch_workgroups(g[3 * i], g[3 * i + 1], g[3 * i + 2])
    else:
        p = tl.native_pass()
        state = tl._pass_state
        # (what the pass holds afterwards: state[2], a token made once for a static graph)
        end = graph._imm_end if data is graph._imm_static else (data, imm_last)
        if raw:
            pipe, bg, x, y, z = raw[0]
            size = imm0
            # (the first launch's: at offset 0, or its derived sizes' block, dims_blocks)
            off0 = rows[0][0]
            ptr = data.ptr(off0)
            if pipe != state[0]:
                _set_pipeline(p, pipe)
                if size:
                    _set_immediates(p, 0, ptr, size)
            elif size:
                # the pass holds this pipeline: with this graph's first values when this dispatch
                # repeats the last one (they stay), else another dispatch's (another graph
                # sharing the pipeline, other sizes): set ours
                held = state[2]
                if not (held is not None and held[0] is data and held[1] == off0):
                    _set_immediates(p, 0, ptr, size)
            if bg != state[1]:
                _set_bind_group(p, 0, bg, 0, _NULL)
            if graph._dyn is not None:
                x, y, z = g[0], g[1], g[2]
            _dispatch(p, x, y, z)
        if native is not None and len(raw) > 1:
            lib, (n, pipes, groups, _), cffi_ = native
            lib.mlt_replay_imm(tl._raw_pass_addr, n, pipes, groups, data.xyz_addr + 12, imm_c, base)
        else:
            for i in range(1, len(raw)):
                pipe, bg = raw[i][:2]
                if pipe is not None:
                    _set_pipeline(p, pipe)
                off, size = at[i]
                if size:
                    _set_immediates(p, 0, _ffi.cast("void *", base + off), size)
                if bg is not None:
                    _set_bind_group(p, 0, bg, 0, _NULL)
                _dispatch(p, g[3 * i], g[3 * i + 1], g[3 * i + 2])
        if raw:
            state[0], state[1] = tail
            if imm_last is not None:
                state[2] = end
    kept = tl._kept
    if not kept or kept[-1] is not bound:
        kept.append(bound)
    tl._touched.update(buffers)
    tl.launched(len(bound))


def _held_dispatch(
    tl: Timeline,
    graph: MLGraph,
    inputs: Mapping[str, MLTensor],
    outputs: Mapping[str, MLTensor],
    tensors: Sequence[MLTensor],
) -> None:
    """A dispatch as an ordinary task. It reads the graph too, so a later graph.destroy() (a task
    writing it) frees the graph's buffers only after this has been recorded."""
    tl.enqueue(Task((*inputs.values(), graph), tuple(outputs.values()), lambda: _record(tl, graph, tensors)))


def _record(tl: Timeline, graph: MLGraph, tensors: Sequence[MLTensor]) -> None:
    bound, raw, buffers, tail, rest, native, _ = graph._replay(tensors)
    imm = graph._imm_at is not None  # launch parameters (a static graph: its fixed LaunchData)
    if imm and (native is None or not graph._native):
        _record_imm(tl, graph, tensors, graph._imm_static)
        return
    if not graph._native:  # another wgpu backend: its Python wrappers
        p = tl.compute_pass()
        for pipe, bg, groups in bound:
            p.set_pipeline(pipe)
            p.set_bind_group(0, bg)
            p.dispatch_workgroups(*groups)
    else:
        # Direct calls into wgpu-native on raw handles: pipelines and bind groups were validated
        # when they were created, and wgpu-py's per-call wrapping costs 2-7 us a call. The pass
        # keeps the last pipeline and bind group across dispatches (tl.native_pass), so
        # back-to-back dispatches of one graph skip re-setting them too.
        p = tl.native_pass()
        state = tl._pass_state
        sp, sb, dp, null = _set_pipeline, _set_bind_group, _dispatch, _NULL
        if raw:  # the first launch always sets both, unless the pass holds exactly them already
            pipe, bg, x, y, z = raw[0]
            if pipe != state[0]:
                sp(p, pipe)
                if imm and graph._imm0:
                    _set_immediates(p, 0, graph._imm_static.imm_ptr, graph._imm0)
            elif imm and graph._imm0 and state[2] is not graph._imm_hold0:
                # (the pass holds the pipeline with other values: _record_imm says when)
                _set_immediates(p, 0, graph._imm_static.imm_ptr, graph._imm0)
            if bg != state[1]:
                sb(p, 0, bg, 0, null)
            dp(p, x, y, z)
        if native is not None:  # the rest in one call: the compiled loop (runtime/replay.c)
            lib, (n, pipes, groups, xyz), _ = native
            if not n:
                pass
            elif imm:  # (launch parameters: graph._imm_at says where each launch sets them)
                data = graph._imm_static
                lib.mlt_replay_imm(tl._raw_pass_addr, n, pipes, groups, data.xyz_addr + 12, graph._imm_c, data.imm_addr)
            else:
                lib.mlt_replay(tl._raw_pass_addr, n, pipes, groups, xyz)
        else:
            for pipe, bg, x, y, z in rest:
                if pipe is not None:
                    sp(p, pipe)
                if bg is not None:
                    sb(p, 0, bg, 0, null)
                dp(p, x, y, z)
        if raw:
            state[0], state[1] = tail
            if imm and graph._imm_last is not None:
                state[2] = graph._imm_end
    kept = tl._kept
    if not kept or kept[-1] is not bound:
        kept.append(bound)  # the objects stay alive until the submit
    tl._touched.update(buffers)
    tl.launched(len(bound))
