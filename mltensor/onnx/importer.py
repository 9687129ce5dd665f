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

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..dynamic.dims import MLDynamicDimension, Sym
from ..errors import DataError, NotSupportedError
from ..front.builder import MLGraphBuilder, MLOperand
from ..onnxio import IOInfo, ONNX_OF_WEBNN, TYPE_STRING, dim_name, source_name  # noqa: F401 (re-exported)
from . import resume, symbolic
from .batchnorm import BatchNormFolding
from .errors import FeedError, NeedsValue, Unsupported, UnsupportedError, model_errors  # noqa: F401 (re-exported)
from .folding import ConstantFolding
from .functions import FunctionExpansion
from .model import (  # noqa: F401 (re-exported: the session reads io_description here)
    check_io_names,
    external_view,
    io_description,
    load_model,
    symbolic_inputs,
)
from .ops import HANDLERS, supported_ops
from .ops._registry import CONTRIB, handler_key
from .types import MAX_HOST_ELEMENTS, WEBNN_TYPE, onnx_type_of_np, prod, storage_array


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
        # (carried position, axis) of a count read back (onnx/resume.py); dynamic_ok: whether the
        # rest builds with it as a dynamic dimension (None: not tried yet)
        self.counted, self.dynamic_ok = counted, None


class Importer(ConstantFolding, FunctionExpansion, BatchNormFolding):
    def __init__(
        self,
        model,
        context,
        *,
        free_dimensions=None,
        input_shapes=None,
        weights=None,
        input_values=None,
        dynamic=None,
        ones=None,
        resume=None,
    ):
        self.ctx = context
        # Data-dependent shapes (mltensor/stages/): `resume` is the resume.Snapshot this
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
        self.top_node = None  # that node
        self._cut_seq = 0
        self._cut_prefix = ()  # (base, iteration) of the unrolled loop iteration being imported
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
        node = node or self.node
        if node is not None:
            dom = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
            where = f"node {node.name or '(unnamed)'!r} ({dom}{node.op_type}, opset {self.cur_opset})"
        else:
            where = f"model (opset {self.opset})"
        raise UnsupportedError(f"[onnx] {where}: {reason}. Supported ONNX ops: {', '.join(supported_ops())}")

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
                    self.fail(
                        f"operator domain {o.domain!r} is not supported (only the default ONNX "
                        f"domain and onnxruntime's {CONTRIB!r})"
                    )
        self.b = MLGraphBuilder(self.ctx)
        if self.weights is not None:
            self.b._release_host = self.weights.release

        self.graph_outputs = {o.name for o in g.output}
        if self.resume is not None:  # a later stage: the environment at the cut (onnx/resume.py)
            inputs = resume.restore(self, self.resume)
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
        A cut (onnx/resume.py) ends the import at its node: the result is that stage's graph."""
        g = self.model.graph
        try:
            self.run_nodes(g.node, self.opset, fold_batchnorm=True, top=True)
        except resume.Cut as c:
            i, uid, folded = self._top_state
            outputs, snap, reads, carried = resume.end_stage(self, c, g.node, i, uid, folded)
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
                    self.fail(
                        f"output {vo.name!r} is empty (WebNN has no zero-sized tensors; "
                        "InferenceSession returns it from the host)"
                    )
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
            raise FeedError(
                f"[onnx] input {name!r} is declared without a shape: run it through "
                "InferenceSession, whose feeds give it one"
            )
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

    def _tensor(self, t):
        if t.data_location == TensorProto.EXTERNAL and self.weights is not None:
            a = external_view(self.weights, t)
            if a is not None:
                return a
        dims = list(t.dims)
        if any(d < 0 for d in dims) or prod(dims) > MAX_HOST_ELEMENTS:
            raise DataError(f"[onnx] tensor {t.name!r}: field 'dims' {dims} is not a valid shape")
        if t.data_type not in WEBNN_TYPE and t.data_type != TensorProto.STRING:
            try:
                TensorProto.DataType.Name(t.data_type)
            except ValueError:
                raise DataError(
                    f"[onnx] tensor {t.name!r}: field 'data_type' {t.data_type} is not an ONNX element type"
                ) from None
        try:
            return numpy_helper.to_array(t)
        except Exception as e:
            raise DataError(
                f"[onnx] tensor {t.name!r} ({TensorProto.DataType.Name(t.data_type)} {dims}): "
                f"its data does not match its type and shape ({e})"
            ) from None

    # -- nodes ---------------------------------------------------------------------------------

    def run_nodes(self, nodes, opset, fold_batchnorm=False, top=False):
        """top: the graph's own nodes (a resumed import starts at its cut, and cuts are keyed by
        the node being imported, onnx/resume.py)."""
        saved, outer = self.cur_opset, self.node
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
                self._top_index, self._cut_seq, self._cut_prefix = i, 0, ()
                self._top_state = (i, self._uid, frozenset(folded))
            bn = partners.get(node.output[0]) if node.op_type == "Conv" and node.output else None
            if bn is not None:
                fused = self._fold_batchnorm(node, bn[0])
                if fused is not None:
                    folded.add(bn[1])
                    node = fused
            self.cur_opset = opset
            self.node = node
            if top:
                self.top_node = node  # (a cut raised inside its subgraphs keeps its inputs)
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
            # dropped inputs are None now: onnx/resume.py)
            resumed = top and self.resume is not None and i == self.resume.index
            if not resumed and (self._try_fold(node, ins) or self._empty_result(node, ins)):
                continue
            h = HANDLERS.get(key)
            if h is None:
                if self.expand_schema_function(node, ins):
                    continue
                self.fail("operator is not supported")
            attrs = self.attrs(node, h)
            first = len(self.b._nodes)
            try:
                outs = h.fn(self, node, ins, attrs)
            except Unsupported as e:
                self.fail(str(e))
            except TypeError as e:
                if not str(e).startswith("["):
                    raise  # not the builder's validation ("[op] ..."): model_errors sorts it out
                self.fail(f"cannot be mapped onto WebNN ({e})")
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            # the builder nodes this ONNX node became carry its name (MLGraph.fusion_report,
            # errors): the ONNX name, else its operator and index
            label = node.name or f"{node.op_type}_{i}"
            for made in self.b._nodes[first:]:
                if made.label is None:
                    made.label = label
            self._bind(node, outs)
        if top:
            self._top_index = None
        self.cur_opset, self.node = saved, outer

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
        for name in node.output[len(outs) :]:
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


def import_onnx(
    source, context, *, free_dimensions=None, input_shapes=None, input_values=None, const_outputs_as_ops=False
):
    model, weights = load_model(source)
    im = Importer(
        model,
        context,
        free_dimensions=free_dimensions,
        input_shapes=input_shapes,
        weights=weights,
        input_values=input_values,
    )
    with model_errors(source_name(source), im):
        imported = im.run(const_outputs_as_ops=const_outputs_as_ops)
    if weights is not None:
        weights.release()  # uploaded: the mapped pages leave this process's memory
    return imported
