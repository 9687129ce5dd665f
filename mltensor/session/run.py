"""The run path of an InferenceSession: the feeds checked, the numpy ones uploaded into the run's
tensor set, the graph (or a staged model's stages) dispatched into its outputs, the outputs read
back in one submit or returned as tensors."""

from typing import Any

import numpy as np

from .. import dtypes
from ..front.tensor import MLTensor
from ..onnxio import TYPE_STRING
from . import lazy


class RunPath:
    """InferenceSession's run path (a mixin)."""

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
            if len(v.shape) != len(a.shape) or any(isinstance(d, int) and d != g for d, g in zip(a.shape, v.shape)):
                got = f"an MLTensor {v.data_type} {list(v.shape)}" if isinstance(v, MLTensor) else list(v.shape)
                raise TypeError(f"[{where}] input {a.name!r} must have shape {a.shape}, got {got}")

    def _enqueue(
        self, output_names: Any, input_feed: Any, output_location: str
    ) -> tuple[list[str], list[Any], Any, Any]:
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
                raise TypeError(f"[{where}] input {name!r} must have dtype {want} ({type_str(info)}), got {arr.dtype}")
            if plan is None and tuple(arr.shape) != info.shape:
                raise TypeError(f"[{where}] input {name!r} must have shape {list(info.shape)}, got {list(arr.shape)}")
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
            return names, lazy.stages().run(self, spec, tset, bind, names, output_location)
        graph = spec.graph
        if graph is not None:
            outs = {}
            fed = {id(t) for t in bind.values()}
            state = spec.state  # a stateful TFLite model's variables (session/state.py)
            for n, (dt, shape) in graph.output_descriptors.items():
                if state is not None and n in state.names:
                    continue
                t = tset.outputs.get(n)
                if t is not None and id(t) in fed:
                    # this output of an earlier run is fed back in (a decode loop): write into
                    # a second tensor, kept as well, so the two alternate without allocating
                    t, tset.spare[n] = tset.spare.get(n), t
                if t is None:
                    t = ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True)
                tset.outputs[n] = t
                outs[n] = t
            ins = {n: bind[n] for n in graph.input_descriptors if state is None or n not in state.names}
            if state is not None:
                state.dispatch(graph, ins, outs)
            else:
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
                t = self._ctx.create_tensor_sync(
                    data_type=info.data_type, shape=info.shape or (), readable=True, writable=True
                )
                self._ctx.write_tensor(t, data)
                spec.const_tensors[name] = t
            return t

    def _to_onnx(self, spec: Any, name: str, arr: Any) -> Any:
        if spec.stage is not None:  # converted by stages/plan.run
            return arr
        info = spec.outputs[name]
        want = info.np_dtype
        if arr.dtype == want:
            return arr
        if want == np.bool_:
            return arr.view(np.bool_)
        return arr.astype(want)


def read_all(ctx, values, where):
    """Read every MLTensor in `values` (numpy values pass through): all reads are started before
    any is waited on, so one submit serves them all; one host copy each."""
    ctx._check(where)
    started = [ctx._start_read(v, where=where, sync=True) if isinstance(v, MLTensor) else None for v in values]
    return [v if r is None else r.wait_sync(where) for r, v in zip(started, values)]


class Shaped:
    """Stands for a feed of a given shape (the sizes known at creation)."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def host_value(v, ctx):
    if isinstance(v, MLTensor):
        return ctx.read_tensor_sync(v)
    return np.asarray(v)


def type_str(info):
    return TYPE_STRING.get(info.onnx_type, "?")
