// quantize_linear / dequantize_linear: one thread per element. `sidx` (generated in
// mltensor/ops/quantize.py) is the element's index into the blockwise-broadcast scale/zero point.
// Float values (input of quantize, scale, output of dequantize) are f32 or f16: the arithmetic is
// f32 (f32() widens an f16, is the value of an f32) and a float result is stored through ST.
{{ bindings }}
{$ include "common.wgsl" $}

{$ if mode == "quantize" and half $}
// q rounded to the nearest half-precision value (ties to even), as an f32; computed on f32 bits
// so that it works without "shader-f16". An f32 quotient of two half-precision values rounded
// once more is the correctly rounded half-precision quotient (24 >= 2 * 11 + 2 bits: the double
// rounding is innocuous), which is what ONNX's x / y_scale in float16 gives.
fn half_grid(q: f32) -> f32 {
    let a = abs(q);
    if (a < 6.103515625e-05) {
        // below the smallest normal half (2^-14) the spacing is 2^-24: scaling is exact
        return round(q * 16777216.0) / 16777216.0;
    }
    if (a >= 65520.0) {
        // rounds to +-inf in half precision: any finite value past every saturation bound
        return select(3.0e38, -3.0e38, q < 0.0);
    }
    // drop 13 of the 23 mantissa bits, ties to even (a carry into the exponent is correct)
    let b = bitcast<u32>(q);
    return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
}
{$ endif $}

{{ main_1d(n) }}
{{ index }}
    let s = f32(scale[sidx]);
    let z = zp[sidx];
{$ if mode == "quantize" $}
  {$ if half $}
    let q = half_grid(f32(x[i]) / s);
  {$ else $}
    let q = f32(x[i]) / s;
  {$ endif $}
    // round half to even, add the zero point, saturate into the output range [lo, hi]. The
    // clamp happens in float, before the conversion (an out-of-range float -> int conversion is
    // undefined); the largest f32 below 2^31 / 2^32 is not the type's maximum, so values above
    // it map to `top`. NaN (a 0/0, or a NaN input) gives the range's minimum, as onnxruntime
    // does; it is tested on its bits (clamp/compare may assume no NaN). Exact ties (x / scale =
    // k + 0.5) need a correctly rounded f32 division, which lavapipe and CPUs give; WGSL only
    // bounds it within 2.5 ulp, so a GPU may round a quotient within ulps of k + 0.5 either way.
    let v = round(q) + f32(z);
    let sat = select({{ otype }}(clamp(v, {{ lo }}, {{ hi }})), {{ top }}, v > {{ hi }});
    out[i] = select(sat, {{ bottom }}, is_nan_f32(v));
{$ else $}
  {$ if itype == "i32" $}
    out[i] = {{ ST }}(f32(x[i] - z) * s);
  {$ else $}
    out[i] = {{ ST }}(f32(bitcast<i32>(x[i] - z)) * s);
  {$ endif $}
{$ endif $}
}
