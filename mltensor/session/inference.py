"""InferenceSession: the onnxruntime surface (creation, get_inputs/get_outputs, run, run_async,
close), composed of the package's mixins; default_context."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, overload

import asyncio
import os
import threading

from ..errors import internal_errors
from ..front.context import ml
from ..front.tensor import MLTensor
from ..graphcache import store
from . import cache as graph_cache
from ..onnxio import source_name
from . import lazy
from .importing import Importing
from .loading import Loading, NodeArg, is_tflite
from .run import RunPath, Shaped, read_all
from .specializations import Specializations
from .stagetree import StageTree

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from onnx import ModelProto

    from ..front.context import MLContext
    from ..front.graph import MLGraph
    from .tensorsets import Specialization

_default_ctx = None
_default_lock = threading.Lock()


def default_context() -> MLContext:
    """The context sessions share when none is given (so their tensors can be chained)."""
    global _default_ctx
    with _default_lock:
        if _default_ctx is None or _default_ctx._lost_info is not None:
            _default_ctx = ml.create_context_sync()
        return _default_ctx


class InferenceSession(Loading, Specializations, Importing, StageTree, RunPath):
    """Run an ONNX or TFLite model as onnxruntime's ``InferenceSession`` does, on an MLContext.

    ::

        sess = mltensor.InferenceSession("model.onnx", free_dimensions={"batch": 1})
        (y,) = sess.run(None, {"x": array})  # numpy in, numpy out

    A run accepts any input sizes the model allows: unknown dimensions become dynamic dimensions
    (one build serves every size) where the model and the adapter permit, else each new
    combination of sizes is built once (a specialization, kept in an LRU). See the sessions guide
    (docs/guides/sessions.md) for sizes, data-dependent shapes, ml-tensor outputs, threads and
    stateful TFLite models.

    Parameters
    ----------
    model : str, os.PathLike, bytes, bytearray, memoryview or onnx.ModelProto
        The model: a path to an ``.onnx`` or ``.tflite`` file, the file's bytes (a TFLite model is
        recognized by its ``TFL3`` identifier), or a loaded ``onnx.ModelProto``.
    context : MLContext or None, default None
        The context to run on; None: one context shared by every session of the process (so
        their tensors can be fed to one another).
    free_dimensions : dict of str to int, optional
        Fix dimensions the model leaves open, by name (an ONNX ``dim_param`` such as
        ``{"batch": 1}``). A TFLite model takes ``{input name: full shape}`` (or ``{"batch": n}``)
        for inputs whose shape signature has free (-1) dimensions.
    max_dimensions : dict of str to int, optional
        The largest size of named dynamic dimensions (``{"past_sequence": 4096}``): the
        session's tensors are sized for it. Otherwise a dimension's capacity grows by doubling
        from the first size fed. Every name must be a dynamic dimension of the inputs.
    dynamic : bool or None, default None
        None: use dynamic dimensions where the adapter has the ``immediates`` feature and every
        operator of the model takes them, else build once per input size; True: require them;
        False: build once per combination of input sizes. ``stats["static_reason"]`` says why
        a session builds per size.
    providers : list, optional
        Accepted for onnxruntime compatibility; ignored.
    sess_options : object, optional
        Accepted for onnxruntime compatibility; ignored.
    max_specializations : int, default 8
        How many per-size builds (and, for a model with data-dependent shapes, later stages per
        stage) to keep, least recently used dropped first (their ml-tensor outputs included).
    float16 : bool, default False
        Compute a TFLite model in float16 (its inputs and outputs keep the model's types). ONNX
        models are converted to float16 beforehand instead.
    cache : bool or None, default None
        The on-disk graph cache: None uses it unless ``MLTENSOR_GRAPH_CACHE=0``; False keeps this
        session away from it; True uses it.

    Raises
    ------
    TypeError
        A bad argument (`cache`, `dynamic`, `max_specializations`, ``float16=True`` for an ONNX
        model, `max_dimensions` naming a dimension that is not dynamic), or a model that is not a
        path, bytes or ModelProto.
    FileNotFoundError
        No file at the path given.
    mltensor.DataError
        A malformed model file.
    mltensor.NotSupportedError
        An operator or construct the importers do not support (named with its node), or
        ``dynamic=True`` on an adapter without the ``immediates`` feature.
    """

    # The methods live in the package's modules by concept (mltensor/session/__init__.py); the
    # StageHost ones (stages/host.py: next_stage, import_body, storage_array, read_all,
    # count_read, with `context` and `build_lock`) serve a staged model's run, not applications.

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes | bytearray | memoryview | ModelProto,
        context: MLContext | None = None,
        *,
        free_dimensions: Mapping[str, int | Sequence[int]] | None = None,
        max_dimensions: Mapping[str, int] | None = None,
        dynamic: bool | None = None,
        providers: Sequence[Any] | None = None,
        sess_options: Any = None,
        max_specializations: int = 8,
        float16: bool = False,
        cache: bool | None = None,
    ) -> None:
        self._ctx = context if context is not None else default_context()
        # The persistent graph cache (mltensor/graphcache/): on unless cache=False or
        # MLTENSOR_GRAPH_CACHE=0; _cache_id is the model's SHA-256 (None: not cached)
        if cache not in (None, True, False):
            raise TypeError(f"[InferenceSession] cache must be None, True or False, got {cache!r}")
        self._use_cache = store.enabled() if cache is None else cache
        self._cache_id = None
        self._source = model
        # float16=True: a TFLite model computes in float16 (tflite.import_model); ONNX models
        # are converted to float16 beforehand (their float16 inputs and outputs are then native)
        self._float16 = bool(float16)
        self._free = dict(free_dimensions or {})
        if isinstance(max_specializations, bool) or not isinstance(max_specializations, int) or max_specializations < 1:
            raise TypeError(
                f"[InferenceSession] max_specializations must be an integer >= 1, got {max_specializations!r}"
            )
        self.max_specializations = max_specializations
        self._closed = False
        self._specs: OrderedDict[Any, Specialization] = (
            OrderedDict()
        )  # key -> Specialization, least recently used first
        self._retiring: dict[int, Specialization] = {}  # id(tensor set of a run) -> the outgrown build it replaced
        self._spec = None  # the one the last run used
        # stage_*: models with data-dependent shapes (stages/): later stages built, reused;
        # readbacks/readback_bytes: the values read back to decide shapes (and loop conditions)
        self._stats = {
            "builds": 0,
            "hits": 0,
            "evictions": 0,
            "loaded": 0,
            "stage_builds": 0,
            "stage_hits": 0,
            "readbacks": 0,
            "readback_bytes": 0,
        }
        self._lock = threading.RLock()  # specializations, their tensor sets, stats
        self.build_lock = threading.Lock()  # one build at a time; runs at built sizes go on
        if dynamic not in (None, True, False):
            raise TypeError(f"[InferenceSession] dynamic must be None, True or False, got {dynamic!r}")
        self._caps = None  # dynamic/capacity.Capacities when unknown dimensions are dynamic
        self._static_reason = None  # why this session builds one graph per size
        self._static_maxima = None  # the max_dimensions that reason was learned at
        if is_tflite(model):
            self._kind = "tflite"
            self._load_tflite(model)
        elif self._float16:
            raise TypeError(
                "[InferenceSession] float16=True applies to TFLite models; convert an ONNX model "
                "to float16 instead (onnxconverter_common.float16.convert_float_to_float16)"
            )
        else:
            self._kind = "onnx"
            self._name = source_name(model)
            if isinstance(model, (bytearray, memoryview)):
                model = bytes(model)  # (the bytes described now are the ones parsed later)
            elif isinstance(model, (str, os.PathLike)):
                model = os.path.abspath(os.fspath(model))  # (parsed later: the cwd may change)
            self._source = model
            self._value_names: set[str] = set()  # inputs whose values the graph must know at load
            # The model's proto: parsed here, or, when an earlier process left the description
            # of this model in the graph cache, on first use only (_proto): a process whose
            # builds all come from the cache neither imports onnx nor parses the model.
            self._proto_lock = threading.Lock()
            self._loaded = None  # (ModelProto, Weights or None) once parsed
            self._main = None  # (hash of the model's bytes, file identity) read for the note
            noted = None
            if self._use_cache:
                cache_id, noted, self._main = graph_cache.described(self)
            if noted is not None:
                self._cache_id, desc = cache_id, noted
                self._describe(desc)
            else:
                importer = lazy.importer()
                self._loaded = importer.load_model(model, self._name)
                with importer.model_errors(self._name, model=self._loaded[0], weights=self._loaded[1]):
                    desc = importer.io_description(self._loaded[0])
                    self._describe(desc)
            shapes, params = desc["shapes"], desc["params"]
            self._setup_dynamic(shapes, params, max_dimensions, dynamic)
            self._cache_note(desc if noted is None else None)
            pending = any(shapes[name] is None for name in shapes) or any(
                d is None and (p is None or p not in self._free)
                for name in shapes
                for d, p in zip(shapes[name], params[name])
            )
            if not pending:
                # Otherwise some dimension has no value yet: each run's feeds fix it.
                feeds = {a.name: Shaped(a.shape) for a in self._input_args}
                self._specialize(feeds, build_only=True)

    # -- onnxruntime surface -----------------------------------------------------------------------

    @property
    def context(self) -> MLContext:
        """The MLContext the session runs on."""
        return self._ctx

    @property
    def graph(self) -> MLGraph | None:
        """The MLGraph of the specialization the last run used (None before one is built); for a
        model with data-dependent shapes, its first stage's graph (mltensor/stages/)."""
        spec = self._spec
        if spec is None:
            return None
        graph: MLGraph = spec.graph if spec.stage is None else spec.stage.graph
        return graph

    @property
    def _out_tensors(self) -> dict[str, MLTensor]:
        """The output tensors of this thread's last run (bench/ binds them directly)."""
        with self._lock:
            return self._spec.last_outputs() if self._spec is not None else {}

    @property
    def specializations(self) -> int:
        """How many specializations (one per combination of input sizes) are cached."""
        return len(self._specs)

    @property
    def stats(self) -> dict[str, Any]:
        """Snapshot: specializations cached, builds, cache hits and LRU evictions so far; whether
        builds use dynamic dimensions, and if not why (None: the model has no unknown sizes)."""
        with self._lock:
            return dict(
                self._stats,
                specializations=len(self._specs),
                dynamic=self._caps is not None,
                static_reason=self._static_reason,
            )

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs, as onnxruntime describes them.

        Returns
        -------
        list of NodeArg
            One per input, in model order, with `.name`, `.shape` (ints, and names or None for
            unknown dimensions; None for an input declared without a shape) and `.type` (e.g.
            ``"tensor(float)"``).
        """
        return list(self._input_args)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs, as `get_inputs` describes inputs.

        Returns
        -------
        list of NodeArg
            One per output, in model order, with `.name`, `.shape` and `.type`.
        """
        return list(self._output_args)

    def get_providers(self) -> list[str]:
        """The execution providers, as onnxruntime names them (compatibility).

        Returns
        -------
        list of str
            ``["WebNNExecutionProvider"]``.
        """
        return ["WebNNExecutionProvider"]

    @overload
    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike | MLTensor],
        run_options: Any = None,
        *,
        output_location: Literal["cpu"] = "cpu",
    ) -> list[np.ndarray]: ...

    @overload
    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike | MLTensor],
        run_options: Any = None,
        *,
        output_location: Literal["ml-tensor"],
    ) -> list[MLTensor]: ...

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike | MLTensor],
        run_options: Any = None,
        *,
        output_location: str = "cpu",
    ) -> list[np.ndarray] | list[MLTensor]:
        """Run the model once. Safe to call from several threads at once (each run takes tensors
        no other run in flight uses; results are what sequential runs give).

        Parameters
        ----------
        output_names : sequence of str or None
            The outputs to return, in this order; None: all of them, in model order.
        input_feed : dict of str to numpy.ndarray or MLTensor
            One value per model input, by name (every input, no other name). A numpy array (or
            anything `numpy.asarray` takes) of the input's type is uploaded once; an MLTensor of
            the session's context, with the input's data type, is bound as is (no copy).
        run_options : object, optional
            Accepted for onnxruntime compatibility; ignored.
        output_location : {"cpu", "ml-tensor"}, default "cpu"
            "cpu": numpy arrays. "ml-tensor": the session's own output tensors (IOBinding
            semantics, no read back): they stay valid until `close()`, and this thread's next
            run overwrites them; they may be fed to another session on the same context or back
            into this one (a decode loop). Outputs folded to constants at load come as tensors
            written once.

        Returns
        -------
        list of numpy.ndarray or MLTensor
            One per requested output, in the order of `output_names`.

        Raises
        ------
        TypeError
            The session is closed; `input_feed` not a dict, naming an unknown input or missing
            one, or a value of the wrong data type or shape (a size above a fixed dimension, two
            sizes of one named dimension that differ); an unknown output name; an MLTensor of
            another context; a bad `output_location`.
        mltensor.NotSupportedError
            The model cannot be built at these input sizes.
        """
        with internal_errors("InferenceSession.run"):
            names, outs, spec, tset = self._enqueue(output_names, input_feed, output_location)
            keep = output_location == "ml-tensor"
            try:
                if keep:
                    return outs
                res = read_all(self._ctx, outs, "InferenceSession.run")
                return [self._to_onnx(spec, n, r) for n, r in zip(names, res)]
            finally:
                self._end_run(spec, tset, keep)

    @overload
    async def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike | MLTensor],
        run_options: Any = None,
        *,
        output_location: Literal["cpu"] = "cpu",
    ) -> list[np.ndarray]: ...

    @overload
    async def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike | MLTensor],
        run_options: Any = None,
        *,
        output_location: Literal["ml-tensor"],
    ) -> list[MLTensor]: ...

    async def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike | MLTensor],
        run_options: Any = None,
        *,
        output_location: str = "cpu",
    ) -> list[np.ndarray] | list[MLTensor]:
        """The awaitable form of `run`; several may be in flight at once, from one event loop
        or many.

        Parameters
        ----------
        output_names : sequence of str or None
            As `run`: the outputs to return, None for all.
        input_feed : dict of str to numpy.ndarray or MLTensor
            As `run`: one value per model input.
        run_options : object, optional
            Accepted for onnxruntime compatibility; ignored.
        output_location : {"cpu", "ml-tensor"}, default "cpu"
            As `run`: numpy arrays, or the session's own output tensors.

        Returns
        -------
        list of numpy.ndarray or MLTensor
            One per requested output (awaited: the reads run while the event loop goes on).

        Raises
        ------
        TypeError
            As `run`.
        mltensor.NotSupportedError
            As `run`.
        """
        with internal_errors("InferenceSession.run_async"):
            names, outs, spec, tset = self._enqueue(output_names, input_feed, output_location)
            keep = output_location == "ml-tensor"
            try:
                if keep:
                    return outs
                reads = [self._ctx.read_tensor_async(t) if isinstance(t, MLTensor) else None for t in outs]
                done = await asyncio.gather(*[r for r in reads if r is not None])
                it = iter(done)
                res = [next(it) if r is not None else t for r, t in zip(reads, outs)]
                return [self._to_onnx(spec, n, r) for n, r in zip(names, res)]
            finally:
                self._end_run(spec, tset, keep)

    def reset_state(self) -> None:
        """Start a stateful TFLite model (resource variables: a streaming model's buffers of past
        frames) over from its initial state, as a fresh LiteRT interpreter has it; runs dispatched
        after this returns see it. Without state (`stateful` False): nothing to do. The state
        lives on the GPU between runs (the sessions guide says how runs on several threads share
        it)."""
        with self._lock:
            spec = self._specs.get(None) if self._kind == "tflite" else None
            if spec is not None and spec.state is not None:
                spec.state.reset()

    @property
    def stateful(self) -> bool:
        """Whether the model carries state between runs (a TFLite model's resource variables)."""
        spec = self._specs.get(None) if self._kind == "tflite" else None
        return spec is not None and spec.state is not None

    def close(self) -> None:
        """Destroy the session's tensors and graph (tensors returned by ml-tensor runs included).
        Runs in flight on other threads finish first (their specializations go when they end)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for spec in self._specs.values():
                self._drop(spec)
            self._specs.clear()
            self._spec = None

    def __del__(self) -> None:
        try:
            if self._ctx._lost_info is None:
                self.close()
        except Exception:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
