"""MLGraph: a flat list of launches with pipelines and bind groups made up front, but
for the size buckets' variants of a graph with dynamic dimensions (launches whose workgroup count
is 0 at some sizes): made at the first dispatch whose sizes run them (MLGraph._create), skipped by
the replay where their count is 0.

Only launches that touch the caller's tensors need per-dispatch bind groups; those are cached per
set of tensors (dropped when one of them is destroyed), with the replay lists a dispatch records
(front/dispatch.py records them into the context's compute pass).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..dynamic.dims import Sym
from ..runtime import replay
from ..runtime.compile import compile_kernels, warm
from ..runtime.program import Ext, Program, ext_of, resource_of
from ..runtime.timeline import Task, handle_address
from ..runtime.wgsl import pipeline
from ..dynamic.kernels import dims_blocks, immediates_layout
from ..dynamic.plan import LaunchData

_BG_CACHE_MAX = 64


class MLGraph:
    """A compiled graph (WebNN `MLGraph`), returned by `MLGraphBuilder.build_sync` and run with
    `MLContext.dispatch(graph, inputs, outputs)` as many times as wanted. Python extensions:
    `input_descriptors` / `output_descriptors`, `kernel_names`, `memory`, `autotune`,
    `dynamic_dimensions`, `compute_shapes()`, `kernels_run()`, `fusion_report()`."""

    # IDL: interface MLGraph { undefined destroy(); }

    def __init__(self, ctx: Any, program: Program) -> None:  # ctx: its MLContext (no import circle)
        """program: the build's result (runtime/program.py Program: compiler/build.py
        compile_graph, or graphcache/recipe.py rebuild); the graph dispatches it."""
        self._context = ctx
        self._program = program  # (graphcache/recipe.py capture saves it)
        self._inputs = program.inputs  # name -> (data type, shape) (dynamic dimensions as Syms)
        self._outputs = program.outputs
        self._keep = program.keep  # constant tensors bound in place
        self._buffers = program.folded + program.pool  # its own buffers (destroy frees them)
        self._shared = program.shared  # constant buffers of the context's store (runtime/constants.py)
        self._kernels = program.kernels  # the Kernel of each launch, in order
        self._launches = program.launches  # [pipeline, bind group layout, buffers, groups, bind group | None]
        # launches whose pipeline is not created yet (pipeline None: _create)
        self._lazy = sum(e[0] is None for e in self._launches)
        self._unwarmed = program.unwarmed  # kernels for Mesa's warm-up at the first dispatch (_create)
        self._sources: Any = program.sources  # each launch's WGSL when known (a loaded graph: its lazy launches')
        self._last_off: Any = None  # the launches the last replay list skips (LaunchData.off)
        self._destroyed = False
        self._bg_cache: dict[Any, tuple[list[weakref.ref[Any]], tuple[Any, ...]]] = {}
        self._last_tensors: list[Any] = []
        self._last: Any = None
        self._last_call: Any = None  # (inputs, outputs, tensors) of the last dispatch, validated
        self._dyn = program.dyn  # a DynamicPlan when some dimension is known only at dispatch
        self._imm_at: Any = None  # (_finish)
        self._imm_static: Any = None
        self._imm_end: Any = None
        self._last_dyn: Any = None  # _last_call of a graph with a DynamicPlan
        # Graph replay calls wgpu-native directly where that is the backend wgpu-py runs on.
        self._native = type(ctx.device).__module__.startswith("wgpu.backends.wgpu_native")
        with ctx._lock:
            ctx._graphs.add(self)
        self._finish()

    def _finish(self) -> None:
        self._dynamic = [i for i, e in enumerate(self._launches) if e[4] is None]
        # Immediate data (dynamic/kernels.py immediates_layout): dynamic dimensions' sizes, per
        # dispatch; launch parameters (shared pipelines), fixed: one LaunchData for every dispatch
        self._imm_blocks, lists = dims_blocks(self._kernels)
        if self._dyn is not None:
            self._dyn.set_blocks(lists)
        self._imm_rows, self._imm_at, words = immediates_layout(self._kernels, self._imm_blocks)
        self._imm0 = self._imm_at[0][1] if self._imm_at else 0  # (offset 0: immediates_layout)
        # offset of the immediates in effect after a replay (the last launch that sets some)
        self._imm_last = next((off for off, size in reversed(self._imm_at) if size), None)
        self._imm_c: Any = None  # _imm_at[1:] as a C array (the compiled loop's)
        if self._dyn is None and not any(size for _, size in self._imm_rows):
            self._imm_at = None  # the plain replay (runtime/replay.c mlt_replay)
        elif self._dyn is None:
            self._imm_static = LaunchData(words, [g for e in self._launches for g in e[3]])
            self._imm_end = (self._imm_static, self._imm_last)
            # what state[2] is when the pass holds this graph's first values (a repeated
            # dispatch: the last launch's are its first's), else a token it never holds
            self._imm_hold0 = self._imm_end if self._imm_last == 0 else object()
        self._in_names = tuple(sorted(self._inputs))
        self._out_names = tuple(sorted(self._outputs))

    @property
    def input_descriptors(self) -> dict[str, tuple[str, tuple[int | Sym, ...]]]:
        """name -> (data type, shape); dynamic dimensions are Syms (.name, .max_size)."""
        return dict(self._inputs)

    @property
    def dynamic_dimensions(self) -> dict[str, int]:
        """Python extension: {name: max_size} of the graph's dynamic dimensions ({} if none)."""
        return dict(self._dyn.maxes) if self._dyn is not None else {}

    # IDL (proposal, webnn PR #945): record<USVString, sequence<unsigned long>> computeShapes(record<USVString, sequence<unsigned long>> inputShapes);
    def compute_shapes(self, input_shapes: dict[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """The shapes a dispatch with inputs of these shapes gives its outputs (WebNN proposal
        ``computeShapes``, webnn PR #945): for a graph with dynamic dimensions, the sizes its
        outputs take at those input sizes; for one without, its fixed output shapes.

        Parameters
        ----------
        input_shapes : dict of str to sequence of int
            One shape per graph input, by input name (every input, no other name).

        Returns
        -------
        dict of str to tuple of int
            ``{output name: shape}``.

        Raises
        ------
        TypeError
            Not a dict naming exactly the graph's inputs, or a shape the graph does not take (a
            fixed dimension differs, a dynamic one is above its ``max_size``, or two dimensions of
            one name disagree).
        """
        where = "compute_shapes"
        if not isinstance(input_shapes, dict) or set(input_shapes) != set(self._inputs):
            given = sorted(input_shapes) if isinstance(input_shapes, dict) else input_shapes
            raise TypeError(f"[{where}] expected shapes for the inputs {sorted(self._inputs)}, got {given}")
        shapes = {n: tuple(int(d) for d in s) for n, s in input_shapes.items()}
        if self._dyn is None:
            for n, s in shapes.items():
                if s != tuple(self._inputs[n][1]):
                    raise TypeError(f"[{where}] input {n!r} must have shape {list(self._inputs[n][1])}, got {list(s)}")
            return {n: tuple(s) for n, (_, s) in self._outputs.items()}
        out: dict[str, tuple[int, ...]] = self._dyn.output_shapes(self._dyn.bind(shapes, where))
        return out

    @property
    def output_descriptors(self) -> dict[str, tuple[str, tuple[int | Sym, ...]]]:
        """Python extension: {output name: (data type, shape)}; dynamic dimensions are size
        expressions (`.name`, `.max_size`)."""
        return dict(self._outputs)

    @property
    def kernel_names(self) -> list[str]:
        """Python extension: the kernels one dispatch launches, in order (after fusion)."""
        return list(self._program.kernel_names)

    def kernels_run(self, shapes: Mapping[str, Sequence[int]] | None = None) -> list[str]:
        """Python extension: the kernels one dispatch with inputs of these shapes launches, in
        order: `kernel_names` less the size variants that do no work at those sizes (a graph with
        dynamic dimensions records a GEMM's GEMV and tiled paths and attention's decode and
        prompt kernels, each gated on the sizes).

        Parameters
        ----------
        shapes : dict of str to sequence of int, optional
            ``{input name: shape}`` of the dispatch. May be left out (None) for a graph without
            dynamic dimensions.

        Returns
        -------
        list of str
            The kernels' names, in launch order.

        Raises
        ------
        TypeError
            `shapes` missing for a graph with dynamic dimensions, or shapes the graph does not
            take (as dispatch raises).
        """
        names = self._program.kernel_names
        dyn = self._program.dyn
        if dyn is None:
            return list(names)
        if shapes is None:
            raise TypeError("[kernels_run] the graph has dynamic dimensions: give the input shapes")
        values = dyn.bind({k: tuple(v) for k, v in shapes.items()}, "kernels_run")
        off = set(dyn.launch_data(values).off or ())
        return [n for i, n in enumerate(names) if i not in off]

    def fusion_report(self) -> list[dict[str, str | None]]:
        """Python extension: what fusion left undone in this graph.

        Returns
        -------
        list of dict
            One dict per finding, with `kind` ("attention": a softmax not fused into an attention
            kernel; "transpose": a layout copy that still launches; "epilogue": an elementwise
            kernel reading a GEMM's or convolution's output instead of being applied as it
            stores), the node's `op` and `label` (None when it has none), and the `reason`. Empty
            when every attention, head transpose and activation after a GEMM fused.
        """
        return [dict(zip(("kind", "op", "label", "reason"), x)) for x in self._program.fusion_notes]

    @property
    def pipelines(self) -> int:
        """Python extension: the number of distinct compute pipelines the graph's launches use,
        all of them, created or not (kernels that differ only in sizes passed as launch
        parameters share one, dynamic/kernels.py SizeParams). With dynamic dimensions, the size
        buckets' variants are created at the first dispatch whose sizes run them:
        `pipelines_created` counts those made so far."""
        return len({k.key for k in self._kernels})

    @property
    def pipelines_created(self) -> int:
        """Python extension: the number of distinct pipelines created so far for the graph's
        launches (all of them for a graph without dynamic dimensions; else those of the launches
        built ungated and of the size buckets some dispatch ran). Kernels that render the same
        WGSL share one (runtime/wgsl.py), so this may be less than `pipelines`."""
        return len({id(e[0]) for e in list(self._launches) if e[0] is not None})

    @property
    def autotune(self) -> dict[str, float]:
        """Python extension: what kernel autotuning cost this build: {"seconds": time spent timing
        candidates (bounded by MLTENSOR_AUTOTUNE_BUDGET), "signatures_tuned": kernels timed
        (0 when every choice came from the cache or the heuristic)}."""
        return dict(self._program.autotune)

    @property
    def memory(self) -> dict[str, int]:
        """Python extension: GPU bytes this graph binds, by kind: "constants" (weights, held once
        per context and shared with every graph binding the same bytes), "constant_tensors"
        (create_constant_tensor tensors bound in place), "folded_constants" (values computed once
        at build, its own) and "intermediates" (its pooled buffers, reused by liveness). Staging
        memory is per context; `ctx.counters["constant_bytes"]` is the store's total."""
        return dict(self._program.memory)

    def __repr__(self) -> str:
        return f"<MLGraph {len(self._launches)} kernels, inputs {list(self._inputs)}, outputs {list(self._outputs)}>"

    def destroy(self) -> None:
        """Free the graph's GPU memory (WebNN ``destroy()``); a destroyed graph cannot be
        dispatched again. Idempotent; work already dispatched completes: the buffers are freed
        after the submit of the last dispatch called before, held-back ones included (a held
        dispatch reads the graph itself, so this task, which writes it, waits for them)."""
        ctx = self._context
        with ctx._lock:
            if self._destroyed:
                return
            self._destroyed = True
            self._last_call = self._last_dyn = None
            ctx._graphs.discard(self)
            self._bg_cache.clear()
            self._last_tensors, self._last = [], None
            bufs, self._buffers = self._buffers, []
            shared, self._shared = self._shared, []
            tl = ctx._timeline

            def free() -> None:
                tl.after_submit(lambda: [b.destroy() for b in bufs])
                ctx._constants.release(shared)  # other graphs may still bind them

            tl.enqueue(Task((), (self,), free))

    def _bound(self, tensors: Sequence[Any], off: Any = None) -> Any:
        """Launch list [(pipeline, bind group, groups)] for this tensor set (cached), without the
        launches `off` (LaunchData.off)."""
        return self._replay_skipping(tensors, off)[0]

    def _create(self, idx: Iterable[int]) -> None:
        """Create the pipelines and fixed bind groups of the launches `idx` not created yet (size
        buckets' variants: at the first dispatch that runs them), in parallel as a build does.
        Called with the device lock held (dispatch), so two threads never both create one; the
        pipeline is set last, so a failure (an OperationError) leaves the launch to retry."""
        todo = [i for i in idx if self._launches[i][0] is None]
        first, self._unwarmed = self._unwarmed, []  # (the first dispatch: the build's kernels too)
        if not todo and not first:
            return
        device = self._context.device
        kernels = [self._kernels[i] for i in todo]
        sources = None if self._sources is None else [self._sources[i] for i in todo]
        compile_kernels(self._context, kernels, sources, warm=False)
        # (the lock is held: the Mesa warm-up's share on this device runs on this thread)
        warm(self._context, first + kernels, locked=True)
        for i, k in zip(todo, kernels):
            e = self._launches[i]
            pipe, bgl = pipeline(device, k, None if sources is None else self._sources[i])
            if not any(ext_of(b) for b in e[2]):
                e[4] = device.create_bind_group(
                    layout=bgl, entries=[{"binding": j, "resource": resource_of(b)} for j, b in enumerate(e[2])]
                )
            e[1], e[0] = bgl, pipe
            self._lazy -= 1

    def _replay(self, tensors: Sequence[Any]) -> Any:
        """_replay_skipping for a graph that skips no launch (no dynamic dimensions): the
        dispatch hot path, whose check of the last tensor set is all it adds."""
        if tensors == self._last_tensors:
            return self._last
        return self._replay_skipping(tensors, None)

    def _replay_skipping(self, tensors: Sequence[Any], off: Any) -> Any:
        """(bound launches, replay list, buffers, ..., immediates layout) for this tensor set,
        cached per set; the last set is checked first (a session binds the same tensors every
        run). `off`: launches left out (no workgroups at this dispatch's sizes: LaunchData.off),
        each pattern its own entry; the launches kept are created here if they are not yet.

        The replay list holds raw wgpu-native handles, (pipeline | None, bind group | None, x, y,
        z) per launch, None where the launch before set the same object: consecutive launches of
        one kernel (chains of adds, RNN steps) skip set_pipeline, which costs as much as the
        dispatch itself. Only launches that touch the caller's tensors get new bind groups for
        a new set; the others are shared by every set."""
        if tensors == self._last_tensors and (off is self._last_off or off == self._last_off):
            return self._last
        key: tuple[Any, ...] = tuple(id(t) for t in tensors)
        if off is not None:
            key = (key, off)
        hit = self._bg_cache.get(key)
        if hit is not None and all(r() is t for r, t in zip(hit[0], tensors)):
            self._last_tensors, self._last, self._last_off = list(tensors), hit[1], off
            return hit[1]
        by_slot: dict[tuple[str, str], Any] = {}
        names = [("in", n) for n in self._in_names] + [("out", n) for n in self._out_names]
        for (kind, name), t in zip(names, tensors):
            by_slot[(kind, name)] = t._buffer
        device = self._context.device
        idx: Sequence[int] = range(len(self._launches))
        if off is not None:
            skip = set(off)
            idx = [i for i in idx if i not in skip]
        if self._lazy or self._unwarmed:
            self._create(idx)
        bound: list[tuple[Any, Any, Any]] = []
        for i in idx:
            pipe, bgl, bufs, groups, bg = self._launches[i]
            if bg is None:  # caller's tensors, whole or a view (a slab of a concat output)
                real = [
                    by_slot[(b.kind, b.name)]
                    if isinstance(b, Ext)
                    else (by_slot[(b[0].kind, b[0].name)], b[1])
                    if ext_of(b)
                    else b
                    for b in bufs
                ]
                bg = device.create_bind_group(
                    layout=bgl, entries=[{"binding": i, "resource": resource_of(b)} for i, b in enumerate(real)]
                )
            bound.append((pipe, bg, groups))
        raw: list[tuple[Any, ...]] = []
        last_pipe = last_bg = None
        if self._native:
            for pipe, bg, groups in bound:
                rp, rb = pipe._internal, bg._internal
                if self._dyn is not None:
                    groups = (0, 0, 0)  # sized per dispatch (_record_imm)
                raw.append((None if rp == last_pipe else rp, None if rb == last_bg else rb, *groups))
                last_pipe, last_bg = rp, rb
        if len(self._bg_cache) >= _BG_CACHE_MAX:
            self._bg_cache.pop(next(iter(self._bg_cache)))
        tail = (bound[-1][0]._internal, bound[-1][1]._internal) if raw else None
        # launches after the first as C arrays for the compiled loop (runtime/replay.py), if any
        native = replay.loaded() if raw else None
        # where each launch kept takes its immediates (rows, at, first size, last offset, at[1:]
        # in C): the graph's own, else laid out again for the launches kept
        if off is None:
            imm = [self._imm_rows, self._imm_at, self._imm0, self._imm_last, None]
        else:
            rows, at, _ = immediates_layout([self._kernels[i] for i in idx], self._imm_blocks)
            imm = [rows, at, at[0][1] if at else 0, next((o for o, size in reversed(at) if size), None), None]
        if native is not None:
            ffi = native[0]
            if off is None:
                if self._imm_at is not None and self._imm_c is None:
                    self._imm_c = ffi.new("uint32_t[]", [v for r in self._imm_at[1:] for v in r] or 1)
                imm[4] = self._imm_c
            elif imm[1] is not None:
                imm[4] = ffi.new("uint32_t[]", [v for r in imm[1][1:] for v in r] or 1)
            native = (native[1], replay.arrays(ffi, raw[1:], handle_address), ffi)
        entry = (bound, raw, tuple(t._buffer for t in tensors), tail, raw[1:], native, tuple(imm))
        self._bg_cache[key] = ([weakref.ref(t) for t in tensors], entry)
        for t in tensors:
            if self._evict not in t._on_destroy:  # once per graph, however often its sets change
                t._on_destroy.append(self._evict)
        self._last_tensors, self._last, self._last_off = list(tensors), entry, off
        return entry

    def _evict(self, tensor: Any) -> None:
        self._last_call = self._last_dyn = None
        if tensor in self._last_tensors:
            self._last_tensors, self._last = [], None
        tid = id(tensor)
        # (keys: the tensors' ids, or (ids, launches left out): _replay_skipping)
        for k in [k for k in self._bg_cache if tid in (k[0] if k and k[0].__class__ is tuple else k)]:
            del self._bg_cache[k]


def program_of(graph: MLGraph) -> Program:
    """The Program `graph` dispatches (runtime/program.py): what the graph cache saves."""
    return graph._program
