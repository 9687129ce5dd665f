// Data movement by index arithmetic: reverse, tile, triangular. One thread per output element;
// `body` (generated from the shapes in mltensor/ops/layout.py: static sizes are constants, dynamic
// ones are read from `dims` at dispatch) splits the output index `i` into coordinates and writes out[i].
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{{ body }}
}
