// Data movement by index arithmetic: reverse, tile, triangular. One thread per output element;
// `body` (generated from the static shapes in mltensor/ops/layout.py) splits the output index `i`
// into coordinates and writes out[i].
{{ bindings }}
{$ include "common.wgsl" $}

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid);
    if (i >= {{ n }}u) { return; }
{{ body }}
}
