// Attention in one kernel (mltensor/ops/attention.py): out = softmax(score(q k^T)) v, with the
// scores never written to memory. One workgroup owns BQ query rows of one (batch, head) matrix
// and walks the keys in tiles of BK, keeping per row a running maximum m and sum l of
// exp(score - m) (online softmax, FlashAttention-style): when a tile raises the maximum, the
// accumulated outputs and the sum are rescaled by exp(m_old - m_new).
//   score(dot) = dot [* or / scale] [+ bias] [where(cond, ., value)] [-inf past the causal limit]
// Values load through LD (f32 for f16 bindings) and every sum accumulates in f32; the result is
// stored through ST (f16_of for f16) and the fused epilogue act(). Exp follows the softmax
// kernel (reduce.wgsl): exp(x - m) is 0 for x = -inf even when m = -inf, so a row whose scores
// are all -inf sums to 0 and gives NaN, as the unfused softmax's 0 / 0 does.
//
// STAGE (the tiled kernel, prompts): per key tile, separated by barriers,
//   1. the K tile is staged in workgroup memory `kvs`, transposed (kvs[d][key quad]);
//   2. scores as a small GEMM: each thread computes blocks of 4 rows x 4 RK4 keys (vec4 FMAs on
//      qT[d][row quad] and kvs[d][key quad], as matmul.wgsl's register blocking) and stores them
//      key-major into sT[key][row quad];
//   3. row statistics, TPR = WG / BQ threads a row: partial maxima, then exp(s - m) in place and
//      partial sums (each thread of a row keeps the row's running maximum; the first also l);
//      meanwhile the V tile replaces the K tile in `kvs` (kvs[key][column quad]);
//   4. outputs as a second small GEMM: each thread owns blocks of 4 rows x 4 RC4 columns of the
//      BQ x DV output (NB3 of them), rescaled by the row's factor, plus sum_j p_j v_j.
// Without STAGE (the decode kernel, few query rows), K and V are read from global memory where
// they are used: the key dimension is what spreads over the threads (one key per thread per
// tile for the scores, the head dimension for the outputs), a row's statistics are one thread's.
{{ bindings }}
{$ include "common.wgsl" $}
{{ act }}

