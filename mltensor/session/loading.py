"""Loading a model into an InferenceSession: an ONNX model described from its proto or, when an
earlier process left its description in the graph cache, from that note (the model is then
parsed only when something is built); a TFLite model imported (or loaded from the cache) at once.
get_inputs()/get_outputs() answer with NodeArgs."""

from __future__ import annotations

import os
from typing import Any

from ..dynamic.capacity import Capacities
from ..dynamic.kernels import FEATURE
from ..errors import DataError, NotSupportedError
from . import cache as graph_cache
from ..onnxio import TYPE_STRING, np_dtype
from . import lazy
from .state import VariableState
from .tensorsets import Specialization


class NodeArg:
    """An input or output as onnxruntime describes it: .name, .shape, .type ("tensor(float)")."""

    __slots__ = ("name", "shape", "type")
    name: str  #: the input's or output's name
    shape: list[int | str | None] | None  #: sizes; a name or None for an unknown one; None: no shape
    type: str  #: the ONNX type, e.g. "tensor(float)"

    def __init__(self, name, shape, type):
        self.name, self.shape, self.type = name, None if shape is None else list(shape), type

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def is_tflite(model):
    """Whether `model` is a TFLite model: a .tflite path, or bytes with the TFL3 identifier."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model).lower().endswith(".tflite")
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model[4:8]) == b"TFL3"
    return False


class Loading:
    """InferenceSession's loading methods (a mixin)."""

    # attributes InferenceSession.__init__ sets (declared for the type checker)
    _caps: Capacities | None
    _spec: Specialization | None
    _static_reason: str | None
    _static_maxima: list[list[str | int]] | None

    def _cache_note(self, desc: dict[str, Any] | None = None) -> None:
        """With the graph cache: the model's id (desc: the session was described from the proto,
        whose description is saved for later processes), and what earlier processes learned of
        it."""
        if not self._use_cache:
            return
        if desc is not None:
            weights = self._loaded[1]
            ids = graph_cache.model_ids(self._source, weights, self._main)
            if ids is None:
                return
            self._cache_id = ids[1]
            graph_cache.save_description(self, ids[0], desc, weights)
        if self._cache_id is None:
            return
        note = graph_cache.load_note(self)
        self._value_names.update(note.get("value_names", ()))
        reason = note.get("static_reason")
        # (learned at the maxima the user gave then: other maxima may well build, e.g. smaller
        # ones under a software adapter's buffer limit)
        same = self._caps is not None and note.get("static_maxima") == sorted(
            [str(k), int(v)] for k, v in self._caps.user.items()
        )
        if reason and same and not self._require_dynamic:
            self._static_reason, self._static_maxima, self._caps = reason, note["static_maxima"], None

    def _save_note(self):
        if self._cache_id is not None:
            graph_cache.save_note(
                self,
                {
                    "value_names": sorted(self._value_names),
                    "static_reason": self._static_reason if self._caps is None else None,
                    "static_maxima": self._static_maxima,
                },
            )

    def _proto(self):
        """(ModelProto, Weights or None) of the model: parsed at creation, else (a session
        described from the graph cache's note) at its first use, a build of a specialization or
        stage the cache does not hold. `_model` and `_weights` read it."""
        loaded = self._loaded
        if loaded is None:
            with self._proto_lock:
                loaded = self._loaded
                if loaded is None:
                    loaded = lazy.importer().load_model(self._source, self._name)
                    if not graph_cache.same_model(self, loaded[1], self._main):
                        raise DataError(
                            f"[onnx] {self._name}: the model changed since the session loaded it; "
                            "create the InferenceSession again"
                        )
                    self._loaded = loaded
        return loaded

    @property
    def _model(self):
        return self._proto()[0]

    @property
    def _weights(self):
        return self._proto()[1]

    def _setup_dynamic(
        self, shapes: dict[str, Any], params: dict[str, Any], max_dimensions: Any, dynamic: bool | None
    ) -> None:
        caps = Capacities({n: (shapes[n], params[n]) for n in shapes}, self._free, max_dimensions)
        unknown = set(max_dimensions or {}) - set(caps.names)
        if unknown:
            raise TypeError(
                f"[InferenceSession] max_dimensions names {sorted(unknown)}, which are not dynamic "
                f"dimensions of the model's inputs (those are {caps.names})"
            )
        if not caps or dynamic is False:
            self._static_reason = "dynamic=False" if caps else None
            return
        if FEATURE not in self._ctx.device.features:
            if dynamic:
                raise NotSupportedError(f"[InferenceSession] dynamic=True needs the adapter feature '{FEATURE}'")
            self._static_reason = f"the adapter lacks the '{FEATURE}' feature"
            return
        self._caps = caps
        self._require_dynamic = bool(dynamic)

    @property
    def dynamic_dimensions(self) -> dict[str, int]:
        """{name: current maximum} of the inputs' dynamic dimensions ({} when this session builds
        one graph per size; stats["static_reason"] says why)."""
        return dict(self._caps.cap) if self._caps is not None else {}

    def _load_tflite(self, model: Any) -> None:
        hit = key = None
        if self._use_cache:  # (session/cache.py)
            self._cache_id = graph_cache.model_id(model)
            if self._cache_id is not None:
                key = graph_cache.session_key(self, "tflite")
                hit = graph_cache.load_spec(self, key)
        if hit is not None:
            graph, inputs, outputs, initial = hit  # (the values: a stateful model's initial state)
            self._stats["loaded"] += 1
        else:
            initial = {}
            first, inputs, outputs = lazy.tflite().import_stages(
                model,
                self._ctx,
                free_dimensions=self._free,
                float16=self._float16,
                initial_state=initial,
                build=self._stage_build(),
            )
            if first.cut is not None:  # control flow decided at run time: a chain of stages
                self._load_tflite_stages(first, inputs, outputs)
                return
            graph, inputs, outputs = first.graph, first.inputs, first.outputs
            if key is not None:
                graph_cache.save_spec(self, key, graph, inputs, outputs, initial)
        # resource variables (tflite/control.py): state inputs and outputs the session binds itself
        state = None
        if initial:
            state = VariableState(
                self._ctx,
                initial,
                {i.name: (i.data_type, i.shape) for i in inputs if i.name in initial},
                {o.name: (o.data_type, o.shape) for o in outputs if o.name in initial},
            )
            inputs = [i for i in inputs if i.name not in initial]
            outputs = [o for o in outputs if o.name not in initial]
        # one specialization, the sizes of the file (its inputs are checked against them)
        self._spec = Specialization(graph, inputs, outputs)
        self._spec.state = state
        self._tflite_args(inputs, outputs)

    def _stage_build(self):
        """How a staged TFLite model's stages get their graphs (tflite/staged.py): with the graph
        cache, loaded when an earlier session saved the stage (the import still runs: it gives
        the stage's cut), else built and saved; None without it."""
        if not self._use_cache or self._cache_id is None:
            return None

        def build(b, outputs, snapshot):
            key = graph_cache.stage_key(self, snapshot)
            hit = graph_cache.load_spec(self, key)
            if hit is not None:
                with self._lock:
                    self._stats["loaded"] += 1
                return hit[0]
            graph = b.build_sync(outputs)
            graph_cache.save_spec(self, key, graph, [], [], {})
            return graph

        return build

    def _load_tflite_stages(self, first, inputs, outputs):
        """A TFLite model whose WHILE / IF is decided at run time (tflite/staged.py): its first
        stage; the later ones are built at the runs that reach them (StageTree.next_stage)."""
        self._spec = Specialization(None, inputs, [], stage=lazy.stages().Stage(first))
        self._tflite_args(inputs, outputs)

    def _tflite_args(self, inputs, outputs):
        self._tflite_key = None
        self._specs[None] = self._spec
        self._stats["builds"] += 1
        self._input_args = [NodeArg(i.name, i.shape, TYPE_STRING[i.onnx_type]) for i in inputs]
        self._np_in = {i.name: i.np_dtype for i in inputs}
        self._output_args = [NodeArg(o.name, o.shape, TYPE_STRING[o.onnx_type]) for o in outputs]

    def _describe(self, desc: dict[str, Any]) -> None:
        """get_inputs()/get_outputs() from the model's description (onnx/importer.io_description,
        from the proto or the graph cache's note; dims not yet fixed stay symbolic)."""
        shapes, params = desc["shapes"], desc["params"]
        self._input_args = []
        self._np_in = {}
        for name, et in desc["inputs"]:
            dims = (
                None
                if shapes[name] is None
                else [  # None: declared without a shape
                    d if d is not None else (p if p is None or p not in self._free else self._free[p])
                    for d, p in zip(shapes[name], params[name])
                ]
            )
            self._input_args.append(NodeArg(name, dims, TYPE_STRING.get(et, f"tensor({et})")))
            self._np_in[name] = np_dtype(et) if et else None
        self._output_args = []
        for name, et, dims in desc["outputs"]:  # a dim: its dim_value (int) or dim_param (str)
            dims = [d if isinstance(d, int) else self._free.get(d, d or None) for d in dims]
            self._output_args.append(NodeArg(name, dims, TYPE_STRING.get(et, "tensor(?)")))
