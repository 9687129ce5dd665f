"""ONNX model -> MLGraphBuilder calls.

Load (path, bytes or ModelProto; big weights stay in the file and are read in place, see
weights.py), fix symbolic dimensions, run ONNX shape
inference (for value types), then walk the nodes in order:
- a node whose inputs are all known on the host (initializers, Constant, results of folded nodes,
  and shapes of operands, which are static) is folded with numpy through onnx.reference;
- otherwise its handler in ops/ (one module per family) maps it onto builder calls,
  decomposing where WebNN has no single operator;
- an op without a handler that ONNX defines as a function is expanded into its function body;
- anything else fails here, at load, naming the node, op type, opset and the supported ops.

Values live in `env`: a numpy array (host constant) or an MLOperand. ONNX types WebNN lacks are
mapped at the edges: double -> float32, bool -> uint8, int16/uint16 -> int32/uint32; `Imported`
remembers the ONNX types so InferenceSession can convert feeds and results back.
"""

import contextlib
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..dynamic.dims import MLDynamicDimension, Sym
from ..errors import DataError, DOMException, NotSupportedError
from ..front.builder import MLGraphBuilder, MLOperand
from ..onnxio import IOInfo, ONNX_OF_WEBNN, TYPE_STRING, dim_name, source_name  # noqa: F401 (re-exported)
from ..stages import cut as stages_cut
from . import symbolic


class UnsupportedError(NotSupportedError):
    """A node, attribute, data type or model feature this importer cannot map onto WebNN."""


class NeedsValue(UnsupportedError):
    """A graph input is used where a value known at load is required (a shape, axes, pads...).
    InferenceSession handles it by binding the input's value at the first run."""

    def __init__(self, name, what):
        super().__init__(f"[onnx] graph input {name!r} is used as {what}, which must be known at load "
                         "(make it an initializer, or run through InferenceSession, which binds it "
                         "at the first run)")
        self.input_name = name


class FeedError(TypeError):
    """The sizes asked for do not fit the model's inputs (a caller's error, unlike a TypeError
    from a corrupt model, which becomes DataError)."""


class _Unsupported(Exception):
    """Raised by handlers; wrapped into UnsupportedError with the node's identity."""


# ONNX element type -> WebNN data type of the operand that carries it.
WEBNN_TYPE = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float32",
    TensorProto.INT32: "int32",
    TensorProto.UINT32: "uint32",
    TensorProto.INT64: "int64",
    TensorProto.UINT64: "uint64",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "uint8",
    TensorProto.INT16: "int32",
    TensorProto.UINT16: "uint32",
}
_NP_TO_STORAGE = {
    np.dtype(np.float64): np.float32, np.dtype(np.bool_): np.uint8,
    np.dtype(np.int16): np.int32, np.dtype(np.uint16): np.uint32,
}
# Ops never folded at load: their value is not a function of their inputs.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                 "Multinomial", "Bernoulli"}


def onnx_type_of_np(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def storage_array(a):
    """A host constant in the dtype of the WebNN operand that carries its ONNX type."""
    a = np.asarray(a)
    to = _NP_TO_STORAGE.get(a.dtype)
    if to is not None:
        a = a.astype(to)
    return a


# Host arrays the importer may create at load (folded constants, expanded shapes): a corrupt
# dimension must fail cleanly, not allocate gigabytes (2**28 elements = 1 GiB of float32).
MAX_HOST_ELEMENTS = 1 << 28


def load_model(source, name=None):
    """(ModelProto, Weights or None) from a path, bytes or a ModelProto. For a path or bytes the
    big initializers stay in the file (or the caller's buffer) and are read in place
    (onnx/weights.py); external data files are mapped, not loaded. A file or buffer that is not
    a well-formed ONNX ModelProto raises DataError naming it (`name`, else source_name)."""
    from . import weights as W

    if isinstance(source, onnx.ModelProto):
        return source, None
    if not isinstance(source, (bytes, bytearray, memoryview, str, os.PathLike)):
        raise TypeError(f"[onnx] model must be a path, bytes or onnx.ModelProto, got {type(source).__name__}")
    name = name or source_name(source)
    try:
        model, weights = W.load(source, name)
    except OSError:
        raise
    except Exception as e:
        raise DataError(f"[onnx] {name}: not a well-formed ONNX model (the ModelProto protobuf does not "
                        f"parse: {type(e).__name__}: {e})") from None
    if not model.HasField("graph"):
        raise DataError(f"[onnx] {name}: the ModelProto has no graph (field 'graph' is missing)")
    for t in model.graph.initializer:  # external data files: there, and big enough (mapped, not read)
        if t.data_location == TensorProto.EXTERNAL and weights.base_dir is not None:
            try:
                _external_view(weights, t)
            except DataError:
                raise
            except Exception as e:
                raise DataError(f"[onnx] {name}: external data cannot be loaded ({type(e).__name__}: {e})") from None
    return model, weights


# ONNX element types read in place from a model file (numpy's own little-endian types); the
# others (bfloat16, float8, int4, strings) are converted by numpy_helper from a copy.
_IN_PLACE = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT8,
             TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32,
             TensorProto.INT64, TensorProto.UINT64, TensorProto.BOOL}


