// A fused chain of elementwise operators: one thread per output element (or per vec4 of them).
// `fns` is the chain as a function of the output index (elementwise.py group_fn, scalar path);
// the vec4 path's `loads` read each external input and `body` evaluates the chain per lane.
{{ bindings }}
{$ include "common.wgsl" $}
{{ fns }}

{{ main_1d(n) }}
{{ loads }}
{{ body }}
    out[i] = {{ result }};
}
