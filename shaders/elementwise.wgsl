// A fused chain of elementwise operators: one thread per output element.
// `loads` computes each external input's (broadcast) index; `body` is the chain, in order.
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{{ loads }}
{{ body }}
    out[i] = {{ result }};
}
