// resample2d: one thread per output element of a 4-D tensor (the sampling is resample_at.wgsl's).
{{ bindings }}
{$ include "common.wgsl" $}
{$ include "resample_at.wgsl" $}

{$ if rs_grid is defined $}
// A grid launch (NCHW resampling its last two axes, resample.py): thread (x, y) of workgroup
// (gx, gy, z) is output column x of row y of plane z (n * C + c); sizes may be launch parameters.
@compute @workgroup_size({{ rs_grid.wx }}, {{ rs_grid.wy }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let sx = {{ u(rs_grid.sx) }};
    let sy = {{ u(rs_grid.sy) }};
    let cx = wid.x * {{ rs_grid.wx }}u + lid.x;
    let cy = wid.y * {{ rs_grid.wy }}u + lid.y;
    if (cx >= sx || cy >= sy) { return; }
    let i = (wid.z * sy + cy) * sx + cx;
    let b = vec3<u32>(wid.z * {{ u(rs_grid.plane) }}, cy, cx);
{$ if rs.mode == "nearest-neighbor" $}
    dst[i] = src[rs_index_at(b)];
{$ else $}
    dst[i] = {{ rs.ST }}(rs_linear_at(b));
{$ endif $}
}
{$ else $}
{{ main_1d(n) }}
{$ if rs.mode == "nearest-neighbor" $}
    dst[i] = src[rs_index(i)];
{$ else $}
    dst[i] = {{ rs.ST }}(rs_linear(i));
{$ endif $}
}
{$ endif $}
