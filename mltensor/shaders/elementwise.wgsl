// A fused chain of elementwise operators: one thread per output element (or per vec4 of them).
// Sizes may be launch parameters (u(): dynamic/kernels.py SizeParams).
// `fns` is the chain as a function of the output index (elementwise.py group_fn, scalar path);
// the vec4 path's `loads` read each external input and `body` evaluates the chain per lane.
{{ bindings }}
{$ include "common.wgsl" $}
{{ fns }}

{$ if grid is defined $}
// A grid launch (a broadcasting chain, elementwise.py _lower_grid): thread (x, y) of workgroup
// (gx, gy, z) is output element (z, y, x) of the output merged into 3 dimensions.
@compute @workgroup_size({{ grid.wx }}, {{ grid.wy }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let sx = {{ u(grid.sx) }};
    let sy = {{ u(grid.sy) }};
    let cx = wid.x * {{ grid.wx }}u + lid.x;
    let cy = wid.y * {{ grid.wy }}u + lid.y;
    if (cx >= sx || cy >= sy) { return; }
    let cz = wid.z;
    let i = (cz * sy + cy) * sx + cx;
{$ else $}
{{ main_1d(n) }}
{$ endif $}
{{ loads }}
{{ body }}
    out[i] = {{ result }};
}
