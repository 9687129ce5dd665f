// Data movement on the compute form (u32 elements; u64 or u64e for 64-bit integers): one thread
// per element of the iteration space.
// copy:   dst[dst_index] = src[src_index], both flat indices built in Python from baked sizes and
//         strides (transpose, slice, split, concat slabs).
// pad, gather: per-thread body generated in Python (see mltensor/ops/movement.py).
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{$ if mode == "copy" $}
    dst[{{ dst_index }}] = src[{{ src_index }}];
{$ else $}
{{ body }}
{$ endif $}
}
