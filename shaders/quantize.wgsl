// quantize_linear / dequantize_linear: one thread per element. `sidx` (generated in
// mltensor/ops/quantize.py) is the element's index into the blockwise-broadcast scale/zero point.
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{{ index }}
    let s = scale[sidx];
    let z = zp[sidx];
{$ if mode == "quantize" $}
    // round half to even, add the zero point, saturate into the output type's range
    // (the largest f32 below 2^31 / 2^32 is not the type's maximum: values above it map to `top`)
    let v = round(x[i] / s) + f32(z);
    out[i] = select({{ otype }}(clamp(v, {{ lo }}, {{ hi }})), {{ top }}, v > {{ hi }});
{$ else $}
  {$ if itype == "i32" $}
    out[i] = f32(x[i] - z) * s;
  {$ else $}
    out[i] = f32(bitcast<i32>(x[i] - z)) * s;
  {$ endif $}
{$ endif $}
}
