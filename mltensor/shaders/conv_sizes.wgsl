{# Sizes of the convolution kernels (conv2d.wgsl imports these in each block it overrides): the
   output plane, the input extents as i32 and the division helpers, static sizes as constants and
   sizes known at dispatch through `dims` (dv/md divide through common.wgsl's div_fast when the
   lowering says the numerators stay small: fdiv). Renders no WGSL itself. #}
{$ set ohw = "OHW" if (OH * OW) is integer else u(OH * OW) $}
{$ set IHi = IH if IH is integer else "i32(" ~ u(IH) ~ ")" $}
{$ set IWi = IW if IW is integer else "i32(" ~ u(IW) ~ ")" $}
{$ set fd = fdiv is defined and fdiv $}
{$ macro dv(a, d) $}{$ if fd and "dims." in d $}div_fast({{ a }}, {{ d }}){$ else $}{{ a }} / {{ d }}{$ endif $}{$ endmacro $}
{$ macro md(a, d) $}{$ if fd and "dims." in d $}({{ a }} - div_fast({{ a }}, {{ d }}) * {{ d }}){$ else $}{{ a }} % {{ d }}{$ endif $}{$ endmacro $}
