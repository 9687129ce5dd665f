"""Small argument helpers shared by the front objects."""

import asyncio


def as_shape(shape, where, allow_zero=False):
    """A shape as a tuple of ints; TypeError for anything that is not a sequence of dims > 0."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"[{where}] shape must be a sequence of integers, got {shape!r}")
    from ..dynamic.dims import Sym

    out = []
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


def awaitable(coro):
    """The `_async` half of a pair: a Task when a loop runs (so creating it is enough to start
    it), else the coroutine itself."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return coro
    return loop.create_task(coro)
