// _kv_append (mltensor/ops/kvcache.py): the new rows of each value written after the first `past`
// rows of its KV cache, which is the caller's output tensor; nothing else of it is touched.
// One thread per element of the largest value: dst_k[past * row_k + i] = src_k[i].
{{ bindings }}
{$ include "common.wgsl" $}

{{ main_1d(n) }}
{$ for count, off in arrays $}
{$ if count is none $}
    dst{{ loop.index0 }}[{{ off }} + i] = src{{ loop.index0 }}[i];
{$ else $}
    if (i < {{ count }}) { dst{{ loop.index0 }}[{{ off }} + i] = src{{ loop.index0 }}[i]; }
{$ endif $}
{$ endfor $}
}
