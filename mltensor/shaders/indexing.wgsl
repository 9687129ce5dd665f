// gather_elements, gather_nd, scatter_elements, scatter_nd: one thread per output element
// (gathers) or per update element (scatters, after the input was copied to the output).
// `body` is generated from the shapes in mltensor/ops/indexing.py (static sizes are constants,
// dynamic ones are read from `dims` at dispatch).
{{ bindings }}
{$ include "common.wgsl" $}

// An index into a dimension of size n: negative counts from the end; out of range is clamped,
// so no read or write ever leaves the tensor.
fn wrap_i32(v: i32, n: u32) -> u32 {
    var k = v;
    if (k < 0) { k = k + i32(n); }
    return u32(clamp(k, 0, i32(n) - 1));
}

fn wrap_u32(v: u32, n: u32) -> u32 {
    return min(v, n - 1u);
}
{$ if wide64 $}

fn wrap_i64(v: i64, n: u32) -> u32 {
    let m = i64(u64(n));  // (i64 of a u32 sign-extends; through u64 it does not)
    var k = v;
    if (k < 0li) { k = k + m; }
    return u32(clamp(k, 0li, m - 1li));
}

fn wrap_u64(v: u64, n: u32) -> u32 {
    return u32(min(v, u64(n) - 1lu));
}
{$ endif $}

{{ main_1d(n) }}
{{ body }}
}