const D: u32 = {{ D }}u;     // head size of q and k
const DV: u32 = {{ DV }}u;   // head size of v (and of the output)
const BQ: u32 = {{ BQ }}u;   // query rows per workgroup
const BK: u32 = {{ BK }}u;   // keys per tile
const WG: u32 = {{ WG }}u;   // threads
{# Sizes that may be known only at dispatch (dynamic dimensions): a module constant when static,
   a `let` at the top of main (dyn_sizes()) when the expression reads `dims.` #}
{$ for name, v in sizes $}
{$ if "dims." not in v $}
const {{ name }}: u32 = {{ v }};
{$ endif $}
{$ endfor $}
{$ if STAGE $}
const BQ4: u32 = {{ BQ // 4 }}u;
const BK4: u32 = {{ BK // 4 }}u;
const RK4: u32 = {{ RK4 }}u;  // key quads of a thread's block of scores (4 rows x 4 RK4 keys)
const RC4: u32 = {{ RC4 }}u;  // column quads of a thread's block of outputs (4 rows x 4 RC4 columns)
const KB: u32 = {{ BK // (4 * RK4) }}u;  // score blocks along the keys
const DVP: u32 = {{ ((DV + 3) // 4 + RC4 - 1) // RC4 * RC4 }}u;  // V row stride in kvs (quads; zero past DV)
const CB: u32 = {{ ((DV + 3) // 4 + RC4 - 1) // RC4 }}u;  // output blocks along the columns
const TPR: u32 = {{ WG // BQ }}u;  // threads per row for the row statistics

var<workgroup> qT: array<vec4<f32>, {{ D * BQ // 4 }}>;   // [d][row quad]
var<workgroup> kvs: array<vec4<f32>, {{ [D * BK // 4, BK * (((DV + 3) // 4 + RC4 - 1) // RC4 * RC4)] | max }}>;  // K: [d][key quad]; V: [key][column quad]
var<workgroup> sT: array<vec4<f32>, {{ BK * BQ // 4 }}>;  // [key][row quad]: scores, then exp(score - m)
var<workgroup> red: array<f32, {{ WG }}>;   // partial row maxima
var<workgroup> red2: array<f32, {{ WG }}>;  // partial row sums
var<workgroup> rowf: array<f32, {{ BQ }}>;  // per row: this tile's rescale factor, at the end l
{$ else $}
const NS: u32 = {{ (BQ * BK + WG - 1) // WG }}u;  // scores per thread per tile

var<workgroup> qs: array<f32, {{ BQ * D }}>;
var<workgroup> ps: array<f32, {{ BQ * BK }}>;
var<workgroup> rowf: array<f32, {{ BQ }}>;
{$ endif $}

fn is_neg_inf(x: f32) -> bool { return bitcast<u32>(x) == 0xff800000u; }
fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }
// exp(x - m), 0 for x = -inf (also when m = -inf): reduce.wgsl's softmax `ex`
fn ex(x: f32, m: f32) -> f32 { return select(exp(x - m), 0.0, is_neg_inf(x)); }

{# element (key j, column d) of k: k_sj / k_sd are its strides ([.., Sk, D] or, with k
   transposed, [.., D, Sk] read in place) #}
{$ macro k_at(j, d) $}kb + ({{ j }}) * {{ k_sj }} + ({{ d }}) * {{ k_sd }}{$ endmacro $}
{$ macro dyn_sizes() $}
{$ for name, v in sizes if "dims." in v $}
    let {{ name }} = {{ v }};
{$ endfor $}
{$ endmacro $}

// The score of row qi, key kj from their dot product: scale, bias, where, causal limit.
// (bb, cb: the bias's and condition's matrix offsets; sq, sk: SQ and SK.)
fn score(dot: f32, qi: u32, kj: u32, bb: u32, cb: u32, sq: u32, sk: u32) -> f32 {
    var x = dot{{ scale }};
{$ if has_bias $}
    x = x + {{ LD }}(bias[bb + {{ bias_at }}]);
{$ endif $}
{$ if has_cond $}
    x = select({{ where_value }}, x, (cond[cb + {{ cond_at }}] != 0u) == {{ where_keeps }});
{$ endif $}
{$ if causal $}
    if (kj + sq > qi + sk) { x = neg_inf(); }  // key kj is visible from row qi when kj <= qi + SK - SQ
{$ endif $}
    return x;
}

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
{{ dyn_sizes() }}
{$ if gate $}
    if (!({{ gate }})) { return; }  // Sq known at dispatch: the other kernel serves this size
{$ endif $}
    let nqt = (SQ + BQ - 1u) / BQ;
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB * nqt) { return; }  // (uniform per workgroup: before any barrier)
    let bt = g / nqt;
    let q0 = (g - bt * nqt) * BQ;
    let qb = {{ q_base }};
    let kb = {{ k_base }};
    let vb = {{ v_base }};
    let bb = {{ bias_base if has_bias else "0u" }};
    let cb = {{ cond_base if has_cond else "0u" }};
    // Keys past the last one any row of the tile may see are skipped (causal: all in u32, no
    // negative values).
    var kend = SK;
{$ if causal $}
    let lim = min(q0 + BQ, SQ) + SK;  // (last row + 1) + SK
    kend = select(0u, min(SK, lim - SQ), lim > SQ);
{$ endif $}
    var m_run = neg_inf();  // the running maximum of this thread's row
    var l_run = 0.0;        // and its sum of exp(score - m_run) (the row's first thread)
{$ if STAGE $}
    for (var e = t; e < D * BQ4; e += WG) {
        let d = e / BQ4;
        let r4 = e - d * BQ4;
        var x = vec4<f32>(0.0);
{$ for i in range(4) $}
        if (q0 + 4u * r4 + {{ i }}u < SQ) { x[{{ i }}] = {{ LD }}(q[qb + (q0 + 4u * r4 + {{ i }}u) * D + d]); }
{$ endfor $}
        qT[e] = x;
    }
    let row = t / TPR;          // row statistics: this thread's row
    let part = t - row * TPR;   // and its share of the keys (every TPR-th)
    let rq = row / 4u;
    let rc = row & 3u;
{$ for b in range(NB3) $}
{$ for i in range(4) $}
{$ for u in range(RC4) $}
    var o{{ b }}_{{ i }}_{{ u }} = vec4<f32>(0.0);  // block {{ b }}: row 4 r4 + {{ i }}, columns 4 (c4 + {{ u }}) ..
{$ endfor $}
{$ endfor $}
{$ endfor $}
    for (var j0 = 0u; j0 < kend; j0 += BK) {
        let jn = min(BK, kend - j0);  // keys of this tile
        for (var e = t; e < D * BK4; e += WG) {
            let d = e / BK4;
            let j4 = e - d * BK4;
            var x = vec4<f32>(0.0);
{$ for i in range(4) $}
            if (4u * j4 + {{ i }}u < jn) { x[{{ i }}] = {{ LD }}(k[{{ k_at("j0 + 4u * j4 + " ~ i ~ "u", "d") }}]); }
{$ endfor $}
            kvs[e] = x;
        }
        workgroupBarrier();
        for (var b = t; b < BQ4 * KB; b += WG) {
            let r4 = b / KB;
            let j4 = (b - r4 * KB) * RK4;  // first key quad of the block
{$ for i in range(4) $}
{$ for u in range(RK4) $}
            var s{{ i }}_{{ u }} = vec4<f32>(0.0);  // row 4 r4 + {{ i }}, keys 4 (j4 + {{ u }}) ..
{$ endfor $}
{$ endfor $}
            for (var d = 0u; d < D; d++) {
                let qv = qT[d * BQ4 + r4];
{$ for u in range(RK4) $}
                let kv{{ u }} = kvs[d * BK4 + j4 + {{ u }}u];
{$ endfor $}
{$ for i in range(4) $}
{$ for u in range(RK4) $}
                s{{ i }}_{{ u }} = fma(vec4<f32>(qv[{{ i }}]), kv{{ u }}, s{{ i }}_{{ u }});
{$ endfor $}
{$ endfor $}
            }
{$ for u in range(RK4) $}
{$ for c in range(4) $}
            {
                let j = 4u * (j4 + {{ u }}u) + {{ c }}u;
                var col = vec4<f32>(neg_inf());
                if (j < jn) {
{$ for i in range(4) $}
                    if (q0 + 4u * r4 + {{ i }}u < SQ) { col[{{ i }}] = score(s{{ i }}_{{ u }}[{{ c }}], q0 + 4u * r4 + {{ i }}u, j0 + j, bb, cb, SQ, SK); }
{$ endfor $}
                }
                sT[j * BQ4 + r4] = col;
            }
{$ endfor $}
{$ endfor $}
        }
        workgroupBarrier();
        var mx = m_run;
        for (var j = part; j < jn; j += TPR) { mx = max(mx, sT[j * BQ4 + rq][rc]); }
        red[t] = mx;
        // the K tile is no longer read: the V tile replaces it
        for (var e = t; e < BK * DVP; e += WG) {
            let j = e / DVP;
            let c4 = e - j * DVP;
            var x = vec4<f32>(0.0);
            if (j < jn) {
{$ for i in range(4) $}
                if (4u * c4 + {{ i }}u < DV) { x[{{ i }}] = {{ LD }}(v[vb + (j0 + j) * DV + 4u * c4 + {{ i }}u]); }
{$ endfor $}
            }
            kvs[e] = x;
        }
        workgroupBarrier();
        var m = m_run;
        for (var u = 0u; u < TPR; u++) { m = max(m, red[row * TPR + u]); }
        var ls = 0.0;
        for (var j = part; j < jn; j += TPR) {
            let p = ex(sT[j * BQ4 + rq][rc], m);
            sT[j * BQ4 + rq][rc] = p;
            ls += p;
        }
        red2[t] = ls;
        // rescale what earlier tiles summed; nothing was summed while the maximum was -inf
        let a = select(exp(m_run - m), 0.0, is_neg_inf(m_run));
        m_run = m;
        if (part == 0u) { rowf[row] = a; }
        workgroupBarrier();
        if (part == 0u) {
            var l = 0.0;
            for (var u = 0u; u < TPR; u++) { l += red2[row * TPR + u]; }
            l_run = l_run * a + l;
        }
{$ for b in range(NB3) $}
        {
            let blk = t + {{ b * WG }}u;
            if (blk < BQ4 * CB) {
                let r4 = blk / CB;
                let c4 = (blk - r4 * CB) * RC4;
{$ for i in range(4) $}
                let f{{ i }} = rowf[4u * r4 + {{ i }}u];
{$ for u in range(RC4) $}
                o{{ b }}_{{ i }}_{{ u }} = o{{ b }}_{{ i }}_{{ u }} * f{{ i }};
{$ endfor $}
{$ endfor $}
                for (var j = 0u; j < jn; j++) {
                    let pv = sT[j * BQ4 + r4];
{$ for u in range(RC4) $}
                    let vv{{ u }} = kvs[j * DVP + c4 + {{ u }}u];
{$ endfor $}
{$ for i in range(4) $}
{$ for u in range(RC4) $}
                    o{{ b }}_{{ i }}_{{ u }} = fma(vec4<f32>(pv[{{ i }}]), vv{{ u }}, o{{ b }}_{{ i }}_{{ u }});
{$ endfor $}
{$ endfor $}
                }
            }
        }
{$ endfor $}
        workgroupBarrier();  // sT, kvs and rowf are rewritten by the next tile
    }
    if (part == 0u) { rowf[row] = l_run; }
    workgroupBarrier();
{$ for b in range(NB3) $}
    {
        let blk = t + {{ b * WG }}u;
        let r4 = blk / CB;
        let c4 = (blk - r4 * CB) * RC4;
        if (blk < BQ4 * CB) {
{$ for i in range(4) $}
            {
                let qi = q0 + 4u * r4 + {{ i }}u;
                let l = rowf[4u * r4 + {{ i }}u];
                if (qi < SQ) {
{$ for u in range(RC4) $}
{$ for c in range(4) $}
                    if (4u * (c4 + {{ u }}u) + {{ c }}u < DV) {
                        // a row with every score -inf has l = 0: NaN, as the unfused 0 / 0
                        let y = select(o{{ b }}_{{ i }}_{{ u }}[{{ c }}] / l, nan_f32(), l == 0.0);
                        let oi = (bt * SQ + qi) * DV + 4u * (c4 + {{ u }}u) + {{ c }}u;
                        out[oi] = act({{ ST }}(y), oi);
                    }
{$ endfor $}
{$ endfor $}
                }
            }
{$ endfor $}
        }
    }
{$ endfor $}
{$ else $}
    for (var e = t; e < BQ * D; e += WG) {
        let qi = q0 + e / D;
        var x = 0.0;
        if (qi < SQ) { x = {{ LD }}(q[qb + qi * D + e % D]); }
        qs[e] = x;
    }
{$ set no = (BQ * DV + WG - 1) // WG $}
    // outputs of this thread (o = t + s * WG), named accumulators: a dynamically indexed local
    // array would live in scratch memory on GPUs
{$ for s in range(no) $}
    var acc{{ s }} = 0.0;
{$ endfor $}
    workgroupBarrier();
    for (var j0 = 0u; j0 < kend; j0 += BK) {
        let jn = min(BK, kend - j0);  // keys of this tile
        for (var s = 0u; s < NS; s++) {
            let e = t + s * WG;
            if (e < BQ * BK) {
                let r = e / BK;
                let j = e - r * BK;
                let qi = q0 + r;
                var x = neg_inf();
                if (j < jn && qi < SQ) {
                    var dot = 0.0;
                    for (var d = 0u; d < D; d++) {
                        dot += qs[r * D + d] * {{ LD }}(k[{{ k_at("j0 + j", "d") }}]);
                    }
                    x = score(dot, qi, j0 + j, bb, cb, SQ, SK);
                }
                ps[e] = x;
            }
        }
        workgroupBarrier();
        if (t < BQ) {
            var m = m_run;
            for (var j = 0u; j < jn; j++) { m = max(m, ps[t * BK + j]); }
            var l = 0.0;
            for (var j = 0u; j < jn; j++) {
                let p = ex(ps[t * BK + j], m);
                ps[t * BK + j] = p;
                l += p;
            }
            // rescale what earlier tiles summed; nothing was summed while the maximum was -inf
            let a = select(exp(m_run - m), 0.0, is_neg_inf(m_run));
            l_run = l_run * a + l;
            m_run = m;
            rowf[t] = a;
        }
        workgroupBarrier();
{$ for s in range(no) $}
        {
            let o = t + {{ s * WG }}u;
            if (o < BQ * DV) {
                let r = o / DV;
                let d = o - r * DV;
                var a = acc{{ s }} * rowf[r];
                for (var j = 0u; j < jn; j++) {
                    a += ps[r * BK + j] * {{ LD }}(v[vb + (j0 + j) * DV + d]);
                }
                acc{{ s }} = a;
            }
        }
{$ endfor $}
        workgroupBarrier();  // ps and rowf are rewritten by the next tile
    }
    if (t < BQ) { rowf[t] = l_run; }
    workgroupBarrier();
{$ for s in range(no) $}
    {
        let o = t + {{ s * WG }}u;
        let r = o / DV;
        let qi = q0 + r;
        if (o < BQ * DV && qi < SQ) {
            let l = rowf[r];
            // a row with every score -inf has l = 0: NaN, as the unfused softmax's 0 / 0
            let y = select(acc{{ s }} / l, nan_f32(), l == 0.0);
            let oi = (bt * SQ + qi) * DV + (o - r * DV);
            out[oi] = act({{ ST }}(y), oi);
        }
    }
{$ endfor $}
{$ endif $}
}
