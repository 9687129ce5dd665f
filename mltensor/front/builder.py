"""MLGraphBuilder: validate, infer shapes and types, record nodes (MLOperand and Node, the IR it
records, live in ir/graph.py and are re-exported here).

Operator methods live in mltensor/ops/ (one file per family); each is registered by
`@builder_op` (ir/registry.py), which adds the shared state checks, and attached here. The IDL signature of every
method is quoted above it there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import dtypes
from .. import ops  # noqa: F401 (loads the operator families: every builder method is registered)
from ..dynamic.dims import Sym, low, parse_shape
from ..errors import DOMException, InvalidStateError, OperationError
from ..ir.graph import MLOperand as MLOperand  # (re-exported: mltensor.MLOperand)
from ..ir.graph import Node, as_shape
from ..ir.registry import attach
from ._util import BufferLike, async_doc, awaitable, bytes_of
from .context import MLContext
from .graph import MLGraph
from .tensor import MLTensor

if TYPE_CHECKING:
    # The operator methods, attached at import (registry.attach): their signatures for type
    # checkers and IDEs (generated, tests/test_types.py)
    import numpy.typing as npt

    from ..dynamic.dims import MLDynamicDimension
    from ._builder_ops import BuilderOps as OperatorMethods
else:
    OperatorMethods = object


class MLGraphBuilder(OperatorMethods):
    """Records a graph on `context` (WebNN ``new MLGraphBuilder(context)``): declare inputs and
    constants, call operator methods on the operands they return, then `build_sync` once.

    Every operator of the WebNN specification is a method, with the spec's operands (by their
    spec names), options (as keyword arguments), defaults, broadcasting rules, data types and
    output shapes; each validates at the call and raises TypeError naming the operator, what was
    expected and what was received. After a build has started every method raises
    InvalidStateError.

    Parameters
    ----------
    context : MLContext
        The context the graph is built for.

    Raises
    ------
    TypeError
        `context` is not an MLContext.
    InvalidStateError
        The context is lost.
    """

    # IDL: [Exposed=(Window, Worker)] interface MLGraphBuilder { constructor(MLContext context); ... }

    def __init__(self, context: MLContext) -> None:
        if not isinstance(context, MLContext):
            raise TypeError(f"[MLGraphBuilder] expected an MLContext, got {type(context).__name__}")
        context._check("MLGraphBuilder")
        self._context = context
        self._inputs: dict[str, MLOperand] = {}
        self._nodes: list[Node] = []
        self._built = False
        # Set by an importer reading weights in place from a mapped file (onnx/weights.py):
        # called as the build uploads them, to drop the mapped pages from memory
        self._release_host: Callable[..., Any] | None = None
        self._dims: dict[str, int] = {}  # dynamic dimension name -> max size (dynamic/dims.py)
        # Checks only a dispatch can make: (size expression, what) that must be >= 1, and
        # (a, b, what) that must be equal
        self._constraints: list[tuple[str, Any, Any, str]] = []

    # -- shared validation helpers used by every operator file --------------------------------

    def _check_state(self, where: str) -> None:
        self._context._check(where)
        if self._built:
            raise InvalidStateError(f"[{where}] the builder has already built a graph")

    def _operand(self, x: object, where: str, what: str = "input") -> MLOperand:
        if not isinstance(x, MLOperand):
            raise TypeError(f"[{where}] {what} must be an MLOperand, got {type(x).__name__}")
        if x._builder is not self:
            raise TypeError(f"[{where}] {what} was created by another MLGraphBuilder")
        return x

    def _emit(
        self,
        op: str,
        inputs: Sequence[MLOperand | None],
        attrs: dict[str, Any],
        outs: Iterable[tuple[Any, Any]],
        label: str | None = None,
    ) -> list[MLOperand]:
        """Record a node; `outs` is a list of (data_type, shape). Returns the output operands."""
        if label is not None and not isinstance(label, str):
            raise TypeError(f"[{op}] label must be a string")
        # Every result must be a valid tensor descriptor (rank, byte length within the limit).
        checked = [self._context._tensor_args(op, dt, shape) for dt, shape in outs]
        for _, shape in checked:
            for d in shape:
                if isinstance(d, Sym) and low(d) < 1:  # positive for some sizes only: check then
                    self._require_positive(d, f"[{op}] output dimension {d}")
        node = Node(op, inputs, attrs, label)
        node.outputs = [MLOperand(self, dt, shape, "op", node=node) for dt, shape in checked]
        self._nodes.append(node)
        outputs: list[MLOperand] = node.outputs
        return outputs

    def _require_positive(self, size: Sym, what: str) -> None:
        """`size` (a Sym) must be >= 1 at dispatch; else that dispatch raises TypeError: "{what}
        is {value} for these sizes (...); it must be >= 1" (`what` names the quantity)."""
        self._constraints.append(("positive", size, None, what))

    def _require_equal(self, a: int | Sym, b: int | Sym, what: str) -> None:
        """Sizes a and b must be equal at dispatch (sizes whose names differ but that an
        operator requires equal, or a static size asked of a dynamic one)."""
        self._constraints.append(("equal", a, b, what))

    def _emit1(
        self,
        op: str,
        inputs: Sequence[MLOperand | None],
        attrs: dict[str, Any],
        data_type: str,
        shape: Sequence[int | Sym],
        label: str | None = None,
    ) -> MLOperand:
        return self._emit(op, inputs, attrs, [(data_type, shape)], label)[0]

    # -- inputs and constants -----------------------------------------------------------------

    # IDL: MLOperand input(USVString name, MLOperandDescriptor descriptor);
    def input(self, name: str, *, data_type: str | np.dtype, shape: Sequence[int | MLDynamicDimension]) -> MLOperand:
        """Declare a graph input (bound to the tensor of that name at each dispatch).

        Parameters
        ----------
        name : str
            A non-empty name, unique among the builder's inputs.
        data_type : str or numpy.dtype
            The input's data type ("float32", ... or a numpy dtype).
        shape : sequence of int or MLDynamicDimension
            The sizes. An `MLDynamicDimension` entry (Python extension, webnn issue #883) makes the
            graph serve every size up to its maximum, the size coming from each dispatch's tensor.

        Returns
        -------
        MLOperand
            The input operand.

        Raises
        ------
        TypeError
            An empty or repeated name, or an invalid descriptor.
        InvalidStateError
            A build has started, or the context is lost.
        """
        self._check_state("input")
        if not isinstance(name, str) or not name:
            raise TypeError(f"[input] name must be a non-empty string, got {name!r}")
        if name in self._inputs:
            raise TypeError(f"[input] an input named {name!r} already exists")
        parsed = parse_shape(shape, "input", self._dims)
        dt, checked = self._context._tensor_args("input", data_type, parsed)
        x = MLOperand(self, dt, checked, "input", name=name)
        self._inputs[name] = x
        return x

    # IDL: MLOperand constant(MLOperandDescriptor descriptor, AllowSharedBufferSource buffer);
    # IDL: MLOperand constant(MLOperandDataType type, MLNumber value);
    # IDL: MLOperand constant(MLTensor tensor);
    def constant(
        self,
        *args: Any,
        data_type: str | np.dtype | None = None,
        shape: Sequence[int] | None = None,
        data: BufferLike | None = None,
        value: float | None = None,
    ) -> MLOperand:
        """A constant operand, in one of four forms: ``constant(ndarray)`` (data type and shape from
        the array); ``constant(data_type=, shape=, data=)``; ``constant(data_type=, value=)`` (a
        scalar); ``constant(tensor)`` (a tensor from `MLContext.create_constant_tensor_sync`). The
        bytes are copied at the call; constants are uploaded once per context at build.

        Parameters
        ----------
        *args : numpy.ndarray or MLTensor
            At most one: an array (or anything numpy.asarray takes), or a constant tensor.
        data_type : str or numpy.dtype or None, default None
            The data type; with an array it may restate the array's.
        shape : sequence of int or None, default None
            The sizes; with an array it may restate (or reshape) the array's.
        data : buffer or None, default None
            Anything with the buffer protocol, of the byte length `data_type` and `shape` give.
        value : float or None, default None
            A scalar's value (with `data_type`, without `shape` and `data`).

        Returns
        -------
        MLOperand
            The constant operand.

        Raises
        ------
        TypeError
            More than one positional argument, a form missing its arguments, mismatching dtypes or
            byte lengths, or a tensor that is not constant.
        InvalidStateError
            A build has started, or the context is lost.
        """
        self._check_state("constant")
        where = "constant"
        if len(args) > 1:
            raise TypeError(f"[{where}] takes one positional argument, got {len(args)}")
        if args:
            src = args[0]
            if isinstance(src, MLTensor):
                ctx = self._context
                ctx._check_tensor(src, where)
                if not src.constant:
                    raise TypeError(f"[{where}] the tensor was not created with create_constant_tensor")
                return MLOperand(self, src.data_type, src.shape, "constant", value=src)
            if isinstance(src, str) and value is None and data is None:
                data_type, value = src, None
            else:
                arr = np.asarray(src)
                dt = dtypes.normalize(arr.dtype if data_type is None else data_type, where)
                if arr.dtype != dtypes.NUMPY[dt]:
                    raise TypeError(f"[{where}] array dtype {arr.dtype} differs from data_type {dt}")
                target: tuple[Any, ...] = arr.shape if shape is None else as_shape(shape, where)
                self._context._tensor_args(where, dt, target)
                if tuple(target) != arr.shape and arr.size != int(np.prod(target, dtype=np.int64)):
                    raise TypeError(f"[{where}] array of shape {arr.shape} does not fit shape {list(target)}")
                return MLOperand(self, dt, target, "constant", value=np.array(arr).reshape(target))
        return self._constant_args(where, data_type, shape, data, value)

    def _constant_nocopy(self, arr: npt.NDArray[Any]) -> MLOperand:
        """constant(arr) without the copy, for importers whose arrays nobody changes afterwards
        (weights read in place from a model file: onnx/weights.py). The graph uploads them at
        build and forgets them."""
        self._check_state("constant")
        dt = dtypes.normalize(arr.dtype, "constant")
        self._context._tensor_args("constant", dt, arr.shape)
        return MLOperand(self, dt, arr.shape, "constant", value=arr)

    def _constant_args(self, where: str, data_type: Any, shape: Any, data: Any, value: Any) -> MLOperand:
        if data_type is None:
            raise TypeError(f"[{where}] data_type is required")
        dt = dtypes.normalize(data_type, where)
        if value is not None:
            if data is not None or shape is not None:
                raise TypeError(f"[{where}] give either value (a scalar) or shape and data")
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"[{where}] value must be a number, got {value!r}")
            return MLOperand(self, dt, (), "constant", value=np.array(value).astype(dtypes.NUMPY[dt]))
        if shape is None or data is None:
            raise TypeError(f"[{where}] shape and data are required (or a scalar value)")
        dt, shape = self._context._tensor_args(where, dt, shape)
        raw = bytes_of(data, dt, dtypes.byte_length(dt, shape), where)
        arr = np.frombuffer(bytes(raw), dtype=dtypes.NUMPY[dt]).reshape(shape)
        return MLOperand(self, dt, shape, "constant", value=arr)

    # -- build ---------------------------------------------------------------------------------

    def _check_outputs(self, outputs: object, where: str) -> dict[str, MLOperand]:
        self._check_state(where)
        if not isinstance(outputs, dict) or not outputs:
            raise TypeError(f"[{where}] outputs must be a non-empty dict of name -> MLOperand")
        for name, op in outputs.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"[{where}] output names must be non-empty strings, got {name!r}")
            self._operand(op, where, f"output {name!r}")
            if op._kind != "op":
                raise TypeError(f"[{where}] output {name!r} is an {op._kind} operand, not an operator result")
        return dict(outputs)

    # IDL: Promise<MLGraph> build(MLNamedOperands outputs);
    def build_sync(self, outputs: Mapping[str, MLOperand]) -> MLGraph:
        """Compile the graph computing `outputs` and return it (WebNN ``build``).

        Only nodes the outputs depend on are kept; constant subgraphs are computed once;
        elementwise chains, activations and attention fuse (see `MLGraph.kernel_names`).

        Parameters
        ----------
        outputs : mapping of str to MLOperand
            The graph's outputs by name: operator results of this builder.

        Returns
        -------
        MLGraph
            The compiled graph.

        Raises
        ------
        TypeError
            No outputs, an empty name, or an output that is an input or constant operand (the
            builder stays usable).
        InvalidStateError
            A second build, or the context is lost.
        OperationError
            The graph fails to compile.
        """
        checked = self._check_outputs(outputs, "build")
        self._built = True
        return _compile(self, checked)

    def build_async(self, outputs: Mapping[str, MLOperand]) -> Awaitable[MLGraph]:
        checked = self._check_outputs(outputs, "build")
        self._built = True

        async def build() -> MLGraph:
            return _compile(self, checked)

        return awaitable(build())

    build_async.__doc__ = async_doc(build_sync, "Awaitable[MLGraph]\n    The compiled graph.")


def _compile(builder: MLGraphBuilder, outputs: Mapping[str, MLOperand]) -> MLGraph:
    """compile_graph, with failures of the GPU side reported as WebNN's OperationError."""
    # start-up: a process whose graphs all come from the graph cache never imports the compiler
    # (about 22 ms of imports on a 2-core host; tests/test_layers.py DEFERRED)
    from ..compiler.build import compile_graph

    try:
        graph = MLGraph(builder._context, compile_graph(builder, outputs))
        forget_host_constants(builder)  # uploaded: the graph never needs the host copies again
        return graph
    except (TypeError, DOMException):
        raise
    except Exception as e:
        raise OperationError(f"[build] compilation failed: {type(e).__name__}: {e}") from e


def forget_host_constants(builder: MLGraphBuilder) -> None:
    """A built builder builds nothing more: drop its host copies of the weights (uploaded)."""
    for n in builder._nodes:
        for x in n.inputs:
            if x is not None and x._kind == "constant" and not isinstance(x._value, MLTensor):
                x._value = None


attach(MLGraphBuilder)  # the operator methods (each ops family registers them with @builder_op)
