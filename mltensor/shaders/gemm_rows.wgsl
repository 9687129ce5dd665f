{# The epilogue of the tiled GEMMs (matmul.wgsl, integer.wgsl imports it): one row of the
   thread's RM x RN block per loop iteration, the body (`caller()`) storing row `m + i` from
   r0 .. r{RN/4 - 1}, vec4s of type T. Unrolled, the block's RM x RN inlined stores (a bounds
   test, an address and the fused epilogue each) were half of a driver front end's work on the
   kernel (Mesa's NIR passes: 13 -> 8 ms per tiled 1x1 convolution, paid again at every process
   start; LLVM's compile shrinks too). The trip count (the rows inside M) is not a constant, so
   that no compiler unrolls it back; the row's accumulators are picked by a switch, not an
   array, so that they stay in registers. Renders no WGSL itself. #}
{$ macro row_loop(RM, RN, T, M) $}
    let rows = select(0u, min({{ RM }}u, {{ M }} - m), m < {{ M }});
    for (var i = 0u; i < rows; i = i + 1u) {
{$ for j in range(RN // 4) $}
        var r{{ j }}: vec4<{{ T }}>;
{$ endfor $}
        switch i {
{$ for i in range(RM) $}
            {{ "default" if loop.last else "case %du" % i }}: {
{$ for j in range(RN // 4) $}
                r{{ j }} = acc{{ i }}_{{ j }};
{$ endfor $}
            }
{$ endfor $}
        }
{# (the body ends with its newline) #}
{{ caller() }}    }
{$ endmacro $}
