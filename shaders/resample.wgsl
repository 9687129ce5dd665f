// resample2d: one thread per output element of a 4-D tensor; dims axes[0] (h) and axes[1] (w)
// are resampled. The source coordinate along each is the exact rational (A*o + B) / D (see
// mltensor/ops/resample.py), clamped to [0, last].
{{ bindings }}
{$ include "common.wgsl" $}

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

{{ main_1d(n) }}
    var c: array<u32, 4>;
    c[3] = i % {{ out_shape[3] }}u;
    c[2] = (i / {{ out_shape[3] }}u) % {{ out_shape[2] }}u;
    c[1] = (i / {{ out_shape[3] * out_shape[2] }}u) % {{ out_shape[1] }}u;
    c[0] = i / {{ out_shape[3] * out_shape[2] * out_shape[1] }}u;
    // offset of the non-resampled dims
    var base = 0u;
{$ for d in range(4) $}
{$ if d != axes[0] and d != axes[1] $}
    base = base + c[{{ d }}] * {{ in_strides[d] }}u;
{$ endif $}
{$ endfor $}
    let oh = c[{{ axes[0] }}];
    let ow = c[{{ axes[1] }}];
{$ if mode == "nearest-neighbor" $}
    let y = nearest(oh, {{ h_near[0] }}, {{ h_near[1] }}, {{ h_near[2] }}u, {{ h_last }}u);
    let x = nearest(ow, {{ w_near[0] }}, {{ w_near[1] }}, {{ w_near[2] }}u, {{ w_last }}u);
    dst[i] = src[base + y * {{ in_strides[axes[0]] }}u + x * {{ in_strides[axes[1]] }}u];
{$ else $}
    let y = coord(oh, {{ h_rat[0] }}, {{ h_rat[1] }}, {{ h_rat[2] }}, {{ h_last }});
    let x = coord(ow, {{ w_rat[0] }}, {{ w_rat[1] }}, {{ w_rat[2] }}, {{ w_last }});
    let y0 = u32(floor(y));
    let x0 = u32(floor(x));
    let y1 = min(y0 + 1u, {{ h_last }}u);
    let x1 = min(x0 + 1u, {{ w_last }}u);
    let ty = y - floor(y);
    let tx = x - floor(x);
    let r0 = base + y0 * {{ in_strides[axes[0]] }}u;
    let r1 = base + y1 * {{ in_strides[axes[0]] }}u;
    let sx0 = x0 * {{ in_strides[axes[1]] }}u;
    let sx1 = x1 * {{ in_strides[axes[1]] }}u;
    // f32 interpolation (f32() of an f16 sample widens it; of an f32 it is the sample)
    let vy0 = f32(src[r0 + sx0]) * (1.0 - tx) + f32(src[r0 + sx1]) * tx;
    let vy1 = f32(src[r1 + sx0]) * (1.0 - tx) + f32(src[r1 + sx1]) * tx;
    dst[i] = {{ ST }}(vy0 * (1.0 - ty) + vy1 * ty);
{$ endif $}
}
