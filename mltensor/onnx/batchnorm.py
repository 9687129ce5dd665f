"""BatchNormalization folded into the Conv before it at import (as onnxruntime does)."""

import numpy as np
from onnx import helper


class BatchNormFolding:
    """Importer methods (mixed into onnx/importer.Importer): used by run_nodes at the top level."""

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
            if attrs.get("training_mode", 0) or attrs.get("spatial", 1) != 1 or len([o for o in n.output if o]) != 1:
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
