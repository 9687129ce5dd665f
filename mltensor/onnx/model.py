"""Reading an ONNX model: load it (big weights read in place, weights.py), describe its inputs
and outputs, and find the names a node's subgraphs read from the enclosing scope."""

import heapq
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import DataError, InternalError
from ..onnxio import source_name
from . import weights as W
from .types import MAX_HOST_ELEMENTS, prod


def load_model(source, name=None):
    """(ModelProto, Weights or None) from a path, bytes or a ModelProto. For a path or bytes the
    big initializers stay in the file (or the caller's buffer) and are read in place
    (onnx/weights.py); external data files are mapped, not loaded. A file or buffer that is not
    a well-formed ONNX ModelProto raises DataError naming it (`name`, else source_name). Nodes
    out of topological order are sorted, as onnxruntime does (a caller's proto is copied first)."""
    if isinstance(source, onnx.ModelProto):
        return _sorted(source, copy=True), None
    if not isinstance(source, (bytes, bytearray, memoryview, str, os.PathLike)):
        raise TypeError(f"[onnx] model must be a path, bytes or onnx.ModelProto, got {type(source).__name__}")
    name = name or source_name(source)
    try:
        model, weights = W.load(source, name)
    except OSError:
        raise
    except Exception as e:
        if _parses(source):  # then the file is fine and our in-place reader (weights.py) failed
            raise InternalError(
                f"[onnx] {name}: internal error in mltensor, a bug (the file parses as an ONNX "
                f"ModelProto, mltensor's in-place weight reader failed: {type(e).__name__}: {e}). "
                "Please report it with the model"
            ) from e
        raise DataError(
            f"[onnx] {name}: not a well-formed ONNX model (the ModelProto protobuf does not "
            f"parse: {type(e).__name__}: {e})"
        ) from None
    if not model.HasField("graph"):
        raise DataError(f"[onnx] {name}: the ModelProto has no graph (field 'graph' is missing)")
    model = _sorted(model)
    for t in model.graph.initializer:  # external data files: there, and big enough (mapped, not read)
        if t.data_location == TensorProto.EXTERNAL and weights.base_dir is not None:
            try:
                external_view(weights, t)
            except DataError:
                raise
            except Exception as e:
                raise DataError(f"[onnx] {name}: external data cannot be loaded ({type(e).__name__}: {e})") from None
    return model, weights


# ONNX element types read in place from a model file (numpy's own little-endian types); the
# others (bfloat16, float8, int4, strings) are converted by numpy_helper from a copy.
_IN_PLACE = {
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.FLOAT16,
    TensorProto.INT8,
    TensorProto.UINT8,
    TensorProto.INT16,
    TensorProto.UINT16,
    TensorProto.INT32,
    TensorProto.UINT32,
    TensorProto.INT64,
    TensorProto.UINT64,
    TensorProto.BOOL,
}


def _parses(source):
    """Whether protobuf itself parses the model's bytes (the error path only: a copy)."""
    try:
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                source = f.read()
        onnx.load_model_from_string(bytes(source))
    except Exception:  # noqa: BLE001 (any failure: it does not parse)
        return False
    return True


def external_view(weights, t):
    """The read-only numpy view of an initializer whose data lies in the model file or an
    external data file (onnx/weights.py), converted through numpy_helper for element types
    numpy cannot view; None if its file is not one Weights maps."""
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise DataError(f"[onnx] tensor {t.name!r}: external data offset/length are not integers") from None
    dims = list(t.dims)
    if any(d < 0 for d in dims) or prod(dims) > MAX_HOST_ELEMENTS:
        raise DataError(f"[onnx] tensor {t.name!r}: field 'dims' {dims} is not a valid shape")
    view = weights.raw(location, offset, length)
    if view is None:
        return None
    if t.data_type in _IN_PLACE and sys.byteorder == "little":
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        if len(view) != prod(dims) * dt.itemsize:
            raise DataError(
                f"[onnx] tensor {t.name!r} ({TensorProto.DataType.Name(t.data_type)} {dims}): "
                f"its data does not match its type and shape ({len(view)} bytes)"
            )
        return np.frombuffer(view, dtype=dt).reshape(dims)
    copy = TensorProto()
    copy.CopyFrom(t)
    del copy.external_data[:]
    copy.data_location = TensorProto.DEFAULT
    copy.raw_data = bytes(view)
    return numpy_helper.to_array(copy)


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
        outputs.append(
            [vo.name, tt.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]]
        )
    return {"shapes": shapes, "params": params, "inputs": inputs, "outputs": outputs}


