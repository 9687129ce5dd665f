"""InferenceSession: an onnxruntime-style runner for ONNX and TFLite models on an MLContext.

    sess = mltensor.InferenceSession("model.onnx", free_dimensions={"batch": 1})
    y, = sess.run(None, {"x": array})                               # numpy in, numpy out
    t, = sess.run(None, {"x": tensor}, output_location="ml-tensor")  # MLTensors in and out

Runs are cheap by construction:
- the session keeps one MLTensor per input and per output, created at the first run (for the
  shapes fixed at creation) and reused: a run allocates nothing;
- the same tensors are bound every run, so the graph's cached bind groups are reused;
- each numpy feed is uploaded once (write_tensor straight from the array); an MLTensor feed is
  bound as is (no copy);
- all outputs are read in parallel: every read is started before any is waited on, so one submit
  serves them all, and each result is one copy from the mapped staging memory.

output_location="ml-tensor" returns the session's own output tensors (IOBinding semantics): they
stay valid until `close()`, and the NEXT RUN FROM THE SAME THREAD OVERWRITES THEM (runs from other
threads never touch them). Read or copy them before running again if you need to keep them. They
may be fed to another session on the same context (no copy), or back into this session (a decode
loop): that run writes the output into a second tensor kept for the purpose, so the two alternate
(still no allocation after the first such run).
Outputs ONNX folds to constants at load are returned from the host (numpy), or as a tensor written
once (ml-tensor).

Threads: `run` and `run_async` may be called concurrently on one session, as in onnxruntime. Each
run takes a tensor set (input and output tensors) no other run in flight uses: a thread keeps
reusing its own (so a single thread allocates nothing after its first run), concurrent runs get
one each from a small pool. Results are exactly what sequential runs give. Builds of new sizes
are made one at a time per session, while runs at sizes already built go on.

Shape-polymorphic (ONNX): a run accepts any input sizes the model allows (symbolic or unknown
dimensions not pinned by `free_dimensions`). Those dimensions are dynamic dimensions
(mltensor/dynamic/): one build serves every size, kernels read the sizes at dispatch, and the
session's tensors are resizable, sized for a maximum per dimension (`max_dimensions={"past":
4096}`, else grown by doubling from the first size: dynamic/capacity.py). A decode loop feeding
each step's `present_*` outputs back as `past_*` (output_location="ml-tensor") thus moves no
cache bytes between host and GPU and allocates nothing per step. An input fed with a zero-sized
dimension (an empty cache) gets its own build, as do the values of inputs that must be known at
load (a shape fed as an input). Where a model's graph needs a size fixed at build (an operator
without dynamic kernels), or the adapter lacks the `immediates` feature, or `dynamic=False`, each
new combination of input sizes is imported and built once instead (its reason in
`stats["static_reason"]`). Either way builds are specializations, each with its own graph and
tensors; the session keeps the `max_specializations` most recently used ones (LRU, default 8) and
destroys the rest, their ml-tensor outputs included. `session.specializations` says how many are
cached; `session.stats` counts builds, cache hits and evictions.
"""

from collections import OrderedDict

import asyncio
import os
import threading

import numpy as np

from . import dtypes
from .errors import DataError, NotSupportedError
from .front.tensor import MLTensor

_default_ctx = None
_default_lock = threading.Lock()


def default_context():
    """The context sessions share when none is given (so their tensors can be chained)."""
    global _default_ctx
    with _default_lock:
        if _default_ctx is None or _default_ctx._lost_info is not None:
            from .front.context import ml

            _default_ctx = ml.create_context_sync()
        return _default_ctx


