// resample2d of a 4-D tensor at flat output index i, reading {{ rs.src }}: dims rs.axes[0] (h) and
// rs.axes[1] (w) are resampled. The source coordinate along each is the exact rational
// (A*o + B) / D (see mltensor/ops/resample.py), clamped to [0, last]. Included by resample.wgsl
// and by conv2d.wgsl (a convolution resampling its input as it loads it).

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

// (offset of the non-resampled dims in the source, output h, output w) of output index i:
// the coordinates c0..c3 of i in the output (row-major), straight-line.
fn rs_coords(i: u32) -> vec3<u32> {
    let c3 = i % {{ rs.out_shape[3] }}u;
    let c2 = (i / {{ rs.out_shape[3] }}u) % {{ rs.out_shape[2] }}u;
    let c1 = (i / {{ rs.out_shape[3] * rs.out_shape[2] }}u) % {{ rs.out_shape[1] }}u;
    let c0 = i / {{ rs.out_shape[3] * rs.out_shape[2] * rs.out_shape[1] }}u;
    let base = 0u{$ for d in range(4) $}{$ if d != rs.axes[0] and d != rs.axes[1] $} + c{{ d }} * {{ rs.in_strides[d] }}u{$ endif $}{$ endfor $};
    return vec3<u32>(base, c{{ rs.axes[0] }}, c{{ rs.axes[1] }});
}

{$ if rs.mode == "nearest-neighbor" $}
// Source index of output element i.
fn rs_index(i: u32) -> u32 {
    let b = rs_coords(i);
    let cy = nearest(b.y, {{ rs.h_near[0] }}, {{ rs.h_near[1] }}, {{ rs.h_near[2] }}u, {{ rs.h_last }}u);
    let cx = nearest(b.z, {{ rs.w_near[0] }}, {{ rs.w_near[1] }}, {{ rs.w_near[2] }}u, {{ rs.w_last }}u);
    return b.x + cy * {{ rs.in_strides[rs.axes[0]] }}u + cx * {{ rs.in_strides[rs.axes[1]] }}u;
}
{$ else $}
// Bilinear value of output element i, in f32 (f32() of an f16 sample widens it).
fn rs_linear(i: u32) -> f32 {
    let b = rs_coords(i);
    let cy = coord(b.y, {{ rs.h_rat[0] }}, {{ rs.h_rat[1] }}, {{ rs.h_rat[2] }}, {{ rs.h_last }});
    let cx = coord(b.z, {{ rs.w_rat[0] }}, {{ rs.w_rat[1] }}, {{ rs.w_rat[2] }}, {{ rs.w_last }});
    let y0 = u32(floor(cy));
    let x0 = u32(floor(cx));
    let y1 = min(y0 + 1u, {{ rs.h_last }}u);
    let x1 = min(x0 + 1u, {{ rs.w_last }}u);
    let ty = cy - floor(cy);
    let tx = cx - floor(cx);
    let r0 = b.x + y0 * {{ rs.in_strides[rs.axes[0]] }}u;
    let r1 = b.x + y1 * {{ rs.in_strides[rs.axes[0]] }}u;
    let sx0 = x0 * {{ rs.in_strides[rs.axes[1]] }}u;
    let sx1 = x1 * {{ rs.in_strides[rs.axes[1]] }}u;
    let vy0 = f32({{ rs.src }}[r0 + sx0]) * (1.0 - tx) + f32({{ rs.src }}[r0 + sx1]) * tx;
    let vy1 = f32({{ rs.src }}[r1 + sx0]) * (1.0 - tx) + f32({{ rs.src }}[r1 + sx1]) * tx;
    return vy0 * (1.0 - ty) + vy1 * ty;
}
{$ endif $}
