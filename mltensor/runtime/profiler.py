"""GPU timestamp profiler: per-kernel GPU time of one dispatch of a graph.

Each launch gets its own compute pass with begin/end timestamp writes, so kernel work can be told
apart from CPU overhead (which `bench/` measures separately). Needs the adapter feature
`timestamp-query` (requested by the context when present). Internal: used by bench/profile.py.
"""

import numpy as np
import wgpu

from ..errors import NotSupportedError


def time_launches(device, launches, repeat=3, warmup=0):
    """GPU seconds of each (pipeline, bind group, workgroups[, immediate data]) launch, each in its
    own compute pass with begin/end timestamp writes: an array of shape (repeat, len(launches)).
    The first `warmup` runs are discarded (they warm caches and clocks). A launch reading dynamic
    sizes carries their immediate data (set after its pipeline). Also the autotuner's timer."""
    n = len(launches)
    qs = device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
    resolve = device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    runs = []
    try:
        for r in range(warmup + repeat):
            enc = device.create_command_encoder()
            for i, (pipe, bg, groups, *imm) in enumerate(launches):
                p = enc.begin_compute_pass(
                    timestamp_writes={
                        "query_set": qs,
                        "beginning_of_pass_write_index": 2 * i,
                        "end_of_pass_write_index": 2 * i + 1,
                    }
                )
                p.set_pipeline(pipe)
                if imm and imm[0] is not None:
                    p.set_immediates(0, imm[0], 0, imm[0].nbytes)
                p.set_bind_group(0, bg)
                p.dispatch_workgroups(*groups)
                p.end()
            enc.resolve_query_set(qs, 0, 2 * n, resolve, 0)
            device.queue.submit([enc.finish()])
            ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64).reshape(n, 2)
            if r >= warmup:
                runs.append((ticks[:, 1] - ticks[:, 0]).astype(np.float64) * 1e-9)
    finally:
        qs.destroy()
        resolve.destroy()
    return np.stack(runs)


def profile_dispatch(ctx, graph, inputs, outputs, repeat=3):
    """[(kernel name, median GPU seconds)] for each launch of one dispatch, in launch order."""
    if "timestamp-query" not in ctx.device.features:
        raise NotSupportedError("[profile] the adapter has no timestamp-query feature")
    ctx.dispatch(graph, inputs, outputs)  # validates, warms the bind-group cache
    ctx.flush()
    tensors = [inputs[n] for n in graph._in_names] + [outputs[n] for n in graph._out_names]
    data = graph._imm_static
    if graph._dyn is not None:  # at the sizes of these inputs
        plan = graph._dyn
        data = plan.launch_data(plan.bind({n: t.shape for n, t in inputs.items()}, "profile"))
    off = data.off if data is not None else None  # (launches with no workgroups at these sizes)
    names = [n for i, n in enumerate(graph.kernel_names) if i not in set(off or ())]
    with ctx._lock:  # (bind groups made for a new tensor set, as dispatch does)
        entry = graph._replay_skipping(tensors, off)
    bound = entry[0]
    if data is not None:  # each launch's workgroups and immediates (dimensions or parameters)
        g, rows = data.run, entry[6][0]
        bound = [
            (
                pipe,
                bg,
                tuple(g[3 * i : 3 * i + 3]),
                data.imm[rows[i][0] // 4 : (rows[i][0] + rows[i][1]) // 4] if rows[i][1] else None,
            )
            for i, (pipe, bg, _) in enumerate(bound)
        ]
    med = np.median(time_launches(ctx.device, bound, repeat), axis=0)
    return list(zip(names, med.tolist()))


def format_profile(rows, top=None):
    """A text table: kernel, GPU ms, share of the total."""
    total = sum(t for _, t in rows) or 1.0
    order = sorted(rows, key=lambda r: -r[1])[: top or len(rows)]
    width = max([len(n) for n, _ in order] + [6])
    lines = [f"{'kernel':<{width}}  {'GPU ms':>9}  {'share':>6}"]
    for name, t in order:
        lines.append(f"{name:<{width}}  {t * 1e3:9.3f}  {t / total:6.1%}")
    lines.append(f"{'total (' + str(len(rows)) + ' kernels)':<{width}}  {total * 1e3:9.3f}")
    return "\n".join(lines)