class NodeArg:
    """An input or output as onnxruntime describes it: .name, .shape, .type ("tensor(float)")."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name, shape, type):
        self.name, self.shape, self.type = name, None if shape is None else list(shape), type

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def _is_tflite(model):
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model).lower().endswith(".tflite")
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model[4:8]) == b"TFL3"
    return False


class _TensorSet:
    """The tensors one run binds: an input tensor per numpy feed, an output tensor per output
    (and a spare per output fed back into the session, so a decode loop alternates two)."""

    __slots__ = ("inputs", "outputs", "spare")

    def __init__(self):
        self.inputs = {}
        self.outputs = {}
        self.spare = {}

    def destroy(self):
        for d in (self.inputs, self.outputs, self.spare):
            for t in d.values():
                t.destroy()
            d.clear()


class _Specialization:
    """One build of the model for one combination of input sizes (and load-time input values):
    the graph, its inputs/outputs (IOInfo) and the tensor sets runs with these sizes reuse.

    Sets: `owned` maps a thread to the set its last run used (its ml-tensor outputs live there
    until that thread runs again), `free` holds sets no run uses. A run takes its thread's own
    set, else a free one, else a new one; `users` counts runs in flight, so an evicted or closed
    specialization is destroyed only once none is (the session's lock guards all of this)."""

    __slots__ = ("graph", "inputs", "outputs", "owned", "free", "busy", "seq", "const_tensors",
                 "values", "users", "dropped", "stage", "retired")

    def __init__(self, graph, inputs, outputs, values=None, stage=None):
        # stage: a model with data-dependent shapes runs as a tree of graphs (stages/plan.py);
        # graph is None then. retired: stages evicted from it while runs were in flight
        self.stage = stage
        self.retired = []
        self.graph = graph
        self.inputs = {i.name: i for i in inputs}
        self.outputs = {o.name: o for o in outputs}
        self.owned = {}  # thread ident -> (ticket, _TensorSet) of its latest ml-tensor run
        self.free = []
        self.busy = {}  # id(set) -> ticket (take order) of the run in flight using it
        self.seq = 0
        self.const_tensors = {}
        self.values = values or {}  # input name -> the value the graph is specialized to
        self.users = 0
        self.dropped = False  # evicted or closed: destroyed when the last run in flight ends

    def take(self):
        """The tensor set for a run on this thread (lock held)."""
        me = threading.get_ident()
        mine = self.owned.get(me)
        if mine is not None and id(mine[1]) not in self.busy:
            s = mine[1]
        else:  # none yet, or the thread's earlier run (run_async) is still in flight
            s = self.free.pop() if self.free else _TensorSet()
        self.seq += 1
        self.busy[id(s)] = self.seq
        self.users += 1
        return s

    def give_back(self, s, keep):
        """A run ended (lock held). keep: its outputs were returned as tensors, so the set stays
        this thread's until the thread's next run (of the thread's runs in flight at once, the
        latest keeps it). True when the specialization is to be destroyed now."""
        ticket = self.busy.pop(id(s))
        self.users -= 1
        me = threading.get_ident()
        mine = self.owned.get(me)
        if keep and (mine is None or mine[0] <= ticket):
            self.owned[me] = (ticket, s)
            if mine is not None and mine[1] is not s and id(mine[1]) not in self.busy:
                self.free.append(mine[1])
            if len(self.owned) > 8:  # sets of threads that ended go back to the pool
                alive = {t.ident for t in threading.enumerate()}
                for ident in [i for i in self.owned if i not in alive]:
                    self.free.append(self.owned.pop(ident)[1])
        elif mine is None or mine[1] is not s:
            self.free.append(s)
        return self.dropped and self.users == 0

    def last_outputs(self):
        """The output tensors of this thread's last ml-tensor run, else of any set."""
        mine = self.owned.get(threading.get_ident()) or next(iter(self.owned.values()), None)
        s = mine[1] if mine is not None else (self.free[-1] if self.free else None)
        return s.outputs if s is not None else {}

    def destroy_retired(self):
        for st in self.retired:
            st.destroy()
        self.retired.clear()

    def destroy(self):
        for s in [*(s for _, s in self.owned.values()), *self.free]:
            s.destroy()
        self.owned.clear()
        self.free.clear()
        for t in self.const_tensors.values():
            t.destroy()
        self.const_tensors.clear()
        self.destroy_retired()
        if self.stage is not None:
            self.stage.destroy()
            self.stage = None
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None


class InferenceSession:
    """Run an ONNX or TFLite model as onnxruntime's `InferenceSession` does, on an MLContext.

    model: a path, bytes, or an `onnx.ModelProto` (a .tflite path or bytes for TFLite).
    context: the MLContext to run on (default: one context shared by the process).
    free_dimensions: fix named or free input dimensions ({"batch": 1}). max_dimensions: bound the
    dynamic ones ({"past_sequence": 4096}). dynamic: False builds once per input size instead of
    once for every size. max_specializations: how many per-size builds (and, for models with
    data-dependent shapes, later stages per stage) to keep (LRU, default 8). float16: compute a
    TFLite model in float16. cache: False keeps this session away from the on-disk graph cache.
    providers, sess_options: accepted for onnxruntime compatibility (ignored). See the module
    docstring and the sessions guide for sizes, data-dependent shapes, ml-tensor outputs and
    threads."""

    def __init__(self, model, context=None, *, free_dimensions=None, max_dimensions=None, dynamic=None,
                 providers=None, sess_options=None, max_specializations=8, float16=False, cache=None):
        self._ctx = context if context is not None else default_context()
        # The persistent graph cache (mltensor/graphcache/): on unless cache=False or
        # MLTENSOR_GRAPH_CACHE=0; _cache_id is the model's SHA-256 (None: not cached)
        if cache not in (None, True, False):
            raise TypeError(f"[InferenceSession] cache must be None, True or False, got {cache!r}")
        from .graphcache import store as _store

        self._use_cache = _store.enabled() if cache is None else cache
        self._cache_id = None
        self._source = model
        # float16=True: a TFLite model computes in float16 (tflite.import_model); ONNX models
        # are converted to float16 beforehand (their float16 inputs and outputs are then native)
        self._float16 = bool(float16)
        self._free = dict(free_dimensions or {})
        if isinstance(max_specializations, bool) or not isinstance(max_specializations, int) \
                or max_specializations < 1:
            raise TypeError(f"[InferenceSession] max_specializations must be an integer >= 1, "
                            f"got {max_specializations!r}")
        self.max_specializations = max_specializations
        self._closed = False
        self._specs = OrderedDict()  # key -> _Specialization, least recently used first
        self._retiring = {}  # id(tensor set of a run) -> the outgrown build it replaced
        self._spec = None  # the one the last run used
        # stage_*: models with data-dependent shapes (stages/): later stages built, reused;
        # readbacks/readback_bytes: the values read back to decide shapes (and loop conditions)
        self._stats = {"builds": 0, "hits": 0, "evictions": 0, "loaded": 0, "stage_builds": 0,
                       "stage_hits": 0, "readbacks": 0, "readback_bytes": 0}
        self._lock = threading.RLock()  # specializations, their tensor sets, stats
        self._build_lock = threading.Lock()  # one build at a time; runs at built sizes go on
        if dynamic not in (None, True, False):
            raise TypeError(f"[InferenceSession] dynamic must be None, True or False, got {dynamic!r}")
        self._caps = None  # dynamic/capacity.Capacities when unknown dimensions are dynamic
        self._static_reason = None  # why this session builds one graph per size
        if _is_tflite(model):
            self._kind = "tflite"
            self._load_tflite(model)
        elif self._float16:
            raise TypeError("[InferenceSession] float16=True applies to TFLite models; convert an ONNX model "
                            "to float16 instead (onnxconverter_common.float16.convert_float_to_float16)")
        else:
            self._kind = "onnx"
            from .onnxio import source_name

            self._name = source_name(model)
            if isinstance(model, (bytearray, memoryview)):
                model = bytes(model)  # (the bytes described now are the ones parsed later)
            elif isinstance(model, (str, os.PathLike)):
                model = os.path.abspath(os.fspath(model))  # (parsed later: the cwd may change)
            self._source = model
            self._value_names = set()  # inputs whose values the graph must know at load
            # The model's proto: parsed here, or, when an earlier process left the description
            # of this model in the graph cache, on first use only (_proto): a process whose
            # builds all come from the cache neither imports onnx nor parses the model.
            self._proto_lock = threading.Lock()
            self._loaded = None  # (ModelProto, Weights or None) once parsed
            self._main = None  # (hash of the model's bytes, file identity) read for the note
            noted = None
            if self._use_cache:
                from .graphcache import sessions

                cache_id, noted, self._main = sessions.described(self)
            if noted is not None:
                self._cache_id, desc = cache_id, noted
                self._describe(desc)
            else:
                from .onnx.importer import data_errors, io_description, load_model

                self._loaded = load_model(model, self._name)
                with data_errors(self._name):
                    desc = io_description(self._loaded[0])
                    self._describe(desc)
            shapes, params = desc["shapes"], desc["params"]
            self._setup_dynamic(shapes, params, max_dimensions, dynamic)
            self._cache_note(desc if noted is None else None)
            pending = any(shapes[name] is None for name in shapes) or any(
                d is None and (p is None or p not in self._free)
                for name in shapes for d, p in zip(shapes[name], params[name])
            )
            if not pending:
                # Otherwise some dimension has no value yet: each run's feeds fix it.
                feeds = {a.name: _Shaped(a.shape) for a in self._input_args}
                self._specialize(feeds, build_only=True)

    # -- loading -------------------------------------------------------------------------------

    def _cache_note(self, desc=None):
        """With the graph cache: the model's id (desc: the session was described from the proto,
        whose description is saved for later processes), and what earlier processes learned of
        it."""
        if not self._use_cache:
            return
        from .graphcache import sessions

        if desc is not None:
            weights = self._loaded[1]
            ids = sessions.model_ids(self._source, weights, self._main)
            if ids is None:
                return
            self._cache_id = ids[1]
            sessions.save_description(self, ids[0], desc, weights)
        if self._cache_id is None:
            return
        note = sessions.load_note(self)
        self._value_names.update(note.get("value_names", ()))
        reason = note.get("static_reason")
        if reason and self._caps is not None and not self._require_dynamic:
            self._static_reason, self._caps = reason, None

    def _save_note(self):
        if self._cache_id is not None:
            from .graphcache import sessions

            sessions.save_note(self, {"value_names": sorted(self._value_names),
                                      "static_reason": self._static_reason if self._caps is None else None})

    def _proto(self):
        """(ModelProto, Weights or None) of the model: parsed at creation, else (a session
        described from the graph cache's note) at its first use, a build of a specialization or
        stage the cache does not hold. `_model` and `_weights` read it."""
        loaded = self._loaded
        if loaded is None:
            with self._proto_lock:
                loaded = self._loaded
                if loaded is None:
                    from .graphcache import sessions
                    from .onnx.importer import load_model

                    loaded = load_model(self._source, self._name)
                    if not sessions.same_model(self, loaded[1], self._main):
                        raise DataError(f"[onnx] {self._name}: the model changed since the session loaded it; "
                                        "create the InferenceSession again")
                    self._loaded = loaded
        return loaded

    @property
    def _model(self):
        return self._proto()[0]

    @property
    def _weights(self):
        return self._proto()[1]

    def _setup_dynamic(self, shapes, params, max_dimensions, dynamic):
        from .dynamic.capacity import Capacities
        from .dynamic.kernels import FEATURE

        caps = Capacities({n: (shapes[n], params[n]) for n in shapes}, self._free, max_dimensions)
        unknown = set(max_dimensions or {}) - set(caps.names)
        if unknown:
            raise TypeError(f"[InferenceSession] max_dimensions names {sorted(unknown)}, which are not dynamic "
                            f"dimensions of the model's inputs (those are {caps.names})")
        if not caps or dynamic is False:
            self._static_reason = "dynamic=False" if caps else None
            return
        if FEATURE not in self._ctx.device.features:
            if dynamic:
                from .errors import NotSupportedError

                raise NotSupportedError(f"[InferenceSession] dynamic=True needs the adapter feature '{FEATURE}'")
            self._static_reason = f"the adapter lacks the '{FEATURE}' feature"
            return
        self._caps = caps
        self._require_dynamic = bool(dynamic)

    @property
    def dynamic_dimensions(self):
        """{name: current maximum} of the inputs' dynamic dimensions ({} when this session builds
        one graph per size; stats["static_reason"] says why)."""
        return dict(self._caps.cap) if self._caps is not None else {}

    def _key(self, feeds):
        """Cache key of a specialization: each input's shape, and the value of each input the
        graph must know at load."""
        key = []
        for a in self._input_args:
            v = feeds[a.name]
            if a.name in self._value_names:
                h = _host(v, self._ctx)
                key.append((a.name, h.dtype.str, h.shape, h.tobytes()))
            else:
                key.append((a.name, tuple(v.shape)))
        return tuple(key)

    def _lookup(self, key):
        """A cached specialization (lock held), marked most recently used, or None."""
        spec = self._specs.get(key)
        if spec is not None:
            self._specs.move_to_end(key)
            self._stats["hits"] += 1
            self._spec = spec
        return spec

    def _specialize(self, feeds, build_only=False, take=False):
        """Make the specialization for these feeds current: from the cache, else imported and
        built (evicting the least recently used one beyond max_specializations). take: also take
        a tensor set for a run, atomically with the lookup (returns (spec, set))."""
        if self._caps is not None and not build_only:
            return self._specialize_dynamic(feeds, take)
        key = self._key(feeds)
        with self._lock:
            spec = self._lookup(key)
            if spec is not None:
                return (spec, spec.take()) if take else spec
        with self._build_lock:  # another thread may be building this very key: wait for it
            key = self._key(feeds)
            with self._lock:
                spec = self._lookup(key)
                if spec is not None:
                    return (spec, spec.take()) if take else spec
            spec = self._import(feeds, build_only)
            if spec is None:
                return None
            key = self._key(feeds)  # the import may have found inputs whose values it needs
            with self._lock:
                if self._closed:
                    spec.destroy()
                    raise TypeError("[InferenceSession.run] the session was closed during the run")
                self._stats["builds"] += 1
                self._specs[key] = spec
                self._spec = spec
                self._evict_lru()
                return (spec, spec.take()) if take else spec

    def _specialize_dynamic(self, feeds, take):
        """_specialize with dynamic dimensions: one build for every size up to the capacities,
        redone (compiling nothing new) when a feed outgrows one; a static build per size if the
        model cannot be built with dynamic dimensions."""
        shapes = {a.name: tuple(feeds[a.name].shape) for a in self._input_args}
        sizes = self._caps.sizes(shapes)

        def fits(spec):
            return all(sizes.get(n, 0) <= m for n, m in spec.values.get("__maxes__", {}).items())

        def key():
            vals = tuple(k for k in self._key(feeds) if k[0] in self._value_names)
            return ("dynamic", self._caps.pattern(sizes), vals)

        def cached():
            with self._lock:
                k = key()
                spec = self._specs.get(k)
                if spec is not None and fits(spec):
                    self._lookup(k)
                    return (spec, spec.take()) if take else spec
            return None

        hit = cached()
        if hit is not None:
            return hit
        with self._build_lock:  # another thread may have built it meanwhile
            hit = cached()
            if hit is not None:
                return hit
            self._caps.grow(sizes)
            maxes, ones = self._caps.for_build(sizes)
            try:
                spec = self._import(feeds, False, dynamic=maxes, sizes=sizes, ones=ones)
            except (NotSupportedError, TypeError, DataError) as e:
                # (a malformed model raises its DataError again in the static import below)
                if self._require_dynamic:
                    raise
                # a dynamic dimension reaches an operator that needs a fixed size: one build per
                # size from now on (as without dynamic dimensions)
                self._static_reason = f"{type(e).__name__}: {e}"
                self._caps = None
                self._save_note()  # a later process goes straight to per-size builds
                spec = None
            if spec is None:
                return self._specialize_static_locked(feeds, take)
            spec.values["__maxes__"] = maxes
            with self._lock:
                if self._closed:
                    spec.destroy()
                    raise TypeError("[InferenceSession.run] the session was closed during the run")
                self._stats["builds"] += 1
                old = self._specs.pop(key(), None)
                taken = spec.take() if take else None
                if old is not None:  # outgrown: the bigger build replaces it
                    if taken is not None:
                        # this run's feeds may be the old build's ml-tensor outputs (a decode
                        # loop feeding present back as past): the old build is destroyed when
                        # this run ends (_end_run), not before it reads them
                        old.users += 1
                        self._retiring[id(taken)] = old
                    self._drop(old)
                self._specs[key()] = spec
                self._spec = spec
                self._evict_lru()
                return (spec, taken) if take else spec

    def _specialize_static_locked(self, feeds, take):
        """The static path of _specialize, the build lock already held."""
        spec = self._import(feeds, False)
        k = self._key(feeds)
        with self._lock:
            self._stats["builds"] += 1
            self._specs[k] = spec
            self._spec = spec
            self._evict_lru()
            return (spec, spec.take()) if take else spec

    def _evict_lru(self):
        while len(self._specs) > self.max_specializations:
            _, old = self._specs.popitem(last=False)
            self._drop(old)
            self._stats["evictions"] += 1

    def _drop(self, spec):
        """Evicted or closed (lock held): destroyed now, or by the last run in flight on it."""
        spec.dropped = True
        if spec.users == 0:
            spec.destroy()

    def _end_run(self, spec, tset, keep):
        with self._lock:
            old = self._retiring.pop(id(tset), None)
            if spec.give_back(tset, keep):
                spec.destroy()
            elif spec.users == 0 and spec.retired:
                spec.destroy_retired()
            if old is not None:  # the build this run's rebuild replaced (_specialize_dynamic)
                old.users -= 1
                if old.dropped and old.users == 0:
                    old.destroy()

    def _import(self, feeds, build_only, dynamic=None, sizes=None, ones=None):
        """Import the ONNX model for the feeds' shapes; graph inputs that must be known at load
        (shapes, axes, pads given as inputs) take their value from `feeds` and the graph is
        specialized to it. None when such a value is needed but `build_only` (no values yet).
        dynamic: {dimension name: maximum} of the dynamic dimensions of this build (the inputs
        having one are declared with it instead of the feed's size; an input fed with one of
        them empty keeps the feed's shape, an empty constant); ones: those fixed to 1 in it."""
        while True:
            values = {} if build_only else {
                n: np.array(_host(feeds[n], self._ctx)) for n in self._value_names}
            shapes = {n: tuple(v.shape) for n, v in feeds.items() if n not in self._value_names}
            if dynamic is not None:
                caps = self._caps
                shapes = {n: s for n, s in shapes.items()
                          if n not in caps.axes or any(sizes.get(d) == 0 for _, d in caps.axes[n])}
            key = None
            if self._cache_id is not None:  # built by an earlier process: loaded, not imported
                from .graphcache import sessions

                key = sessions.spec_key(self, shapes, values, dynamic, ones)
                hit = sessions.load_spec(self, key)
                if hit is not None:
                    self._stats["loaded"] += 1
                    return _Specialization(hit[0], hit[1], hit[2], values)
            from .onnx.importer import Importer, NeedsValue, data_errors

            im = Importer(self._model, self._ctx, free_dimensions=self._free, input_shapes=shapes,
                          weights=self._weights, input_values=values, dynamic=dynamic, ones=ones)
            try:
                with data_errors(self._name, im):
                    imp = im.run()
                break
            except NeedsValue as e:
                if e.input_name in self._value_names:
                    raise
                self._value_names.add(e.input_name)
                self._save_note()
                if build_only:
                    return None  # known at the first run
        if self._weights is not None:
            self._weights.release()  # uploaded: the mapped pages leave this process's memory
        if imp.cut is not None:  # data-dependent shapes: the first of a tree of stages (not cached)
            from .stages.plan import Stage

            return _Specialization(None, imp.inputs, [], values, stage=Stage(imp))
        if key is not None:
            sessions.save_spec(self, key, imp.graph, imp.inputs, imp.outputs, values)
        return _Specialization(imp.graph, imp.inputs, imp.outputs, values)

    # -- data-dependent shapes (stages/) ---------------------------------------------------------

    def _next_stage(self, spec, stage, key, cut, values, carried):
        """The stage after `stage` for its step's outcome: cached, else imported from the cut's
        snapshot and built (one build at a time, as for specializations)."""
        from .onnx.importer import Importer, NeedsValue, data_errors
        from .stages.plan import Stage

        def cached():
            with self._lock:
                child = stage.children.get(key)
                if child is not None:
                    stage.children.move_to_end(key)
                    self._stats["stage_hits"] += 1
                return child

        child = cached()
        if child is not None:
            return child
        with self._build_lock:
            child = cached()
            if child is not None:
                return child
            snap = cut.snapshot.with_outcome(cut.key, values, carried)
            im = Importer(self._model, self._ctx, free_dimensions=self._free, weights=self._weights,
                          input_values=spec.values, resume=snap)
            try:
                with data_errors(self._name, im):
                    imp = im.run()
            except NeedsValue as e:
                raise NotSupportedError(f"{e} (here after a data-dependent shape: not supported)") from None
            if self._weights is not None:
                self._weights.release()
            child = Stage(imp)
            with self._lock:
                if self._closed or spec.dropped:
                    child.destroy()
                    raise TypeError("[InferenceSession.run] the session was closed during the run")
                stage.children[key] = child
                self._stats["stage_builds"] += 1
                while len(stage.children) > self.max_specializations:
                    _, old = stage.children.popitem(last=False)
                    spec.retired.append(old)  # destroyed once no run is in flight on spec
                    self._stats["evictions"] += 1
            return child

    def _count_read(self, nbytes):
        with self._lock:
            self._stats["readbacks"] += 1
            self._stats["readback_bytes"] += int(nbytes)

    def _load_tflite(self, model):
        from .onnxio import IOInfo, ONNX_OF_WEBNN, TYPE_STRING

        hit = key = None
        if self._use_cache:  # (mltensor/graphcache/sessions.py)
            from .graphcache import sessions

            self._cache_id = sessions.model_id(model)
            if self._cache_id is not None:
                key = sessions.session_key(self, "tflite")
                hit = sessions.load_spec(self, key)
        if hit is not None:
            graph, inputs, outputs, _ = hit
            self._stats["loaded"] += 1
        else:
            from . import tflite

            graph, ins, outs = tflite.import_model(model, self._ctx, free_dimensions=self._free,
                                                   float16=self._float16)
            inputs = [IOInfo(n, ONNX_OF_WEBNN[dt], dt, s) for n, dt, s in ins]
            outputs = [IOInfo(n, ONNX_OF_WEBNN[dt], dt, s) for n, dt, s in outs]
            if key is not None:
                sessions.save_spec(self, key, graph, inputs, outputs, {})
        # one specialization, the sizes of the file (its inputs are checked against them)
        self._spec = _Specialization(graph, inputs, outputs)
        self._tflite_key = None
        self._specs[None] = self._spec
        self._stats["builds"] += 1
        self._input_args = [NodeArg(i.name, i.shape, TYPE_STRING[i.onnx_type]) for i in inputs]
        self._np_in = {i.name: i.np_dtype for i in inputs}
        self._output_args = [NodeArg(o.name, o.shape, TYPE_STRING[o.onnx_type]) for o in outputs]

    def _describe(self, desc):
        """get_inputs()/get_outputs() from the model's description (onnx/importer.io_description,
        from the proto or the graph cache's note; dims not yet fixed stay symbolic)."""
        from .onnxio import TYPE_STRING, np_dtype

        shapes, params = desc["shapes"], desc["params"]
        self._input_args = []
        self._np_in = {}
        for name, et in desc["inputs"]:
            dims = None if shapes[name] is None else [  # None: declared without a shape
                d if d is not None else (p if p is None or p not in self._free else self._free[p])
                for d, p in zip(shapes[name], params[name])]
            self._input_args.append(NodeArg(name, dims, TYPE_STRING.get(et, f"tensor({et})")))
            self._np_in[name] = np_dtype(et) if et else None
        self._output_args = []
        for name, et, dims in desc["outputs"]:  # a dim: its dim_value (int) or dim_param (str)
            dims = [d if isinstance(d, int) else self._free.get(d, d or None) for d in dims]
            self._output_args.append(NodeArg(name, dims, TYPE_STRING.get(et, "tensor(?)")))

    # -- onnxruntime surface -----------------------------------------------------------------------

    @property
    def context(self):
        """The MLContext the session runs on."""
        return self._ctx

    @property
    def graph(self):
        """The MLGraph of the specialization the last run used (None before one is built); for a
        model with data-dependent shapes, its first stage's graph (mltensor/stages/)."""
        spec = self._spec
        if spec is None:
            return None
        return spec.graph if spec.stage is None else spec.stage.graph

    @property
    def _out_tensors(self):
        """The output tensors of this thread's last run (bench/ binds them directly)."""
        with self._lock:
            return self._spec.last_outputs() if self._spec is not None else {}

    @property
    def specializations(self):
        """How many specializations (one per combination of input sizes) are cached."""
        return len(self._specs)

    @property
    def stats(self):
        """Snapshot: specializations cached, builds, cache hits and LRU evictions so far; whether
        builds use dynamic dimensions, and if not why (None: the model has no unknown sizes)."""
        with self._lock:
            return dict(self._stats, specializations=len(self._specs), dynamic=self._caps is not None,
                        static_reason=self._static_reason)

    def get_inputs(self):
        """The model's inputs, as onnxruntime gives them: objects with `.name`, `.shape` (ints, and
        names or None for unknown dimensions) and `.type` (e.g. "tensor(float)")."""
        return list(self._input_args)

    def get_outputs(self):
        """The model's outputs, as `get_inputs` describes inputs."""
        return list(self._output_args)

    def get_providers(self):
        """["WebNNExecutionProvider"] (onnxruntime compatibility)."""
        return ["WebNNExecutionProvider"]

    def run(self, output_names, input_feed, run_options=None, *, output_location="cpu"):
        """Run the model. output_names None -> all outputs, in model order. Feeds: numpy arrays
        (uploaded once) or MLTensors (bound as is). Returns numpy arrays, or MLTensors with
        output_location="ml-tensor" (the session's own tensors; this thread's next run
        overwrites them). Safe to call from several threads at once."""
        names, outs, spec, tset = self._enqueue(output_names, input_feed, output_location)
        keep = output_location == "ml-tensor"
        try:
            if keep:
                return outs
            res = _read_all(self._ctx, outs, "InferenceSession.run")
            return [self._to_onnx(spec, n, r) for n, r in zip(names, res)]
        finally:
            self._end_run(spec, tset, keep)

    async def run_async(self, output_names, input_feed, run_options=None, *, output_location="cpu"):
        """The awaitable form of `run` (same arguments); several may be in flight at once."""
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

    def close(self):
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

    def __del__(self):
        try:
            if self._ctx._lost_info is None:
                self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the run path ------------------------------------------------------------------------------

    def _check_feeds(self, input_feed):
        where = "InferenceSession.run"
        if not isinstance(input_feed, dict):
            raise TypeError(f"[{where}] feeds must be a dict of input name -> numpy array or MLTensor")
        known = [a.name for a in self._input_args]
        for name in input_feed:
            if name not in self._np_in:
                raise TypeError(f"[{where}] unknown input {name!r}; the model's inputs are {known}")
        missing = [n for n in known if n not in input_feed]
        if missing:
            raise TypeError(f"[{where}] missing input(s) {missing}; the model's inputs are {known}")
        for a in self._input_args:
            v = input_feed[a.name]
            if a.shape is None:  # declared without a shape: any rank
                continue
            if not isinstance(v, MLTensor) and not isinstance(v, np.ndarray):
                v = np.asarray(v)
            if len(v.shape) != len(a.shape) or any(
                    isinstance(d, int) and d != g for d, g in zip(a.shape, v.shape)):
                got = f"an MLTensor {v.data_type} {list(v.shape)}" if isinstance(v, MLTensor) else list(v.shape)
                raise TypeError(f"[{where}] input {a.name!r} must have shape {a.shape}, got {got}")

    def _enqueue(self, output_names, input_feed, output_location):
        where = "InferenceSession.run"
        if self._closed:
            raise TypeError(f"[{where}] the session is closed")
        if output_location not in ("cpu", "ml-tensor"):
            raise TypeError(f"[{where}] output_location must be 'cpu' or 'ml-tensor', got {output_location!r}")
        self._check_feeds(input_feed)
        if self._kind == "onnx":
            spec, tset = self._specialize(input_feed, take=True)
        else:
            with self._lock:
                if self._closed:
                    raise TypeError(f"[{where}] the session is closed")
                spec = self._specs[None]
                tset = spec.take()
        try:
            names, result = self._bind_and_dispatch(spec, tset, output_names, input_feed, output_location)
        except BaseException:
            self._end_run(spec, tset, False)
            raise
        return names, result, spec, tset

    def _bind_and_dispatch(self, spec, tset, output_names, input_feed, output_location):
        """Upload the numpy feeds into the set's input tensors and dispatch into its outputs."""
        where = "InferenceSession.run"
        ctx = self._ctx
        bind = {}
        uploads = []
        plan = spec.graph._dyn if spec.graph is not None else None
        if plan is not None:  # sizes within the build's maxima, one size per name, deferred checks
            plan.bind({n: tuple(input_feed[n].shape) for n in spec.inputs}, where)
        for name, info in spec.inputs.items():
            v = input_feed[name]
            if isinstance(v, MLTensor):
                if v._context is not ctx:
                    raise TypeError(f"[{where}] input {name!r}: the MLTensor belongs to another MLContext")
                if v.data_type != info.data_type or (plan is None and tuple(v.shape) != info.shape):
                    raise TypeError(
                        f"[{where}] input {name!r} must be {info.data_type} {list(info.shape)}, "
                        f"got an MLTensor {v.data_type} {list(v.shape)}"
                    )
                bind[name] = v
                continue
            arr = v if isinstance(v, np.ndarray) else np.asarray(v)
            want = info.np_dtype
            if arr.dtype != want:
                raise TypeError(
                    f"[{where}] input {name!r} must have dtype {want} ({_type_str(info)}), got {arr.dtype}"
                )
            if plan is None and tuple(arr.shape) != info.shape:
                raise TypeError(
                    f"[{where}] input {name!r} must have shape {list(info.shape)}, got {list(arr.shape)}"
                )
            store = dtypes.NUMPY[info.data_type]
            if arr.dtype != store:
                arr = arr.view(np.uint8) if arr.dtype == np.bool_ else arr.astype(store)
            t = tset.inputs.get(name)
            if t is None:  # resizable when the shape has dynamic dimensions
                t = ctx.create_tensor_sync(data_type=info.data_type, shape=info.shape, writable=True)
                tset.inputs[name] = t
            if plan is not None:
                t._fit(arr.shape, where, f"input {name!r}")
            uploads.append((t, arr))
            bind[name] = t
        known = list(spec.outputs) if spec.stage is None else [o.name for o in self._output_args]
        if output_names is None:
            names = known
        else:
            names = list(output_names)
            for n in names:
                if n not in known:
                    raise TypeError(f"[{where}] unknown output {n!r}; the model's outputs are {known}")
        for t, arr in uploads:
            ctx.write_tensor(t, arr)
        if spec.stage is not None:  # data-dependent shapes: a chain of graphs (stages/plan.py)
            from .stages import plan

            return names, plan.run(self, spec, tset, bind, names, output_location)
        graph = spec.graph
        if graph is not None:
            outs = {}
            fed = {id(t) for t in bind.values()}
            for n, (dt, shape) in graph.output_descriptors.items():
                t = tset.outputs.get(n)
                if t is not None and id(t) in fed:
                    # this output of an earlier run is fed back in (a decode loop): write into
                    # a second tensor, kept as well, so the two alternate without allocating
                    t, tset.spare[n] = tset.spare.get(n), t
                if t is None:
                    t = ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True)
                tset.outputs[n] = t
                outs[n] = t
            ins = {n: bind[n] for n in graph.input_descriptors}
            ctx.dispatch(graph, ins, outs)
        result = []
        for n in names:
            info = spec.outputs[n]
            if info.const is None:
                result.append(tset.outputs[n])
            elif output_location == "ml-tensor":
                result.append(self._const_tensor(spec, n, info))
            else:
                result.append(info.const.copy())
        return names, result

    def _const_tensor(self, spec, name, info):
        with self._lock:
            t = spec.const_tensors.get(name)
            if t is None:
                data = np.ascontiguousarray(info.const)
                store = dtypes.NUMPY[info.data_type]
                data = data.view(np.uint8) if data.dtype == np.bool_ else data.astype(store)
                t = self._ctx.create_tensor_sync(data_type=info.data_type, shape=info.shape or (),
                                                 readable=True, writable=True)
                self._ctx.write_tensor(t, data)
                spec.const_tensors[name] = t
            return t

    def _to_onnx(self, spec, name, arr):
        if spec.stage is not None:  # converted by stages/plan.run
            return arr
        info = spec.outputs[name]
        want = info.np_dtype
        if arr.dtype == want:
            return arr
        if want == np.bool_:
            return arr.view(np.bool_)
        return arr.astype(want)


def _read_all(ctx, values, where):
    """Read every MLTensor in `values` (numpy values pass through): all reads are started before
    any is waited on, so one submit serves them all; one host copy each."""
    ctx._check(where)
    started = [ctx._start_read(v, where=where, sync=True) if isinstance(v, MLTensor) else None for v in values]
    return [v if r is None else r.wait_sync(where) for r, v in zip(started, values)]


class _Shaped:
    """Stands for a feed of a given shape (the sizes known at creation)."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def _host(v, ctx):
    if isinstance(v, MLTensor):
        return ctx.read_tensor_sync(v)
    return np.asarray(v)


def _type_str(info):
    from .onnxio import TYPE_STRING

    return TYPE_STRING.get(info.onnx_type, "?")
