// Data movement by index arithmetic: reverse, tile, triangular. One thread per output element;
// `body` (generated from the static shapes in mltensor/ops/layout.py) splits the output index `i`
// into coordinates and writes out[i].
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{{ body }}
}
