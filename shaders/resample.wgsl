// resample2d: one thread per output element of a 4-D tensor (the sampling is resample_at.wgsl's).
{{ bindings }}
{$ include "common.wgsl" $}
{$ include "resample_at.wgsl" $}

{{ main_1d(n) }}
{$ if rs.mode == "nearest-neighbor" $}
    dst[i] = src[rs_index(i)];
{$ else $}
    dst[i] = {{ rs.ST }}(rs_linear(i));
{$ endif $}
}
