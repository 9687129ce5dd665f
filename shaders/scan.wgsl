// Scans along one axis: arg_min / arg_max and cumulative_sum. One thread per line (all elements
// that share the coordinates outside the axis); the line is walked serially, `len` elements
// `inner` apart. The output of arg_* has one element per line, in line order.
// cumsum of f16 values accumulates in f32: loads through LD (f32), stores through ST (f16_of).
{{ bindings }}
{$ include "common.wgsl" $}

{# lines, len, inner, stride (= len * inner) and last (= len - 1): WGSL u32 expressions, "12u" for
   static sizes, else read at dispatch (dims.*). #}
{{ main_1d(lines) }}
    let base = (i / {{ inner }}) * {{ stride }} + i % {{ inner }};
{$ if mode == "arg" $}
    var best = x[base];
    var best_k = 0u;
    for (var k = 1u; k < {{ len }}; k++) {
        let v = x[base + k * {{ inner }}];
  {$ if wtype in ("f32", "f16") $}
        // numpy semantics: the first NaN wins, otherwise strict compare keeps the first of ties
        // (f32() of an f16 keeps NaN; of an f32 it is the value itself)
        let v_nan = is_nan_f32(f32(v));
        let b_nan = is_nan_f32(f32(best));
        if (!b_nan && (v_nan || {{ better }})) { best = v; best_k = k; }
  {$ else $}
        if ({{ better }}) { best = v; best_k = k; }
  {$ endif $}
    }
    out[i] = {{ result }};
{$ elif mode == "cumsum" $}
    var acc = {{ zero }};
    for (var j = 0u; j < {{ len }}; j++) {
  {$ if reversed $}
        let at = base + ({{ last }} - j) * {{ inner }};
  {$ else $}
        let at = base + j * {{ inner }};
  {$ endif $}
        let v = {{ LD }}(x[at]);
  {$ if exclusive $}
        out[at] = {{ ST }}(acc);
        acc = {{ add }};
  {$ else $}
        acc = {{ add }};
        out[at] = {{ ST }}(acc);
  {$ endif $}
    }
{$ endif $}
}