def outer_names(node):
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
                out.extend(outer_names(n))
                local.update(n.output)
    return out


def _sorted(model, copy=False):
    """The model with its nodes in topological order (onnxruntime runs models that break the
    order: it sorts them too); a copy of a caller's proto, which stays as it was."""
    if not model.HasField("graph") or not _needs_sort(model.graph):
        return model
    if copy:
        source, model = model, onnx.ModelProto()
        model.CopyFrom(source)
    _sort_graph(model.graph)
    return model


def _order(nodes):
    """Positions of `nodes` with every node after the producers of its inputs (and of the names
    its subgraphs read), the given order kept where it allows; None when it already is so.
    Nodes in a cycle keep their order after the others (the importer then reports the input
    that no earlier node produces)."""
    produced = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced.setdefault(o, i)
    deps = []
    for i, n in enumerate(nodes):
        names = [x for x in n.input if x] + outer_names(n)
        deps.append({produced[x] for x in names if produced.get(x, i) != i})
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return None
    users = [[] for _ in nodes]
    missing = [len(ds) for ds in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    ready = [i for i, m in enumerate(missing) if not m]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if not missing[u]:
                heapq.heappush(ready, u)
    placed = set(order)
    return order + [i for i in range(len(nodes)) if i not in placed]


def _subgraphs(node):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _needs_sort(g):
    return any(_needs_sort(sub) for n in g.node for sub in _subgraphs(n)) or _order(g.node) is not None


def _sort_graph(g):
    """Sort a graph's nodes topologically, its subgraphs' first (ONNX requires the order; some
    exporters and hand edits break it, and onnxruntime sorts such graphs itself)."""
    for n in g.node:
        for sub in _subgraphs(n):
            _sort_graph(sub)
    order = _order(g.node)
    if order is None:
        return
    nodes = []
    for i in order:
        c = onnx.NodeProto()
        c.CopyFrom(g.node[i])
        nodes.append(c)
    del g.node[:]
    g.node.extend(nodes)


# A model whose weights total more than this is not copied to be checked (the error path only).
CHECK_MAX_BYTES = 1 << 30


def checker_complaint(model, weights=None):
    """What `onnx.checker.check_model(full_check=True)` finds wrong with a model, or None when
    it passes or cannot be checked: the evidence that decides whether an exception raised while
    importing it is the file's fault (DataError) or a bug in mltensor (InternalError). Weights
    read in place (weights.py) are put back into a copy of the proto first, the checker verifying
    their sizes too."""
    if model is None:
        return None
    try:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        total = 0
        for t in copy.graph.initializer:
            if t.data_location != TensorProto.EXTERNAL or weights is None:
                continue
            info = {e.key: e.value for e in t.external_data}
            length = int(info["length"]) if "length" in info else None
            view = weights.raw(info.get("location", ""), int(info.get("offset", 0)), length)
            if view is None:
                continue
            total += len(view)
            if total > CHECK_MAX_BYTES:
                return None
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = bytes(view)
        onnx.checker.check_model(copy, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        return " ".join(str(e).split())
    except DataError as e:  # a tensor's data lies outside its file
        return str(e).removeprefix("[onnx] ")
    except Exception:  # noqa: BLE001 (the checker itself failed: no evidence either way)
        return None
    return None
