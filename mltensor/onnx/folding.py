"""Constant folding at import: a node whose inputs are all known on the host is run with numpy
through onnx.reference (symbolic.py for shape arithmetic on dynamic dimensions) instead of being
built; a node reading an empty host array binds the empty results ONNX shape inference gives."""

import numpy as np
import onnx
from onnx import helper

from ..dynamic.dims import Sym
from ..errors import DataError
from . import symbolic
from .model import outer_names
from .ops._registry import CONTRIB
from .types import MAX_HOST_ELEMENTS, onnx_type_of_np, prod

# Ops never folded at load: their value is not a function of their inputs.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


class ConstantFolding:
    """Importer methods (mixed into onnx/importer.Importer)."""

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
            raise DataError(
                f"[onnx] node {node.name or '(unnamed)'!r} ({node.op_type}): its result would "
                f"hold {n} elements (more than {MAX_HOST_ELEMENTS}); a shape in the model is wrong"
            )
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
        nothing, a loop that ran no iteration) next to computed operands, or one onnx.reference
        could not fold (its Flatten cannot reshape an empty array): when ONNX shape inference
        says every output is empty too, bind empty host arrays and skip the handler."""
        if (
            not any(isinstance(v, np.ndarray) and v.size == 0 for v in ins)
            or not node.output
            or any(isinstance(d, Sym) for v in ins if v is not None for d in v.shape)
        ):
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
        for outer in outer_names(node):
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


def _fold_size(node, ins):
    """Elements a node folded at load would create, for the ops whose output size is a value
    (None: not one of those, or not computable, in which case folding reports it)."""
    t = node.op_type
    try:
        if t == "ConstantOfShape" and ins and ins[0] is not None:
            return prod(ins[0].reshape(-1))
        if t == "Expand" and len(ins) > 1:
            return prod(np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1].reshape(-1))))
        if t == "Tile" and len(ins) > 1:
            return ins[0].size * prod(ins[1].reshape(-1))
        if t == "Range" and len(ins) == 3:
            start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in ins)
            return int(np.ceil((limit - start) / delta)) if delta else None
    except Exception:
        return None
    return None