def _external_view(weights, t):
    """The read-only numpy view of an initializer whose data lies in the model file or an
    external data file (onnx/weights.py), converted through numpy_helper for element types
    numpy cannot view; None if its file is not one Weights maps."""
    import sys

    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise DataError(f"[onnx] tensor {t.name!r}: external data offset/length are not integers") from None
    dims = list(t.dims)
    if any(d < 0 for d in dims) or _count(dims) > MAX_HOST_ELEMENTS:
        raise DataError(f"[onnx] tensor {t.name!r}: field 'dims' {dims} is not a valid shape")
    view = weights.raw(location, offset, length)
    if view is None:
        return None
    if t.data_type in _IN_PLACE and sys.byteorder == "little":
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        if len(view) != _count(dims) * dt.itemsize:
            raise DataError(f"[onnx] tensor {t.name!r} ({TensorProto.DataType.Name(t.data_type)} {dims}): "
                            f"its data does not match its type and shape ({len(view)} bytes)")
        return np.frombuffer(view, dtype=dt).reshape(dims)
    copy = TensorProto()
    copy.CopyFrom(t)
    del copy.external_data[:]
    copy.data_location = TensorProto.DEFAULT
    copy.raw_data = bytes(view)
    return numpy_helper.to_array(copy)


@contextlib.contextmanager
def data_errors(name, importer=None):
    """Anything but the documented errors raised while reading a model (a corrupt field makes
    onnx, numpy or the builder raise IndexError, KeyError, ValueError...) becomes a DataError
    naming the model, and the node being imported if any."""
    try:
        yield
    except DataError as e:
        if name in str(e):
            raise
        msg = str(e).removeprefix("[onnx] ")
        raise DataError(f"[onnx] {name}: {msg}") from None
    except (DOMException, FeedError, OSError):
        raise
    except RecursionError:
        raise DataError(f"[onnx] {name}: the model nests too deeply to be read") from None
    except Exception as e:
        node = getattr(importer, "node", None)
        where = ""
        if node is not None:
            where = f" node {node.name or '(unnamed)'!r} ({node.op_type}):"
        raise DataError(f"[onnx] {name}:{where} malformed model ({type(e).__name__}: {e})") from e


class Imported:
    """Result of an import: the built graph (None when every output folded to a constant) and
    the graph's inputs and outputs with their ONNX and WebNN types. `cut`: None, or the StageCut
    that ended this import early (a stage of a data-dependent model; no outputs then)."""

    def __init__(self, graph, inputs, outputs, opset):
        self.graph, self.inputs, self.outputs, self.opset = graph, inputs, outputs, opset
        self.cut = None


class StageCut:
    """Where a stage ends (mltensor/stages/): resume from `snapshot` once the step ran; the step
    reads back the run's tensors `reads` or runs `loop` (stages.loop.LoopSpec) on `carried`."""

    __slots__ = ("snapshot", "key", "reads", "carried", "loop", "what", "counted", "dynamic_ok")

    def __init__(self, snapshot, key, reads, carried, loop, what, counted=None):
        self.snapshot, self.key, self.reads, self.carried = snapshot, key, reads, carried
        self.loop, self.what = loop, what
        # (carried position, axis) of a count read back (stages/cut.py); dynamic_ok: whether the
        # rest builds with it as a dynamic dimension (None: not tried yet)
        self.counted, self.dynamic_ok = counted, None


