// quantize_linear / dequantize_linear: one thread per element. `sidx` (generated in
// mltensor/ops/quantize.py) is the element's index into the blockwise-broadcast scale/zero point.
// Float values (input of quantize, scale, output of dequantize) are f32 or f16: the arithmetic is
// f32 (f32() widens an f16, is the value of an f32) and a float result is stored through ST.
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{{ index }}
    let s = f32(scale[sidx]);
    let z = zp[sidx];
{$ if mode == "quantize" $}
    // round half to even, add the zero point, saturate into the output type's range
    // (the largest f32 below 2^31 / 2^32 is not the type's maximum: values above it map to `top`)
    let v = round(f32(x[i]) / s) + f32(z);
    out[i] = select({{ otype }}(clamp(v, {{ lo }}, {{ hi }})), {{ top }}, v > {{ hi }});
{$ else $}
  {$ if itype == "i32" $}
    out[i] = {{ ST }}(f32(x[i] - z) * s);
  {$ else $}
    out[i] = {{ ST }}(f32(bitcast<i32>(x[i] - z)) * s);
  {$ endif $}
{$ endif $}
}
