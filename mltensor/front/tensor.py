"""MLTensor: a wgpu storage buffer owned by one context."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import wgpu

from .. import dtypes
from ..dynamic.dims import Sym, bind, check_derived, high, is_static
from ..errors import gpu_errors
from ..runtime.timeline import Task


class MLTensor:
    """A tensor on a context's GPU device (WebNN `MLTensor`): the inputs and outputs of
    `dispatch`, written with `MLContext.write_tensor` and read with `read_tensor_sync` /
    `read_tensor_async`.

    Created with `MLContext.create_tensor_sync` (or `create_constant_tensor_sync`,
    `create_exportable_tensor_sync`), never directly. New tensors are zero-filled."""

    # IDL: interface MLTensor { dataType; shape; readable; writable; importableToWebGPU; constant; destroy(); }

    def __init__(
        self,
        ctx: Any,  # its MLContext (front/context.py imports this module: annotated as Any, no import circle)
        data_type: str,
        shape: Iterable[int | Sym],
        readable: bool,
        writable: bool,
        importable: bool,
        constant: bool = False,
        export_device: wgpu.GPUDevice | None = None,
    ) -> None:
        self._context = ctx
        self._data_type = data_type
        # create_exportable_tensor: the GPUDevice export_to_gpu rents it to, and the lease while it
        # is exported (front/interop.py; WebNN calls on it then fail)
        self._export_device = export_device
        self._exported: object | None = None
        self._lease: Any  # (front/interop.py: set while an import or export is pending or lent)
        # Python extension: a shape with dynamic dimensions makes a resizable tensor. Its buffer
        # holds the maximum sizes; its current shape (`shape`, the maximum at first) is set by
        # write_tensor of an array and by each dispatch writing it as an output, so one tensor
        # serves every size of a decode loop without allocating (dynamic/dims.py).
        shape = tuple(shape)
        self._max_shape: tuple[int | Sym, ...] | None = None if is_static(shape) else shape
        static: tuple[int, ...] = tuple(high(d) for d in shape)
        self._shape = static
        self._readable = bool(readable)
        self._writable = bool(writable)
        self._importable = bool(importable)
        self._constant = constant
        self._destroyed = False
        self._np_dtype: np.dtype[Any] = dtypes.NUMPY[data_type]
        self._nbytes: int = dtypes.byte_length(data_type, static)
        usage = wgpu.BufferUsage.STORAGE
        lendable = importable or export_device is not None
        if readable or lendable or constant:  # (a constant's bytes: save_graph reads them back)
            usage |= wgpu.BufferUsage.COPY_SRC
        if writable or lendable or constant:
            usage |= wgpu.BufferUsage.COPY_DST
        # CPU adapters: map readable tensors in place (a lent buffer's usage must stay exact).
        self._direct_map = ctx._direct_map and self._readable and not lendable
        if self._direct_map:
            usage |= wgpu.BufferUsage.MAP_READ
        with gpu_errors("create_constant_tensor" if constant else "create_tensor"):  # out of memory
            self._buffer = ctx.device.create_buffer(
                label=f"mltensor-{data_type}{list(static)}", size=dtypes.padded(self._nbytes), usage=usage
            )
        # callbacks (bind-group caches, interop) run at destroy()
        self._on_destroy: list[Callable[[MLTensor], object]] = []
        ctx._tensor_created(self)

    @property
    def data_type(self) -> str:
        """The WebNN data type, e.g. "float32"."""
        return self._data_type

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, a tuple of ints: for a resizable tensor its current shape (set by
        write_tensor of an array and by each dispatch writing it)."""
        return self._shape

    # Python extension: the declared shape of a resizable tensor (ints and Syms: .name,
    # .max_size), None for a tensor of one fixed shape
    @property
    def max_shape(self) -> tuple[int | Sym, ...] | None:
        """Python extension: the declared shape of a resizable tensor (ints, and dynamic
        dimensions with `.name` and `.max_size`), None for a tensor of one fixed shape."""
        return self._max_shape

    def _fit(self, shape: Iterable[int], where: str, what: str = "the tensor") -> None:
        """Make `shape` the current shape of a resizable tensor (TypeError if it does not fit its
        declared shape); a fixed tensor's shape must equal it."""
        fitted = tuple(int(d) for d in shape)
        if fitted == self._shape:
            return
        if self._max_shape is None:
            raise TypeError(f"[{where}] {what} has shape {list(self._shape)}, expected {list(fitted)}")
        values: dict[str, int] = {}
        bind(self._max_shape, fitted, values, f"[{where}] {what}")
        check_derived(self._max_shape, fitted, values, f"[{where}] {what}")
        self._shape = fitted
        self._nbytes = dtypes.byte_length(self._data_type, fitted)

    @property
    def readable(self) -> bool:
        """Created with readable=True: read_tensor works."""
        return self._readable

    @property
    def writable(self) -> bool:
        """Created with writable=True: write_tensor works."""
        return self._writable

    @property
    def importable_to_webgpu(self) -> bool:
        """Created with importable_to_webgpu=True: mltensor.import_external_buffer_sync can lend it."""
        return self._importable

    @property
    def constant(self) -> bool:
        """Created by create_constant_tensor: usable only as MLGraphBuilder.constant(tensor)."""
        return self._constant

    def __repr__(self) -> str:
        flags = [n for n in ("readable", "writable", "importable_to_webgpu", "constant") if getattr(self, n)]
        flags += ["exportable"] if self._export_device is not None else []
        state = " destroyed" if self._destroyed else " exported" if self._exported else ""
        return f"<MLTensor {self._data_type} {list(self._shape)} {' '.join(flags)}{state}>"

    # IDL: undefined destroy();
    def destroy(self) -> None:
        """Free the tensor (WebNN ``destroy()``). Idempotent. Pending reads reject with
        InvalidStateError; work already enqueued on the tensor completes, and its memory is freed
        after that (the destroy is itself a task on the timeline). A destroyed tensor cannot be
        used again."""
        ctx = self._context
        with ctx._lock:
            if self._destroyed:
                return
            self._destroyed = True
            ctx._tensor_destroyed(self)
            for cb in self._on_destroy:
                cb(self)
            self._on_destroy = []
            if ctx._lost_info is not None:
                return
            buf = self._buffer
            tl = ctx._timeline

            def free() -> None:
                if tl.uses(buf):
                    tl.after_submit(buf.destroy)
                else:
                    buf.destroy()

            tl.enqueue(Task((), (self,), free))


def exported_error(where: str, what: str = "tensor") -> str:
    """The message of a WebNN call on a tensor rented to WebGPU by export_to_gpu (a TypeError)."""
    return (
        f"[{where}] {what} is exported to WebGPU (export_to_gpu): WebNN cannot use it until the GPUBuffer is destroyed"
    )
