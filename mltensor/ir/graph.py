"""The graph IR the builder records and the compiler reads: MLOperand (a value), Node (one
operator call), and the queries on them that the compiler's passes and the operators' lowerings
share. Pure Python: no wgpu, no templates (the bottom of the build path, CONTRIBUTING.md)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..dynamic.dims import Sym, is_static


class MLOperand:
    """A value in a graph being built: a graph input, a constant, or an operator's output.

    Returned by `MLGraphBuilder.input`, `constant` and every operator method, and passed to
    other operator methods of the same builder; it holds no data."""

    # IDL: interface MLOperand { readonly attribute MLOperandDataType dataType; readonly attribute FrozenArray<unsigned long> shape; }
    __slots__ = ("_builder", "_data_type", "_shape", "_kind", "_node", "_name", "_value", "__weakref__")

    def __init__(
        self,
        builder: Any,  # its MLGraphBuilder (front/, a floor above)
        data_type: str,
        shape: Iterable[int | Sym],
        kind: str,
        node: Node | None = None,
        name: str | None = None,
        value: Any = None,
    ) -> None:
        self._builder = builder
        self._data_type = data_type
        self._shape = tuple(shape)
        self._kind = kind  # "input" | "constant" | "op"
        self._node = node
        self._name = name
        self._value = value  # constant: numpy array in the operand's data type, or an MLTensor

    @property
    def data_type(self) -> str:
        """The WebNN data type, a string such as "float32"."""
        return self._data_type

    # Entries are ints, or Syms for dynamic dimensions (each has .name and .max_size, as
    # MLDynamicDimension; derived ones are expressions such as "past + 1").
    @property
    def shape(self) -> tuple[int | Sym, ...]:
        """The shape, a tuple. Entries are ints, or for dynamic dimensions size expressions with
        `.name` and `.max_size` (derived ones read like "past + 1")."""
        return self._shape

    @property
    def rank(self) -> int:
        """Python extension: the number of dimensions, `len(shape)`."""
        return len(self._shape)

    @property
    def dynamic(self) -> bool:
        """Python extension: some dimension is known only at dispatch."""
        return not is_static(self._shape)

    @property
    def size(self) -> int | Sym:
        """Python extension: the number of elements (a size expression when dynamic)."""
        n: int | Sym = math.prod(self._shape)
        return n

    def __repr__(self) -> str:
        what = self._name or (self._node.op if self._node else self._kind)
        return f"<MLOperand {what} {self._data_type} {list(self._shape)}>"


class Node:
    """One operator call: op name, operand inputs (None for absent optional ones), attributes."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "label")

    def __init__(self, op: str, inputs: Iterable[MLOperand | None], attrs: dict[str, Any], label: str | None) -> None:
        self.op = op
        self.inputs = list(inputs)
        self.attrs = attrs
        self.outputs: list[MLOperand] = []
        self.label = label

    def __repr__(self) -> str:
        return f"<Node {self.op}{' ' + self.label if self.label else ''}>"


def as_shape(shape: Any, where: str, allow_zero: bool = False) -> tuple[int | Sym, ...]:
    """A shape as a tuple of ints; TypeError for anything that is not a sequence of dims > 0."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"[{where}] shape must be a sequence of integers, got {shape!r}")
    out: list[int | Sym] = []
    for d in shape:
        if isinstance(d, Sym):  # a dynamic dimension (its bounds are checked where it is made)
            out.append(d)
            continue
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"[{where}] shape dimensions must be integers, got {shape!r}")
        d = int(d)
        if d < 0 or (d == 0 and not allow_zero):
            raise TypeError(f"[{where}] shape dimensions must be positive, got {tuple(shape)!r}")
        if d > 0xFFFFFFFF:
            raise TypeError(f"[{where}] dimension {d} is larger than 2**32-1")
        out.append(d)
    return tuple(out)


def live_nodes(builder: Any, outputs: Mapping[str, MLOperand]) -> list[Node]:
    """Nodes reachable from the outputs, in creation (= topological) order."""
    needed = set()
    stack = [v for v in outputs.values()]
    while stack:
        v = stack.pop()
        n = v._node
        if n is None or id(n) in needed:
            continue
        needed.add(id(n))
        stack.extend(x for x in n.inputs if x is not None)
    return [n for n in builder._nodes if id(n) in needed]


def external_inputs(nodes: Iterable[Node]) -> list[MLOperand]:
    """Distinct values a group of nodes reads that it does not produce (its kernel's inputs)."""
    produced = {id(v) for n in nodes for v in n.outputs}
    seen: set[int] = set()
    out: list[MLOperand] = []
    for n in nodes:
        for x in n.inputs:
            if x is not None and id(x) not in produced and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
    return out


def scalar_value(v: MLOperand | None) -> float | None:
    """The value of a host constant with one element, else None."""
    if v is None or v._kind != "constant" or not isinstance(v._value, np.ndarray) or v._value.size != 1:
        return None
    return float(np.asarray(v._value, dtype=np.float64).reshape(()))


def inline_scalar(v: MLOperand) -> float | None:
    """The value of a float32/float16 host constant of one element (fused epilogues write it
    as a literal instead of binding it), else None."""
    if v.data_type not in ("float32", "float16"):
        return None
    return scalar_value(v)


def topological(nodes: list[Node], key: Mapping[int, Any]) -> list[Node] | None:
    """`nodes` in topological order, ties broken by key[id(node)] then list order (a pass that
    replaces nodes keeps the original order where it is free), or None on a cycle."""
    prod = {id(v): n for n in nodes for v in n.outputs}
    deps = {id(n): {id(prod[id(x)]) for x in n.inputs if x is not None and id(x) in prod} - {id(n)} for n in nodes}
    users: dict[int, list[Node]] = {}
    for n in nodes:
        for d in deps[id(n)]:
            users.setdefault(d, []).append(n)
    byid = {id(n): n for n in nodes}
    pos = {id(n): i for i, n in enumerate(nodes)}
    heap = [(key[id(n)], i, id(n)) for i, n in enumerate(nodes) if not deps[id(n)]]
    heapq.heapify(heap)
    left = {k: len(v) for k, v in deps.items()}
    out: list[Node] = []
    while heap:
        _, _, k = heapq.heappop(heap)
        out.append(byid[k])
        for u in users.get(k, ()):
            left[id(u)] -= 1
            if left[id(u)] == 0:
                heapq.heappush(heap, (key[id(u)], pos[id(u)], id(u)))
    return out if len(out) == len(nodes) else None
