// Attention for CPU adapters (ROWS, ops/attention.py row_config): out = softmax(score(q k^T)) v
// with a thread per query row (RQ rows each, WG apart) and nothing shared: no workgroup memory,
// no barriers. The WG threads of a workgroup (8: one SIMD group of Mesa's llvmpipe, which runs a
// workgroup's invocations as the vector lanes of one CPU thread, and every barrier as a coroutine
// switch) take adjacent rows of one (batch, head) matrix and walk the same keys, so each K and V
// element a step reads is one address for all of them. A row keeps its q quads, its running
// maximum m and sum l of exp(score - m), and its outputs in named registers; the keys go by in
// chunks of KC, each chunk's scores computed first so that the rescale of the outputs by
// exp(m_old - m_new) (online softmax) is paid once a chunk, not once a key. The outputs are made
// in PASSES of at most 16 column quads (the scores recomputed for each pass: a register set of
// bounded size for any head). The staged kernel (attention.wgsl) stages Q, K and V tiles in
// workgroup memory behind barriers, which on llvmpipe cost more than these direct loads.
// score(), ex() and the all -inf row (l = 0: empty_row) as attention.wgsl's.
// Q4 / K4 / V4: q, k or v bound as vec4 (head size, row and matrix strides multiples of 4);
// otherwise their quads are gathered from scalars, zero past the head size (k transposed too).
{{ bindings }}
{$ include "common.wgsl" $}
{{ act }}

const WG: u32 = {{ WG }}u;
const BQ: u32 = {{ WG * RQ }}u;  // query rows of a workgroup
{$ for name, v in sizes $}
{$ if "dims." not in v $}
const {{ name }}: u32 = {{ v }};
{$ endif $}
{$ endfor $}

{$ include "attention_score.wgsl" $}

{$ set D4 = (D + 3) // 4 $}
{# quad c (columns 4c ..) of the row starting at element `r` of x: a vec4 load, or four scalar
   loads `s` apart with zeros past `n` columns #}
{$ macro quad(x, r, c, n, V, s="1u") $}{$ if V $}{{ LD4 }}({{ x }}[({{ r }}) / 4u + {{ c }}u]){$ else $}vec4<f32>({$ for i in range(4) $}{$ if 4 * c + i < n $}{{ LD }}({{ x }}[{{ r }} + {{ 4 * c + i }}u * {{ s }}]){$ else $}0.0{$ endif $}{{ ", " if not loop.last }}{$ endfor $}){$ endif $}{$ endmacro $}

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
{$ for name, v in sizes if "dims." in v $}
    let {{ name }} = {{ v }};
{$ endfor $}
{$ if gate $}
    if (!({{ gate }})) { return; }  // Sq known at dispatch: the other kernel serves this size
{$ endif $}
    let nqt = (SQ + BQ - 1u) / BQ;
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB * nqt) { return; }
    let bt = g / nqt;
    let q0 = (g - bt * nqt) * BQ;
    let qb = {{ q_base }};
    let kb = {{ k_base }};
    let vb = {{ v_base }};
    let obase = {{ o_base }};
    let bb = {{ bias_base if has_bias else "0u" }};
    let cb = {{ cond_base if has_cond else "0u" }};
    // keys no row of the workgroup sees are skipped
    let kend = keys_end(q0, SQ, SK);
    let j_lo = keys_first(q0, SQ, SK);
{$ for r in range(RQ) $}
    let qi{{ r }} = q0 + {{ r }}u * WG + t;
    let qc{{ r }} = min(qi{{ r }}, SQ - 1u);  // (rows past SQ compute row SQ - 1's, never stored)
    let qr{{ r }} = qb + qc{{ r }} * {{ q_si }};
{$ for c in range(D4) $}
    let q{{ r }}_{{ c }} = {{ quad("q", "qr" ~ r, c, D, Q4) }};
{$ endfor $}
{$ endfor $}
{$ for c0, nc in PASSES $}
    {
{$ for r in range(RQ) $}
        var m{{ r }} = neg_inf();
        var l{{ r }} = 0.0;
{$ for c in range(nc) $}
        var acc{{ r }}_{{ c }} = vec4<f32>(0.0);
{$ endfor $}
{$ endfor $}
        for (var j0 = j_lo; j0 < kend; j0 += {{ KC }}u) {
{$ for u in range(KC) $}
            // key j0 + {{ u }} (past kend: the last key read again, its score -inf)
            let j{{ u }} = min(j0 + {{ u }}u, kend - 1u);
            let kr{{ u }} = kb + j{{ u }} * {{ k_sj }};
{$ for c in range(D4) $}
            let k{{ u }}_{{ c }} = {{ quad("k", "kr" ~ u, c, D, K4, k_sd) }};
{$ endfor $}
{$ for r in range(RQ) $}
            let s{{ r }}_{{ u }} = select(score({$ for c in range(D4) $}{{ " + " if not loop.first }}dot(q{{ r }}_{{ c }}, k{{ u }}_{{ c }}){$ endfor $}, qc{{ r }}, j{{ u }}, bb, cb, SQ, SK), neg_inf(), j0 + {{ u }}u >= kend);
{$ endfor $}
{$ endfor $}
{$ for r in range(RQ) $}
            let mn{{ r }} = max(m{{ r }}, {$ for u in range(KC - 1) $}max(s{{ r }}_{{ u }}, {$ endfor $}s{{ r }}_{{ KC - 1 }}{$ for u in range(KC - 1) $}){$ endfor $});
            // rescale what earlier chunks summed; nothing was summed while the maximum was -inf
            let a{{ r }} = select(exp(m{{ r }} - mn{{ r }}), 0.0, is_neg_inf(m{{ r }}));
            m{{ r }} = mn{{ r }};
{$ for u in range(KC) $}
            let p{{ r }}_{{ u }} = ex(s{{ r }}_{{ u }}, mn{{ r }});
{$ endfor $}
            l{{ r }} = l{{ r }} * a{{ r }} + {$ for u in range(KC) $}{{ " + " if not loop.first }}p{{ r }}_{{ u }}{$ endfor $};
{$ endfor $}
{$ for c in range(nc) $}
            {
{$ for u in range(KC) $}
                let v{{ u }} = {{ quad("v", "vb + j" ~ u ~ " * " ~ v_sj, c0 + c, DV, V4) }};
{$ endfor $}
{$ for r in range(RQ) $}
                acc{{ r }}_{{ c }} = acc{{ r }}_{{ c }} * a{{ r }}{$ for u in range(KC) $} + p{{ r }}_{{ u }} * v{{ u }}{$ endfor $};
{$ endfor $}
            }
{$ endfor $}
        }
{$ for r in range(RQ) $}
        if (qi{{ r }} < SQ) {
            let l = l{{ r }};
            let ob = obase + qi{{ r }} * {{ o_si }};
{$ for c in range(nc) $}
{$ for i in range(4) if 4 * (c0 + c) + i < DV $}
            {
                // a row with every score -inf has l = 0: NaN, as the unfused softmax's 0 / 0
                let y = select(acc{{ r }}_{{ c }}[{{ i }}] / l, {{ empty_row }}, l == 0.0);
                let oi = ob + {{ 4 * (c0 + c) + i }}u;
                out[oi] = act({{ ST }}(y), oi);
            }
{$ endfor $}
{$ endfor $}
        }
{$ endfor $}
    }
{$ endfor $}
}
