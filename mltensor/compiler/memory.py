"""The memory plan: intermediates share a few pooled buffers, assigned by liveness. A buffer is
reused as soon as the last launch reading its previous value has been recorded (compiler/build.py
runs it over the lowered launches; the pool's sizes become the Program's `pool`)."""

from .. import dtypes
from .lower import Scratch, compute_nbytes


def plan_memory(arg_lists, is_temp, nbytes=compute_nbytes):
    """Assign pooled buffers to intermediate values by liveness. `arg_lists` holds each launch's
    arguments, aliases already resolved to their roots; nbytes(value) is a value's size in compute
    form (KernelContext.nbytes). Returns (assign, sizes): assign maps id(value) -> pool index,
    sizes the byte size of each pool buffer."""
    first, last, size, order = {}, {}, {}, []
    for i, args in enumerate(arg_lists):
        for r in args:
            if not is_temp(r):
                continue
            k = id(r)
            if k not in first:
                first[k] = i
                order.append(k)
                size[k] = r.nbytes if isinstance(r, Scratch) else nbytes(r)
            last[k] = i
    starts = {}
    for k in order:
        starts.setdefault(first[k], []).append(k)
    ends = {}
    for k in order:
        ends.setdefault(last[k], []).append(k)
    assign, sizes, free = {}, [], []
    for i in range(len(arg_lists)):
        for k in starts.get(i, ()):
            need = size[k]
            # best fit among free buffers, else grow the largest free one, else a new buffer
            fit = [b for b in free if sizes[b] >= need]
            if fit:
                b = min(fit, key=lambda b: sizes[b])
            elif free:
                b = max(free, key=lambda b: sizes[b])
                sizes[b] = need
            else:
                b = len(sizes)
                sizes.append(need)
            if b in free:
                free.remove(b)
            assign[k] = b
        for k in ends.get(i, ()):
            free.append(assign[k])
    return assign, [dtypes.padded(s) for s in sizes]
