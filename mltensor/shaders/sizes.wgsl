// Sizes as values (mltensor/ops/sizes.py): one thread per output element writes `body`, an
// expression of the dispatch's sizes (immediate data) and of the element index `i`.
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{{ body }}
}
