"""What a build produces and a dispatch binds: the caller's tensor slots (`Ext`) a launch's
buffers name, and the bind-group resources of its buffers (whole, or a view)."""

from dataclasses import dataclass


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
