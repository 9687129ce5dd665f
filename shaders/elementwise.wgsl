// A fused chain of elementwise operators: one thread per output element.
// `loads` computes each external input's (broadcast) index; `body` is the chain, in order.
{{ bindings }}
{$ include "common.wgsl" $}

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid);
    if (i >= {{ n }}u) { return; }
{{ loads }}
{{ body }}
    out[i] = {{ result }};
}
