// Data movement on the compute form (u32 elements; u64 or u64e for 64-bit integers): one thread
// per element of the iteration space.
// copy:   dst[dst_index] = src[src_index], both flat indices built in Python from the sizes and
//         strides (WGSL constants, or read from `dims` at dispatch for dynamic dimensions:
//         mltensor/dynamic/) (transpose, slice, split, concat slabs).
// rows:   the same copy with dynamic sizes, over a 2-D launch: workgroup row `o` = wid.y indexes
//         the outer dimensions, `i` the elements of one row (the innermost dynamic dimension and
//         the static ones inside it), so no thread divides by a size read at dispatch.
// pad, gather: per-thread body generated in Python (see mltensor/ops/movement.py).
{{ bindings }}
{$ include "common.wgsl" $}

{$ if mode == "rows" $}
@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wid.x * {{ WORKGROUP }}u + lid;
    if (i >= {{ row }}) { return; }
    let o = wid.y;
    dst[{{ dst_index }}] = src[{{ src_index }}];
{$ else $}
{{ main_1d(n) }}
{$ if mode == "copy" $}
    dst[{{ dst_index }}] = src[{{ src_index }}];
{$ else $}
{{ body }}
{$ endif $}
{$ endif $}
}
