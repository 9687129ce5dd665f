// resample2d of a 4-D tensor at flat output index i, reading {{ rs.src }}: dims rs.axes[0] (h) and
// rs.axes[1] (w) are resampled. The source coordinate along each is the exact rational
// (A*o + B) / D (see mltensor/ops/resample.py), clamped to [0, last]. Included by resample.wgsl
// and by conv2d.wgsl (a convolution resampling its input as it loads it).
{# Sizes known only at dispatch (Syms, mltensor/dynamic/) render through u() (u32) and ii() (i32);
   a resampled dimension whose coordinate map depends on them has rs.h_dyn / rs.w_dyn (rs_rat's
   arguments) and its A, B, D (and the nearest rounding's) as WGSL expressions over rh / rw.
   rs.coords (dynamic output shapes) splits the output index with chained quotients (through
   common.wgsl's div_fast where the index stays small). #}
{$ macro ii(v) $}{$ if v is number or v is string $}{{ v }}{$ else $}i32({{ u(v) }}){$ endif $}{$ endmacro $}
{$ macro uu(v) $}{$ if v is string $}{{ v }}{$ else $}{{ u(v) }}{$ endif $}{$ endmacro $}

// Nearest sample index of output index o: floor((A*o + B) / D) with D > 0, clamped to [0, last]
// (the rounding mode is folded into A, B, D in Python). Only non-negative numbers are divided:
// a negative numerator is a sample left of 0, and rounding commutes with the clamp.
fn nearest(o: u32, A: i32, B: i32, D: u32, last: u32) -> u32 {
    let num = A * i32(o) + B;
    return select(min(u32(num) / D, last), 0u, num < 0);
}

fn coord(o: u32, A: i32, B: i32, D: i32, last: i32) -> f32 {
    return clamp(f32(A * i32(o) + B) / f32(D), 0.0, f32(last));
}
{$ if rs.h_dyn is defined or rs.w_dyn is defined $}

fn rs_gcd(a: u32, b: u32) -> u32 {
    var x = a;
    var y = b;
    while (y != 0u) {
        let t = x % y;
        x = y;
        y = t;
    }
    return x;
}

// (A, B, D) of a dimension resampled from n_in to n_out (sizes read at dispatch): _rational of
// mltensor/ops/resample.py, reduced by the same gcd. kind: 0 half_pixel, 1 pytorch_half_pixel,
// 2 align_corners, 3 asymmetric.
fn rs_rat(kind: u32, n_in: u32, n_out: u32) -> vec3<i32> {
    if ((kind == 1u || kind == 2u) && n_out == 1u) { return vec3<i32>(0, 0, 1); }
    if (kind == 2u) {
        let g = max(rs_gcd(n_in - 1u, n_out - 1u), 1u);
        return vec3<i32>(i32((n_in - 1u) / g), 0, i32((n_out - 1u) / g));
    }
    let g = rs_gcd(n_in, n_out);
    let i = i32(n_in / g);
    let o = i32(n_out / g);
    if (kind == 3u) { return vec3<i32>(i, 0, o); }
    return vec3<i32>(2 * i, i - o, 2 * o);
}
{$ endif $}

{$ if rs_grid is not defined $}
// (offset of the non-resampled dims in the source, output h, output w) of output index i:
// the coordinates c0..c3 of i in the output (row-major), straight-line. (A grid launch of
// resample.wgsl has them from its workgroup ids: rs_index_at / rs_linear_at only.)
fn rs_coords(i: u32) -> vec3<u32> {
{$ if rs.coords is defined $}
{{ rs.coords }}
{$ else $}
    let c3 = i % {{ rs.out_shape[3] }}u;
    let c2 = (i / {{ rs.out_shape[3] }}u) % {{ rs.out_shape[2] }}u;
    let c1 = (i / {{ rs.out_shape[3] * rs.out_shape[2] }}u) % {{ rs.out_shape[1] }}u;
    let c0 = i / {{ rs.out_shape[3] * rs.out_shape[2] * rs.out_shape[1] }}u;
{$ endif $}
    let base = 0u{$ for d in range(4) $}{$ if d != rs.axes[0] and d != rs.axes[1] $} + c{{ d }} * {{ u(rs.in_strides[d]) }}{$ endif $}{$ endfor $};
    return vec3<u32>(base, c{{ rs.axes[0] }}, c{{ rs.axes[1] }});
}
{$ endif $}

{$ macro rats() $}
{$ for t in ("h", "w") if rs[t + "_dyn"] is defined $}
    let r{{ t }} = rs_rat({{ rs[t + "_dyn"][0] }}u, {{ rs[t + "_dyn"][1] }}, {{ rs[t + "_dyn"][2] }});
{$ endfor $}
{$ endmacro $}
{$ if rs.mode == "nearest-neighbor" $}
// Source index of the output element at b (rs_coords).
fn rs_index_at(b: vec3<u32>) -> u32 {
{$ if rs.h_dyn is defined or rs.w_dyn is defined $}{{ rats() }}{$ endif $}
    let cy = nearest(b.y, {{ ii(rs.h_near[0]) }}, {{ ii(rs.h_near[1]) }}, {{ uu(rs.h_near[2]) }}, {{ u(rs.h_last) }});
    let cx = nearest(b.z, {{ ii(rs.w_near[0]) }}, {{ ii(rs.w_near[1]) }}, {{ uu(rs.w_near[2]) }}, {{ u(rs.w_last) }});
    return b.x + cy * {{ u(rs.in_strides[rs.axes[0]]) }} + cx * {{ u(rs.in_strides[rs.axes[1]]) }};
}
{$ if rs_grid is not defined $}

// Source index of output element i.
fn rs_index(i: u32) -> u32 {
    return rs_index_at(rs_coords(i));
}
{$ endif $}
{$ else $}
// Bilinear value of the output element at b (rs_coords), in f32 (f32() of an f16 sample widens it).
fn rs_linear_at(b: vec3<u32>) -> f32 {
{$ if rs.h_dyn is defined or rs.w_dyn is defined $}{{ rats() }}{$ endif $}
    let cy = coord(b.y, {{ ii(rs.h_rat[0]) }}, {{ ii(rs.h_rat[1]) }}, {{ ii(rs.h_rat[2]) }}, {{ ii(rs.h_last) }});
    let cx = coord(b.z, {{ ii(rs.w_rat[0]) }}, {{ ii(rs.w_rat[1]) }}, {{ ii(rs.w_rat[2]) }}, {{ ii(rs.w_last) }});
    let y0 = u32(floor(cy));
    let x0 = u32(floor(cx));
    let y1 = min(y0 + 1u, {{ u(rs.h_last) }});
    let x1 = min(x0 + 1u, {{ u(rs.w_last) }});
    let ty = cy - floor(cy);
    let tx = cx - floor(cx);
    let r0 = b.x + y0 * {{ u(rs.in_strides[rs.axes[0]]) }};
    let r1 = b.x + y1 * {{ u(rs.in_strides[rs.axes[0]]) }};
    let sx0 = x0 * {{ u(rs.in_strides[rs.axes[1]]) }};
    let sx1 = x1 * {{ u(rs.in_strides[rs.axes[1]]) }};
    let vy0 = f32({{ rs.src }}[r0 + sx0]) * (1.0 - tx) + f32({{ rs.src }}[r0 + sx1]) * tx;
    let vy1 = f32({{ rs.src }}[r1 + sx0]) * (1.0 - tx) + f32({{ rs.src }}[r1 + sx1]) * tx;
    return vy0 * (1.0 - ty) + vy1 * ty;
}
{$ if rs_grid is not defined $}

// Bilinear value of output element i.
fn rs_linear(i: u32) -> f32 {
    return rs_linear_at(rs_coords(i));
}
{$ endif $}
{$ endif $}
