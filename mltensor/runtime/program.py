"""Program: what a build produces and a dispatch binds, as one value.

compiler/build.py `compile_graph` makes one from a builder, graphcache/recipe.py `rebuild` from a
saved recipe (and `capture` turns one back into a recipe), and front/graph.py `MLGraph(ctx,
program)` dispatches it. A new piece of per-graph state a dispatch needs is a field here, so the
graph cache sees it.

Also here: the caller's tensor slots (`Ext`) a launch's buffers name, the bind-group resources of
a launch's buffers (whole, or a view), and `instantiate`, which makes the pipelines and fixed bind
groups of a list of launches (a build's, a loaded graph's).
"""

from dataclasses import dataclass

from ..dynamic.plan import DynamicPlan
from .wgsl import pipeline


@dataclass(frozen=True, eq=False)
class Ext:
    """A caller's tensor slot: ("in" | "out", name), bound at dispatch."""

    kind: str
    name: str
    data_type: str
    shape: tuple


def resource_of(b):
    """Bind-group resource of a whole buffer, or of a view (buffer, (offset, size))."""
    if b.__class__ is tuple:
        return {"buffer": b[0], "offset": b[1][0], "size": b[1][1]}
    return {"buffer": b}


def ext_of(b):
    """The caller's tensor slot a binding names (whole, or a view of it), else None."""
    if b.__class__ is tuple:
        b = b[0]
    return b if isinstance(b, Ext) else None


def instantiate(device, launches, lazy=()):
    """[pipeline, bind group layout, buffers, groups, bind group | None] for each launch given as
    (kernel, buffers, groups), buffers being GPUBuffers, Ext slots or views (buffer, (offset,
    size)). A launch binding a caller's tensor gets its bind group at dispatch (None here); the
    launches whose index is in `lazy` get neither pipeline nor bind group ([None, None, buffers,
    groups, None]: MLGraph._create makes them at the first dispatch that runs them). The kernels
    were compiled before (runtime/compile.py compile_kernels): this takes their pipelines from
    the cache."""
    out = []
    for i, (kernel, bufs, groups) in enumerate(launches):
        entry = [None, None, bufs, groups, None]
        if i not in lazy:
            entry[0], entry[1] = pipe, bgl = pipeline(device, kernel)
            if not any(ext_of(b) for b in bufs):
                entry[4] = device.create_bind_group(
                    layout=bgl, entries=[{"binding": j, "resource": resource_of(b)} for j, b in enumerate(bufs)]
                )
        out.append(entry)
    return out


class Program:
    """A built graph's launches and buffers, what front/graph.py MLGraph dispatches:

    - inputs / outputs: name -> (data type, shape) (dynamic dimensions as Syms);
    - kernels: the Kernel of each launch, in order; launches: each launch's [pipeline, bind group
      layout, buffers, groups, bind group | None] (`instantiate`; pipeline None: made at the first
      dispatch that runs it);
    - pool: the pooled intermediate buffers; folded: buffers of values computed once at build (the
      graph's own); shared: constant buffers of the context's store (runtime/constants.py), one
      reference each; keep: constant tensors bound in place (kept alive with the graph);
    - unwarmed: kernels for Mesa's warm-up at the first dispatch (dynamic dimensions);
    - sources: each launch's WGSL when known (a loaded graph: for its lazy launches), else None;
    - kernel_names, fusion_notes, memory, autotune: what MLGraph reports of the build
      (fusion_notes: (kind, op, label, reason) of what fusion left undone, compiler/fusion/report.py);
    - dyn_args: what `dyn`, the DynamicPlan of a graph with dynamic dimensions, is made from (None
      without them).
    """

    def __init__(
        self,
        inputs,
        outputs,
        kernels,
        launches,
        pool,
        folded=(),
        shared=(),
        keep=(),
        unwarmed=(),
        sources=None,
        kernel_names=(),
        fusion_notes=(),
        memory=None,
        autotune=None,
        dyn_args=None,
    ):
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        self.kernels = list(kernels)
        self.launches = launches
        self.pool = list(pool)
        self.folded = list(folded)
        self.shared = list(shared)
        self.keep = list(keep)
        self.unwarmed = list(unwarmed)
        self.sources = None if sources is None else list(sources)
        self.kernel_names = list(kernel_names)
        self.fusion_notes = [tuple(x) for x in fusion_notes]
        self.memory = dict(memory) if memory is not None else {}
        self.autotune = dict(autotune) if autotune is not None else {"seconds": 0.0, "signatures_tuned": 0}
        self.dyn_args = dyn_args
        self.dyn = DynamicPlan(*dyn_args) if dyn_args is not None else None
