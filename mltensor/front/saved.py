"""MLContext's graph cache methods (webnn cache-explainer.md; the store is mltensor/graphcache/):
save_graph, load_graph, list_graphs, delete_graph, bound in MLContext's class body as `dispatch`
is (front/context.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, TypeVar

from ..errors import InvalidStateError, NotFoundError, OperationError, gpu_errors
from ._util import async_doc, awaitable
from .graph import MLGraph

# (self is the MLContext: not imported, context.py imports this module)

_T = TypeVar("_T")


def _graph_store() -> ModuleType:
    """graphcache/store.py, imported at the first graph-cache call: `import mltensor` alone never
    loads the cache's modules (pickle, hashlib with OpenSSL: about 5 ms and 4 MB of a start)."""
    from ..graphcache import store  # start-up (tests/test_layers.py DEFERRED)

    return store


def _graph_key(key: object, where: str) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"[{where}] key must be a non-empty string, got {key!r}")
    return key


# IDL (proposal): Promise<undefined> saveGraph(DOMString key, MLGraph graph);
def save_graph_sync(self: Any, key: str, graph: MLGraph) -> None:
    """Store a built graph on disk under `key` for this adapter: its kernels, memory plan,
    autotuning choices and constants, so that `load_graph_sync` in a later process skips import,
    compilation passes and WGSL generation. Replaces an entry of the same key.

    Parameters
    ----------
    key : str
        A non-empty name.
    graph : MLGraph
        A graph of this context.

    Raises
    ------
    TypeError
        An empty key, or a graph of another context.
    InvalidStateError
        The graph is destroyed or the context lost.
    OperationError
        The graph cache cannot be written.
    """

    where = "save_graph"
    key = _graph_key(key, where)
    if not isinstance(graph, MLGraph):
        raise TypeError(f"[{where}] graph must be an MLGraph, got {type(graph).__name__}")
    if graph._context is not self:
        raise TypeError(f"[{where}] the graph belongs to another MLContext")
    self._check(where)
    if graph._destroyed:
        raise InvalidStateError(f"[{where}] the graph is destroyed")
    with gpu_errors(where):
        try:
            _graph_store().save(self, key, graph._program)
        except OSError as e:
            raise OperationError(
                f"[{where}] the graph cache at {_graph_store().root()} cannot be written: {e}"
            ) from None


def save_graph_async(self: Any, key: str, graph: MLGraph) -> Awaitable[None]:
    return _later(self.save_graph_sync, key, graph)


save_graph_async.__doc__ = async_doc(save_graph_sync, "Awaitable[None]\n    Done when the graph is stored.")


# IDL (proposal): Promise<MLGraph> loadGraph(DOMString key);
def load_graph_sync(self: Any, key: str) -> MLGraph:
    """The graph `save_graph_sync` stored under `key` (on this adapter, by this version of mltensor).

    Parameters
    ----------
    key : str
        The name it was saved under.

    Returns
    -------
    MLGraph
        The graph, ready to dispatch.

    Raises
    ------
    NotFoundError
        No graph is stored under `key`, or it was stale or corrupt.
    """
    where = "load_graph"
    key = _graph_key(key, where)
    self._check(where)
    with gpu_errors(where):
        hit = _graph_store().load(self, key)
    if hit is None:
        raise NotFoundError(f"[{where}] no graph is cached under {key!r} for this adapter")
    return MLGraph(self, hit[0])


def load_graph_async(self: Any, key: str) -> Awaitable[MLGraph]:
    return _later(self.load_graph_sync, key)


load_graph_async.__doc__ = async_doc(load_graph_sync, "Awaitable[MLGraph]\n    The graph.")


# IDL (proposal): Promise<sequence<DOMString>> listGraphs();
def list_graphs_sync(self: Any) -> list[str]:
    """The keys of the graphs `load_graph_sync` can load here.

    Returns
    -------
    list of str
        The keys, sorted.
    """
    self._check("list_graphs")
    return sorted(_graph_store().keys(self))


def list_graphs_async(self: Any) -> Awaitable[list[str]]:
    return _later(self.list_graphs_sync)


list_graphs_async.__doc__ = async_doc(list_graphs_sync, "Awaitable[list[str]]\n    The keys, sorted.")


# IDL (proposal): undefined deleteGraph(DOMString key);
def delete_graph(self: Any, key: str) -> None:
    """Remove the graph stored under `key` for this adapter (nothing happens when there is none).

    Parameters
    ----------
    key : str
        The name it was saved under.
    """
    _graph_store().delete(self, _graph_key(key, "delete_graph"))


def _later(fn: Callable[..., _T], *args: Any) -> Awaitable[_T]:
    """The _async form of a call that does its work at once: an awaitable of its result (its
    error raised at the await)."""

    async def run() -> _T:
        return fn(*args)

    return awaitable(run())