def symbolic_inputs(model):
    """{input name: [dim or None ...]} of the model's real inputs (initializers excluded), with
    the dim_param names: returns (shapes, params) where params[name][i] is the symbol or None.
    An input declared without a shape (any rank) has shapes[name] = params[name] = None."""
    inits = {i.name for i in model.graph.initializer}
    shapes, params = {}, {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            shapes[vi.name] = params[vi.name] = None
            continue
        dims, syms = [], []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(d.dim_value)
                syms.append(None)
            else:
                dims.append(None)
                syms.append(d.dim_param or None)
        shapes[vi.name] = dims
        params[vi.name] = syms
    return shapes, params


def check_io_names(g):
    """The graph's inputs and outputs are named by non-empty text (a name that is not UTF-8 comes
    out of protobuf as bytes; nothing could feed or fetch it)."""
    for what, vals in (("input", g.input), ("output", g.output)):
        for vi in vals:
            if not isinstance(vi.name, str) or not vi.name:
                raise DataError(f"[onnx] graph: a graph {what} has an invalid name {vi.name!r}")


def io_description(model):
    """What InferenceSession describes the model by, as plain data (JSON, for the graph cache's
    note: session/cache.py): {"shapes", "params"} of symbolic_inputs, "inputs": [name, ONNX
    element type] of those inputs in model order, "outputs": [name, element type, dims], a dim
    being its dim_value (int) or its dim_param (str, "" when it has neither)."""
    check_io_names(model.graph)
    shapes, params = symbolic_inputs(model)
    inputs = [[vi.name, vi.type.tensor_type.elem_type] for vi in model.graph.input if vi.name in shapes]
    outputs = []
    for vo in model.graph.output:
        tt = vo.type.tensor_type
        outputs.append([vo.name, tt.elem_type,
                        [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]])
    return {"shapes": shapes, "params": params, "inputs": inputs, "outputs": outputs}


class Importer:
    def __init__(self, model, context, *, free_dimensions=None, input_shapes=None, weights=None,
                 input_values=None, dynamic=None, ones=None, resume=None):
        self.ctx = context
        # Data-dependent shapes (mltensor/stages/): `resume` is the stages.cut.Snapshot this
        # import continues from (a later stage); cut_refusal says why this import may not be cut
        # (None: it may); resumed: {cut key: (values, operands)} of the cuts already passed;
        # avail_of: id(input operand) -> the name of the run's tensor it is bound to
        self.resume = resume
        self.cut_refusal = "in a build with dynamic dimensions" if dynamic else None
        self.resumed = {}
        self.avail_of = {}
        self.stage_inputs = set()  # ids of the inputs a resumed import binds to earlier stages' tensors
        self.values_bindable = True  # graph inputs may be bound by value (NeedsValue); not in a loop body
        self._top_index = None  # the top-level node being imported (cuts are keyed by it)
        self._cut_seq = 0
        # {dimension name (dim_name): max size}: unknown input dimensions that become dynamic
        # dimensions (mltensor/dynamic/) instead of taking a size from input_shapes; `ones`:
        # {name: 1} of unknown dimensions fixed to 1 (InferenceSession's builds, capacity.py)
        self.dynamic = dict(dynamic or {})
        self.ones = dict(ones or {})
        self.dim_refs = {}  # dynamic dimension name -> an input operand that has it
        self.input_values = dict(input_values or {})
        self.weights = weights  # onnx/weights.Weights: where big initializers are read in place
        self.free = dict(free_dimensions or {})
        self.input_shapes = dict(input_shapes or {})
        self.model = model
        self.opset = self._default_opset(model)
        self.cur_opset = self.opset
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.env = {}
        self.types = {}  # value name -> ONNX element type
        self.bools = set()  # id() of operands that carry ONNX bool
        self._consts = {}  # id(array) -> (array, operand)
        self._uid = 0
        self.node = None

    @staticmethod
    def _default_opset(model):
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                return o.version
        return 1 if not model.opset_import else onnx.defs.onnx_opset_version()

    # -- errors --------------------------------------------------------------------------------

    def fail(self, reason, node=None):
        from .ops import supported_ops

        node = node or self.node
        if node is not None:
            dom = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
            where = f"node {node.name or '(unnamed)'!r} ({dom}{node.op_type}, opset {self.cur_opset})"
        else:
            where = f"model (opset {self.opset})"
        raise UnsupportedError(
            f"[onnx] {where}: {reason}. Supported ONNX ops: {', '.join(supported_ops())}"
        )

    def malformed(self, reason, node=None):
        """A model that breaks ONNX's rules (not a feature we lack): DataError."""
        node = node or self.node
        where = f"node {node.name or '(unnamed)'!r} ({node.op_type})" if node is not None else "graph"
        raise DataError(f"[onnx] {where}: {reason}")

    # -- values --------------------------------------------------------------------------------

    def is_const(self, v):
        return isinstance(v, np.ndarray)

    def operand(self, v, like=None):
        """MLOperand for a value (host constants become builder constants, cached; sizes holding
        dynamic dimensions are computed at dispatch, see materialize)."""
        if v is None or isinstance(v, MLOperand):
            return v
        if symbolic.is_symbolic(v):
            return self.materialize(v, like)
        a = np.asarray(v)
        hit = self._consts.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        if like is not None and a.dtype.kind == "f" and like.data_type in ("float32", "float16"):
            a = a.astype(like.data_type, copy=False)
        s = storage_array(a)
        # not np.ascontiguousarray: it turns a 0-d array into shape [1] (a scalar index would
        # then keep its axis in Gather, a scalar would broadcast as rank 1)
        # (no copy: the importer never changes a host array once made, and weights read in place
        # from the model file are read-only: onnx/weights.py)
        op = self.b._constant_nocopy(s if s.flags.c_contiguous else np.array(s, order="C"))
        if a.dtype == np.bool_:
            self.bools.add(id(op))
        self._consts[id(v)] = (v, op)
        return op

    def ref(self, size):
        """An input operand whose dimensions a size (a Sym) reads: the anchor of the internal
        operators that turn sizes into tensors (ops/sizes.py)."""
        for n in sorted(size.names()):
            if n in self.dim_refs:
                return self.dim_refs[n]
        raise NotSupportedError(f"[onnx] size {size} reads no input's dimension")

    def materialize(self, arr, like=None):
        """An operand holding a host array of sizes some of which are Syms: constants for the
        known entries, `_size` tensors (written at dispatch) for the others, concatenated."""
        dt = like.data_type if like is not None and like.data_type in ("float32", "int32") else "int64"
        b = self.b
        parts = []
        for x in arr.reshape(-1):
            if isinstance(x, Sym):
                parts.append(b.reshape(b._size(self.ref(x), x, dt), [1]))
            else:
                parts.append(b.constant(np.array([x], dtype=np.float32 if dt == "float32" else dt)))
        flat = parts[0] if len(parts) == 1 else b.concat(parts, 0)
        return b.reshape(flat, list(arr.shape))

    def np_const(self, a, dtype):
        return np.asarray(a, dtype=dtype)

    def onnx_type(self, v, name=None):
        if name is not None and name in self.types:
            return self.types[name]
        if symbolic.is_symbolic(v):
            return TensorProto.INT64
        if isinstance(v, np.ndarray):
            return onnx_type_of_np(v.dtype)
        if id(v) in self.bools:
            return TensorProto.BOOL
        return ONNX_OF_WEBNN[v.data_type]

    def shape(self, v):
        return tuple(v.shape)

    # -- load ----------------------------------------------------------------------------------

    def run(self, *, const_outputs_as_ops=False):
        m = self.model
        g = m.graph
        for o in m.opset_import:
            if o.domain not in ("", "ai.onnx", CONTRIB) and not any(f.domain == o.domain for f in m.functions):
                used = any(n.domain == o.domain for n in g.node)
                if used:
                    self.fail(f"operator domain {o.domain!r} is not supported (only the default ONNX "
                              f"domain and onnxruntime's {CONTRIB!r})")
        self.b = MLGraphBuilder(self.ctx)
        if self.weights is not None:
            self.b._release_host = self.weights.release

        self.graph_outputs = {o.name for o in g.output}
        if self.resume is not None:  # a later stage: the environment at the cut (stages/cut.py)
            inputs = stages_cut.restore(self, self.resume)
            return self._run_top(inputs, const_outputs_as_ops)
        for init in g.initializer:
            arr = self._tensor(init)
            self.env[init.name] = arr
            self.types[init.name] = init.data_type
        for sp in g.sparse_initializer:
            self.fail("sparse initializers are not supported")

        check_io_names(g)
        shapes, params = symbolic_inputs(m)
        inputs = []
        for vi in g.input:
            if vi.name in self.env:
                continue
            if vi.name in self.input_values:
                arr = np.asarray(self.input_values[vi.name])
                self.env[vi.name] = arr
                self.types[vi.name] = onnx_type_of_np(arr.dtype)
                continue
            if not vi.type.HasField("tensor_type"):
                self.fail(f"input {vi.name!r} is not a tensor (sequences, maps and optionals are not supported)")
            et = vi.type.tensor_type.elem_type
            if et not in WEBNN_TYPE:
                self.fail(f"input {vi.name!r} has unsupported element type {TensorProto.DataType.Name(et)}")
            dims = self._fix_dims(vi.name, shapes[vi.name], params[vi.name])
            if any(d == 0 for d in dims if isinstance(d, int)):
                # WebNN has no zero-sized tensors; an empty input has no data: a constant
                self.env[vi.name] = np.zeros(dims, dtype=helper.tensor_dtype_to_np_dtype(et))
                self.types[vi.name] = et
                continue
            x = self.b.input(vi.name, data_type=WEBNN_TYPE[et], shape=dims)
            self.avail_of[id(x)] = vi.name
            for d in dims:
                if isinstance(d, MLDynamicDimension):
                    self.dim_refs.setdefault(d.name, x)
            if et == TensorProto.BOOL:
                self.bools.add(id(x))
            self.env[vi.name] = x
            self.types[vi.name] = et
            inputs.append(IOInfo(vi.name, et, WEBNN_TYPE[et], dims))

        self._value_types()
        return self._run_top(inputs, const_outputs_as_ops)

    def _run_top(self, inputs, const_outputs_as_ops):
        """The top-level nodes (from the cut a resumed import continues at), then the outputs.
        A cut (stages/cut.py) ends the import at its node: the result is that stage's graph."""
        g = self.model.graph
        try:
            self.run_nodes(g.node, self.opset, fold_batchnorm=True, top=True)
        except stages_cut.Cut as c:
            i, uid, folded = self._top_state
            outputs, snap, reads, carried = stages_cut.end_stage(self, c, g.node, i, uid, folded)
            graph = self.b.build_sync(outputs) if outputs else None
            imp = Imported(graph, inputs, [], self.opset)
            imp.cut = StageCut(snap, c.key, reads, carried, c.loop, c.what, c.counted)
            return imp

        outputs, named = [], {}
        seen = {}
        for vo in g.output:
            v = self.env.get(vo.name)
            if v is None:
                self.malformed(f"graph output {vo.name!r} is not produced by any node")
            et = vo.type.tensor_type.elem_type if vo.type.HasField("tensor_type") else 0
            if not et:
                et = self.onnx_type(v, vo.name)
            if et not in WEBNN_TYPE:
                self.fail(f"output {vo.name!r} has unsupported element type {TensorProto.DataType.Name(et)}")
            if isinstance(v, np.ndarray):
                want = helper.tensor_dtype_to_np_dtype(et)
                if not const_outputs_as_ops:
                    outputs.append(IOInfo(vo.name, et, WEBNN_TYPE[et], v.shape, const=v.astype(want)))
                    continue
                if 0 in v.shape:
                    self.fail(f"output {vo.name!r} is empty (WebNN has no zero-sized tensors; "
                              "InferenceSession returns it from the host)")
                v = self.b.identity(self.operand(v.astype(want)))
            elif v._kind != "op" or id(v) in seen:
                v = self.b.identity(v)
            seen[id(v)] = True
            if WEBNN_TYPE[et] != v.data_type:
                v = self.b.cast(v, WEBNN_TYPE[et])
            named[vo.name] = v
            outputs.append(IOInfo(vo.name, et, v.data_type, v.shape))
        graph = self.b.build_sync(named) if named else None
        return Imported(graph, inputs, outputs, self.opset)

    def _fix_dims(self, name, dims, syms):
        if name in self.input_shapes:
            given = tuple(int(d) for d in self.input_shapes[name])
            if dims is None:  # declared without a shape: any rank
                return given
            if len(given) != len(dims) or any(d is not None and d != g for d, g in zip(dims, given)):
                raise FeedError(f"[onnx] input {name!r} expects shape {dims}, got {list(given)}")
            return given
        if dims is None:
            raise FeedError(f"[onnx] input {name!r} is declared without a shape: run it through "
                            "InferenceSession, whose feeds give it one")
        out = []
        for i, (d, s) in enumerate(zip(dims, syms)):
            n = dim_name(name, i, s if s is None or list(syms).count(s) == 1 else None)
            if d is None and n in self.dynamic:
                d = MLDynamicDimension(n, self.dynamic[n])
            elif d is None and n in self.ones:
                d = 1
            elif d is None:
                if s is not None and s in self.free:
                    d = int(self.free[s])
                else:
                    what = f"symbolic dimension {s!r}" if s else f"dimension {i} (unnamed, unknown)"
                    hint = f"free_dimensions={{{s!r}: N}}" if s else "a feed of the input's shape"
                    raise FeedError(f"[onnx] {what} of input {name!r} must be fixed at session creation: pass {hint}")
            out.append(d)
        return tuple(out)

    def _value_types(self):
        """Element types of intermediate values from ONNX shape inference (best effort)."""
        g = self.model.graph
        try:
            if not g.node:
                return
            # a weightless copy: types and shapes only (never duplicate the weights)
            m = onnx.ModelProto()
            m.ir_version = self.model.ir_version
            m.opset_import.extend(self.model.opset_import)
            m.functions.extend(self.model.functions)
            mg = m.graph
            mg.node.extend(g.node)
            mg.output.extend(g.output)
            mg.value_info.extend(g.value_info)
            for init in g.initializer:
                mg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
            inits = {i.name for i in g.initializer}
            for vi in g.input:
                if vi.name in inits:
                    continue
                vi2 = mg.input.add()
                vi2.CopyFrom(vi)
                x = self.env[vi.name]
                tt = vi2.type.tensor_type
                del tt.shape.dim[:]
                for d in x.shape:
                    if isinstance(d, Sym):
                        tt.shape.dim.add().dim_param = str(d)
                    else:
                        tt.shape.dim.add().dim_value = d
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
            for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
                et = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
                if et:
                    self.types.setdefault(vi.name, et)
        except Exception:
            for vi in list(g.value_info) + list(g.output):
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                    self.types.setdefault(vi.name, vi.type.tensor_type.elem_type)

    def _batchnorm_partners(self, nodes):
        """Conv output name -> (the inference BatchNormalization that is its only consumer, its
        index in `nodes`)."""
        uses = {}
        for n in nodes:
            for i in n.input:
                uses[i] = uses.get(i, 0) + 1
        outs = self.graph_outputs
        partners = {}
        for j, n in enumerate(nodes):
            if n.op_type != "BatchNormalization" or n.domain not in ("", "ai.onnx") or len(n.input) < 5:
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if (attrs.get("training_mode", 0) or attrs.get("spatial", 1) != 1
                    or len([o for o in n.output if o]) != 1):
                continue
            if uses.get(n.input[0]) == 1 and n.input[0] not in outs:
                partners[n.input[0]] = (n, j)
        return partners

    def _fold_batchnorm(self, conv, bn):
        """A Conv with the BatchNormalization after it folded in (W' = W*s, B' = (B - mean)*s + beta,
        s = gamma/sqrt(var + eps)), as onnxruntime does, when all of them are constants by now;
        else None. One kernel instead of two, and the conv's epilogue can then also take the
        residual add and activation that usually follow."""

        def const(name):
            v = self.env.get(name) if name else None
            return v if isinstance(v, np.ndarray) and v.dtype.kind == "f" else None

        w = const(conv.input[1]) if len(conv.input) > 1 else None
        has_b = len(conv.input) > 2 and bool(conv.input[2])
        b = const(conv.input[2]) if has_b else None
        params = [const(i) for i in bn.input[1:5]]
        if w is None or (has_b and b is None) or any(v is None for v in params):
            return None
        gamma, beta, mean, var = params
        oc = w.shape[0]
        if any(v.shape != (oc,) for v in params):
            return None
        eps = next((helper.get_attribute_value(a) for a in bn.attribute if a.name == "epsilon"), 1e-5)
        s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        w2 = (w.astype(np.float64) * s.reshape((oc,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b0 = b.astype(np.float64) if b is not None else 0.0
        b2 = ((b0 - mean.astype(np.float64)) * s + beta.astype(np.float64)).astype(w.dtype)
        wn, bn_name = f"{bn.output[0]}/folded_W", f"{bn.output[0]}/folded_B"
        self.env[wn], self.env[bn_name] = w2, b2
        self.types[wn] = self.types[bn_name] = helper.np_dtype_to_tensor_dtype(w.dtype)
        fused = helper.make_node("Conv", [conv.input[0], wn, bn_name], [bn.output[0]], name=conv.name)
        fused.attribute.extend(conv.attribute)
        return fused

    def _tensor(self, t):
        if t.data_location == TensorProto.EXTERNAL and self.weights is not None:
            a = _external_view(self.weights, t)
            if a is not None:
                return a
        dims = list(t.dims)
        if any(d < 0 for d in dims) or _count(dims) > MAX_HOST_ELEMENTS:
            raise DataError(f"[onnx] tensor {t.name!r}: field 'dims' {dims} is not a valid shape")
        if t.data_type not in WEBNN_TYPE and t.data_type != TensorProto.STRING:
            try:
                TensorProto.DataType.Name(t.data_type)
            except ValueError:
                raise DataError(f"[onnx] tensor {t.name!r}: field 'data_type' {t.data_type} is not an "
                                "ONNX element type") from None
        try:
            return numpy_helper.to_array(t)
        except Exception as e:
            raise DataError(f"[onnx] tensor {t.name!r} ({TensorProto.DataType.Name(t.data_type)} {dims}): "
                            f"its data does not match its type and shape ({e})") from None

    # -- nodes ---------------------------------------------------------------------------------

    def run_nodes(self, nodes, opset, fold_batchnorm=False, top=False):
        """top: the graph's own nodes (a resumed import starts at its cut, and cuts are keyed by
        the node being imported, stages/cut.py)."""
        from .ops import HANDLERS

        saved = self.cur_opset
        # Only at the top level: inside a function body a value may also be used outside it.
        partners = self._batchnorm_partners(nodes) if fold_batchnorm else {}
        # BatchNormalization nodes (indices) already folded into their Conv
        folded = set(self.resume.folded) if top and self.resume is not None else set()
        start = self.resume.index if top and self.resume is not None else 0
        for i in range(start, len(nodes)):
            node = nodes[i]
            if i in folded:
                continue
            if top:
                self._top_index, self._cut_seq = i, 0
                self._top_state = (i, self._uid, frozenset(folded))
            bn = partners.get(node.output[0]) if node.op_type == "Conv" and node.output else None
            if bn is not None:
                fused = self._fold_batchnorm(node, bn[0])
                if fused is not None:
                    folded.add(bn[1])
                    node = fused
            self.cur_opset = opset
            self.node = node
            key = handler_key(node)
            fn = (self.domain_function(node) or (None,))[0]
            if fn is None and key is None:
                self.fail(f"operator domain {node.domain!r} is not supported")
            ins = []
            for name in node.input:
                if not name:
                    ins.append(None)
                    continue
                if name not in self.env:
                    self.malformed(f"input {name!r} is not produced by any earlier node or graph input")
                ins.append(self.env[name])
            if fn is not None:
                self.expand_function(node, fn, ins)
                continue
            # (the node a resumed import starts at was not folded the first time, and its
            # dropped inputs are None now: stages/cut.py)
            resumed = top and self.resume is not None and i == self.resume.index
            if not resumed and (self._try_fold(node, ins) or self._empty_result(node, ins)):
                continue
            h = HANDLERS.get(key)
            if h is None:
                if self.expand_schema_function(node, ins):
                    continue
                self.fail("operator is not supported")
            attrs = self.attrs(node, h)
            try:
                outs = h.fn(self, node, ins, attrs)
            except _Unsupported as e:
                self.fail(str(e))
            except (TypeError, ValueError) as e:
                self.fail(f"cannot be mapped onto WebNN ({e})")
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            self._bind(node, outs)
        if top:
            self._top_index = None
        self.cur_opset = saved

    def _bind(self, node, outs):
        for name, v in zip(node.output, outs):
            if not name or v is None:
                continue
            if isinstance(v, np.ndarray) or np.isscalar(v):
                v = np.asarray(v)
            self.env[name] = v
            if symbolic.is_symbolic(v):  # sizes holding dynamic dimensions: ONNX's int64 shapes
                self.types[name] = TensorProto.INT64
            elif isinstance(v, np.ndarray):
                self.types[name] = onnx_type_of_np(v.dtype)
            elif id(v) in self.bools:
                self.types[name] = TensorProto.BOOL
            elif name not in self.types or WEBNN_TYPE.get(self.types[name]) != v.data_type:
                self.types[name] = ONNX_OF_WEBNN[v.data_type]
        for name in node.output[len(outs):]:
            if name:
                self.fail(f"output {name!r} is not supported")

    def attrs(self, node, h):
        out = {}
        for a in node.attribute:
            if a.ref_attr_name:
                self.fail(f"attribute {a.name!r} references an undefined function attribute")
            if h is not None and h.attrs is not None and a.name not in h.attrs:
                self.fail(f"attribute {a.name!r} is not supported")
            if a.type == onnx.AttributeProto.TENSOR:
                out[a.name] = numpy_helper.to_array(a.t)
            elif a.type == onnx.AttributeProto.GRAPH:
                out[a.name] = a.g
            else:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    v = v.decode()
                elif isinstance(v, list) and v and isinstance(v[0], bytes):
                    v = [s.decode() for s in v]
                out[a.name] = v
        return out

    # -- constant folding ----------------------------------------------------------------------

    def _try_fold(self, node, ins):
        if node.op_type in _NOT_FOLDABLE or node.domain == CONTRIB:  # (the reference lacks contrib ops)
            return False
        if any(v is not None and not isinstance(v, np.ndarray) for v in ins):
            return False
        if any(symbolic.is_symbolic(v) for v in ins):  # shape arithmetic on dynamic dimensions
            outs = symbolic.fold(node, ins, self.attrs(node, None), self.cur_opset)
            if outs is None:
                return False
            self._bind(node, outs)
            return True
        n = _fold_size(node, ins)
        if n is not None and n > MAX_HOST_ELEMENTS:
            raise DataError(f"[onnx] node {node.name or '(unnamed)'!r} ({node.op_type}): its result would "
                            f"hold {n} elements (more than {MAX_HOST_ELEMENTS}); a shape in the model is wrong")
        try:
            outs = self.evaluate(node, ins)
        except Exception:
            return False
        if any(not isinstance(o, np.ndarray) for o in outs):
            return False
        self._bind(node, [np.asarray(o) for o in outs])
        return True

    def _empty_result(self, node, ins):
        """A node reading an empty host array (WebNN has no empty tensors: a NonZero that found
        nothing, a loop that ran no iteration) next to computed operands: when ONNX shape
        inference says every output is empty too, bind empty host arrays and skip the handler."""
        if not any(isinstance(v, np.ndarray) and v.size == 0 for v in ins) or \
                all(v is None or isinstance(v, np.ndarray) for v in ins) or not node.output or \
                any(isinstance(d, Sym) for v in ins if v is not None for d in v.shape):
            return False  # (sizes known only at dispatch: the handler decides)
        vis, names = [], []
        for i, (name, v) in enumerate(zip(node.input, ins)):
            if v is None:
                names.append("")
                continue
            n = f"__in{i}"
            names.append(n)
            et = self.onnx_type(v, name or None)
            vis.append(helper.make_tensor_value_info(n, et, [int(d) for d in v.shape]))
        m, outs = self._one_node_model(node, names, vis, node.domain)
        try:
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        except Exception:
            return False
        got = {}
        for vi in inferred.graph.output:
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if not tt.HasField("shape") or None in dims or 0 not in dims:
                return False
            got[vi.name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if len(got) != len([o for o in outs if o]):
            return False
        self._bind(node, [got.get(o) if o else None for o in outs])
        return True

    def evaluate(self, node, ins):
        """Run one node on host arrays with the ONNX reference implementation."""
        from onnx.reference import ReferenceEvaluator

        names, vis, feeds = [], [], {}
        for i, (name, v) in enumerate(zip(node.input, ins)):
            if v is None:
                names.append("")
                continue
            n = name if name and name not in feeds else f"__in{i}"
            names.append(n)
            if n not in feeds:
                feeds[n] = v
                vis.append(helper.make_tensor_value_info(n, onnx_type_of_np(v.dtype), v.shape))
        # values a subgraph (Loop/If/Scan body) takes from the enclosing scope
        for outer in _outer_names(node):
            v = self.env.get(outer)
            if outer in feeds or v is None:
                continue
            if not isinstance(v, np.ndarray):
                raise ValueError("subgraph uses a computed value")
            feeds[outer] = v
            vis.append(helper.make_tensor_value_info(outer, onnx_type_of_np(v.dtype), v.shape))
        m, _ = self._one_node_model(node, names, vis, "")
        res = ReferenceEvaluator(m).run(None, feeds)
        return list(res)

    def _one_node_model(self, node, names, vis, domain):
        """(model, output names) of `node` alone, reading `names` (declared by `vis`), its outputs
        renamed __out<i>: for folding (evaluate) and for shape inference (_empty_result)."""
        outs = [f"__out{i}" if o else "" for i, o in enumerate(node.output)]
        n2 = helper.make_node(node.op_type, names, outs, domain=node.domain)
        n2.attribute.extend(node.attribute)
        g = helper.make_graph([n2], "one_node", vis, [helper.make_value_info(o, onnx.TypeProto()) for o in outs if o])
        return helper.make_model(g, opset_imports=[helper.make_opsetid(domain, self.cur_opset)]), outs

    # -- functions -----------------------------------------------------------------------------

    def domain_function(self, node):
        f = self.functions.get((node.domain, node.op_type))
        return (f,) if f is not None else None

    def expand_function(self, node, fp, ins, schema_defaults=None):
        """Inline a FunctionProto: rename its values, bind formal inputs, resolve attribute refs."""
        self._uid += 1
        prefix = f"__{fp.name}{self._uid}/"
        rename = {}
        for formal, actual in zip(fp.input, node.input):
            rename[formal] = actual
        for formal in fp.input[len(node.input):]:
            rename[formal] = ""
        for formal, actual in zip(fp.output, node.output):
            rename[formal] = actual
        given = {a.name: a for a in node.attribute}
        defaults = dict(schema_defaults or {})
        defaults.update({a.name: a for a in fp.attribute_proto})
        body = []
        for n in fp.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(n)
            del n2.input[:]
            del n2.output[:]
            n2.input.extend(rename.get(x, prefix + x) if x else "" for x in n.input)
            n2.output.extend(rename.get(x, prefix + x) if x else "" for x in n.output)
            del n2.attribute[:]
            for a in n.attribute:
                if a.ref_attr_name:
                    src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(src)
                    a2.name = a.name
                    n2.attribute.append(a2)
                else:
                    n2.attribute.append(a)
            if not n2.name:
                n2.name = f"{node.name or node.op_type}/{n.op_type}"
            body.append(n2)
        opset = self.cur_opset
        for o in fp.opset_import:
            if o.domain in ("", "ai.onnx"):
                opset = o.version
        saved_node = self.node
        self.run_nodes(body, opset)
        self.node = saved_node

    def expand_schema_function(self, node, ins):
        """Expand an op that ONNX defines as a function of other ops (e.g. Celu, Mish, Swish)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.cur_opset, node.domain)
        except Exception:
            return False
        raw = None
        try:
            vers = [v for v in schema.function_opset_versions if v <= self.cur_opset]
            if schema.has_function and vers:
                raw = schema.get_function_with_opset_version(max(vers))
            else:
                vers = [v for v in schema.context_dependent_function_opset_versions if v <= self.cur_opset]
                if schema.has_context_dependent_function and vers:
                    types = []
                    for name, v in zip(node.input, ins):
                        et = self.onnx_type(v, name) if v is not None else TensorProto.FLOAT
                        shp = list(v.shape) if v is not None else None
                        types.append(helper.make_tensor_type_proto(et, shp).SerializeToString())
                    raw = schema.get_context_dependent_function_with_opset_version(
                        max(vers), node.SerializeToString(), types)
        except Exception:
            raw = None
        if not raw:
            return False
        fp = onnx.FunctionProto()
        fp.ParseFromString(raw)
        if not fp.node:
            return False
        if any(n.op_type == node.op_type and n.domain == node.domain for n in fp.node):
            return False
        defaults = {}
        for name, a in schema.attributes.items():
            if a.default_value is not None and a.default_value.type:
                defaults[name] = a.default_value
        self.expand_function(node, fp, ins, defaults)
        return True


# onnxruntime's contrib operators (com.microsoft): their handlers register as
# "com.microsoft.<OpType>" (onnx/ops/contrib_*.py), next to the default domain's plain names
CONTRIB = "com.microsoft"


def handler_key(node):
    """The HANDLERS key of a node: its op type in the default domain, "<domain>.<op type>" in
    the contrib domain, None in any other."""
    if node.domain in ("", "ai.onnx"):
        return node.op_type
    if node.domain == CONTRIB:
        return f"{CONTRIB}.{node.op_type}"
    return None


def _fold_size(node, ins):
    """Elements a node folded at load would create, for the ops whose output size is a value
    (None: not one of those, or not computable, in which case folding reports it)."""
    t = node.op_type
    try:
        if t == "ConstantOfShape" and ins and ins[0] is not None:
            return _count(ins[0].reshape(-1))
        if t == "Expand" and len(ins) > 1:
            return _count(np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1].reshape(-1))))
        if t == "Tile" and len(ins) > 1:
            return ins[0].size * _count(ins[1].reshape(-1))
        if t == "Range" and len(ins) == 3:
            start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in ins)
            return int(np.ceil((limit - start) / delta)) if delta else None
    except Exception:
        return None
    return None


def _count(dims):
    n = 1
    for d in dims:
        n *= d if isinstance(d, Sym) else int(d)
    return n


def _outer_names(node):
    """Names a node's subgraphs read from the enclosing scope."""
    out = []
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                for x in n.input:
                    if x and x not in local:
                        out.append(x)
                out.extend(_outer_names(n))
                local.update(n.output)
    return out


def import_onnx(source, context, *, free_dimensions=None, input_shapes=None, input_values=None,
                const_outputs_as_ops=False):
    model, weights = load_model(source)
    im = Importer(model, context, free_dimensions=free_dimensions, input_shapes=input_shapes,
                  weights=weights, input_values=input_values)
    with data_errors(source_name(source), im):
        imported = im.run(const_outputs_as_ops=const_outputs_as_ops)
    if weights is not None:
        weights.release()  # uploaded: the mapped pages leave this process's memory
    return imported
