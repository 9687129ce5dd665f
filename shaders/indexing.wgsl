// gather_elements, gather_nd, scatter_elements, scatter_nd: one thread per output element
// (gathers) or per update element (scatters, after the input was copied to the output).
// `body` is generated from the static shapes in mltensor/ops/indexing.py.
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

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid);
    if (i >= {{ n }}u) { return; }
{{ body }}
}
