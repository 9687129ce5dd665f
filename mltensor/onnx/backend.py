"""onnx.backend.base.Backend on mltensor, for the ONNX backend test kit.

    from mltensor.onnx import backend
    rep = backend.prepare(model)            # BackendRep around an InferenceSession
    outputs = rep.run([x0, x1])             # positional inputs, in the model's input order
    outputs = backend.run_node(node, [x])   # one node, for quick checks

All sessions share one MLContext (created on first use).
"""

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from ..session import InferenceSession, default_context


class MLTensorBackendRep(BackendRep):
    def __init__(self, session):
        self.session = session

    def run(self, inputs, **kwargs):
        names = [a.name for a in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        outs = self.session.run(None, feeds)
        return namedtupledict("Outputs", [a.name for a in self.session.get_outputs()])(*outs)


class MLTensorBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        sess = InferenceSession(model, default_context(), free_dimensions=kwargs.get("free_dimensions"))
        return MLTensorBackendRep(sess)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        """Wrap one NodeProto in a model (input types from the arrays) and run it."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        if isinstance(inputs, dict):
            items = [(n, inputs[n]) for n in node.input if n]
        else:
            items = [(n, v) for n, v in zip([n for n in node.input if n], inputs)]
        vis = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.asarray(v).shape)
            for n, v in items
        ]
        if outputs_info:
            outs = [
                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                for n, (dt, shape) in zip(node.output, outputs_info)
            ]
        else:
            outs = [helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(
            helper.make_graph([node], "run_node", vis, outs),
            opset_imports=[helper.make_opsetid(node.domain or "", opset)],
        )
        # no onnx.checker here: untyped outputs are fine for the importer
        rep = MLTensorBackendRep(InferenceSession(model, default_context()))
        return rep.run([np.asarray(v) for _, v in items])

    @classmethod
    def supports_device(cls, device):
        return Device(device).type == DeviceType.CPU


backend = MLTensorBackend
prepare = MLTensorBackend.prepare
run = MLTensorBackend.run_model
run_model = MLTensorBackend.run_model
run_node = MLTensorBackend.run_node
supports_device = MLTensorBackend.supports_device
