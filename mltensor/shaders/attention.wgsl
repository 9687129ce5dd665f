// Attention in one kernel (mltensor/ops/attention.py): out = softmax(score(q k^T)) v, with the
// scores never written to memory. One workgroup owns BQ query rows of one (batch, head) matrix
// and walks the keys in tiles of BK, keeping per row a running maximum m and sum l of
// exp(score - m) (online softmax, FlashAttention-style): when a tile raises the maximum, the
// accumulated outputs and the sum are rescaled by exp(m_old - m_new).
//   score(dot) = dot [* or / scale] [softcap] [+ bias] [where(cond, ., value)] [-inf past the causal limit
//   or outside the sliding window]
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
// SPLIT (flash-decoding, few query rows): the keys are cut into at most SPLIT blocks of whole
// tiles; a workgroup computes, for one block and GR query heads that read one K/V head (every
// query row of each), per tile: the scores (a thread per key, K read once for all RB = GR x BQ
// rows), the rows' statistics (TPR threads a row) and the outputs (a thread per column and key
// slice, V read once for all rows); it writes each row's partial (maximum m, sum l, the DV
// outputs scaled by exp(-m)) for its block and key slice to `part`. REDUCE, one workgroup per
// output row, then combines the partials: out = sum_b o_b exp(m_b - M) / sum_b l_b exp(m_b - M)
// with M the largest m_b (a block whose scores are all -inf has m = -inf and weighs 0).
// TPS (the tiled kernel, keys past what one invocation may loop over: runtime/wgsl.py
// LOOP_BUDGET, llvmpipe's silent cap): the keys are cut into blocks of TPS tiles, a workgroup per
// (query tile, block) writes its rows' partials (m, l, unnormalized outputs) as the split decode
// does, and REDUCE (with TPS: the same fixed blocks) combines them.
// Layouts: q, v and the output are read and written through row strides (q_si, v_sj, o_si) and
// per-matrix offsets (q_base, v_base, o_base of the flat batch index bt), so position-major
// tensors ([.., S, H, D], a KV cache appended in place) need no transposes.
{$ if REDUCE $}
{{ bindings }}
{$ include "common.wgsl" $}
{{ act }}

const DV: u32 = {{ DV }}u;
const WG: u32 = {{ WG }}u;
const BK: u32 = {{ BK }}u;          // keys per tile of the split kernel
const NSPLIT: u32 = {{ SPLIT }}u;   // the most blocks
const KS: u32 = {{ KS }}u;          // key slices per block
const PW: u32 = DV + 2u;            // words of one partial: m, l, DV outputs
{$ for name, v in sizes $}
{$ if "dims." not in v $}
const {{ name }}: u32 = {{ v }};
{$ endif $}
{$ endfor $}

var<workgroup> wts: array<f32, {{ SPLIT * KS }}>;

fn is_neg_inf(x: f32) -> bool { return bitcast<u32>(x) == 0xff800000u; }
fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }
fn o_base_of(bt: u32) -> u32 { return {{ o_base }}; }

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
{$ for name, v in sizes if "dims." in v $}
    let {{ name }} = {{ v }};
{$ endfor $}
{$ if gate $}
    if (!({{ gate }})) { return; }  // Sq known at dispatch: the other kernel serves this size
{$ endif $}
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB * SQ) { return; }  // (uniform per workgroup: before the barrier)
    let bt = g / SQ;
    let qi = g - bt * SQ;
    let nkt = (SK + BK - 1u) / BK;
{$ if TPS $}
    let tps = {{ TPS }}u;  // (the tiled kernel's key blocks: TPS tiles each)
{$ else $}
    let tps = (nkt + NSPLIT - 1u) / NSPLIT;
{$ endif $}
    let ne = (nkt + tps - 1u) / tps * KS;  // partials of this row
    let pb = g * ne * PW;
    var mx = neg_inf();
    for (var e = 0u; e < ne; e++) { mx = max(mx, part[pb + e * PW]); }
    for (var e = t; e < ne; e += WG) {
        let m = part[pb + e * PW];
        wts[e] = select(exp(m - mx), 0.0, is_neg_inf(m));
    }
    workgroupBarrier();
    var l = 0.0;
    for (var e = 0u; e < ne; e++) { l = fma(part[pb + e * PW + 1u], wts[e], l); }
    let obase = o_base_of(bt) + qi * {{ o_si }};
    for (var c = t; c < DV; c += WG) {
        var acc = 0.0;
        for (var e = 0u; e < ne; e++) { acc = fma(part[pb + e * PW + 2u + c], wts[e], acc); }
        // a row with every score -inf has l = 0: NaN, as the unfused softmax's 0 / 0 (0 where the
        // graph replaced NaN probabilities by 0: empty_row)
        let y = select(acc / l, {{ empty_row }}, l == 0.0);
        let oi = obase + c;
        out[oi] = act({{ ST }}(y), oi);
    }
}
{$ else $}
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
{$ elif SPLIT $}
const GR: u32 = {{ GR }}u;          // query heads of the workgroup (one K/V head)
const RB: u32 = {{ GR * BQ }}u;     // rows: GR heads x BQ query rows (row r: head r / BQ, query r % BQ)
const NSPLIT: u32 = {{ SPLIT }}u;   // the most blocks of keys
const TPR: u32 = {{ WG // (GR * BQ) }}u;  // threads per row for the row statistics
const KS: u32 = {{ KS }}u;          // key slices of the outputs (threads t and t + DV: other keys)
const PW: u32 = DV + 2u;

{$ if V4 $}
const D4: u32 = {{ D // 4 }}u;
const DV4: u32 = {{ DV // 4 }}u;
var<workgroup> qs: array<vec4<f32>, {{ GR * BQ * D // 4 }}>;
{$ else $}
var<workgroup> qs: array<f32, {{ GR * BQ * D }}>;
{$ endif $}
var<workgroup> ps: array<f32, {{ GR * BQ * BK }}>;  // [row][key]: scores, then exp(score - m)
var<workgroup> red: array<f32, {{ WG }}>;
var<workgroup> red2: array<f32, {{ WG }}>;
var<workgroup> rowf: array<f32, {{ GR * BQ }}>;  // per row: this tile's rescale factor
var<workgroup> rowm: array<f32, {{ GR * BQ }}>;  // at the end: m and l
var<workgroup> rowl: array<f32, {{ GR * BQ }}>;

fn q_base_of(bt: u32) -> u32 { return {{ q_base }}; }
fn k_base_of(bt: u32) -> u32 { return {{ k_base }}; }
fn v_base_of(bt: u32) -> u32 { return {{ v_base }}; }
{$ if has_bias $}
fn bias_base_of(bt: u32) -> u32 { return {{ bias_base }}; }
{$ endif $}
{$ if has_cond $}
fn cond_base_of(bt: u32) -> u32 { return {{ cond_base }}; }
{$ endif $}
{$ else $}
const NS: u32 = {{ (BQ * BK + WG - 1) // WG }}u;  // scores per thread per tile

var<workgroup> qs: array<f32, {{ BQ * D }}>;
var<workgroup> ps: array<f32, {{ BQ * BK }}>;
var<workgroup> rowf: array<f32, {{ BQ }}>;
{$ endif $}

{$ include "attention_score.wgsl" $}

{# element (key j, column d) of k: k_sj / k_sd are its strides ([.., Sk, D] or, with k
   transposed, [.., D, Sk] read in place) #}
{$ macro k_at(j, d) $}kb + ({{ j }}) * {{ k_sj }} + ({{ d }}) * {{ k_sd }}{$ endmacro $}
{$ macro dyn_sizes() $}
{$ for name, v in sizes if "dims." in v $}
    let {{ name }} = {{ v }};
{$ endfor $}
{$ endmacro $}


@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
{{ dyn_sizes() }}
{$ if gate $}
    if (!({{ gate }})) { return; }  // Sq known at dispatch: the other kernel serves this size
{$ endif $}
{$ if SPLIT $}
{$ set RB = GR * BQ $}
    let nkt = (SK + BK - 1u) / BK;           // tiles of keys
    let tps = (nkt + NSPLIT - 1u) / NSPLIT;  // tiles per block
    let ns = (nkt + tps - 1u) / tps;         // blocks (each holds at least one key)
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB / GR * ns) { return; }  // (uniform per workgroup: before any barrier)
    let gi = g / ns;
    let sp = g - gi * ns;
    let bt0 = gi * GR;  // the workgroup's first query head (flat batch index)
    let kb = k_base_of(bt0);
    let vb = v_base_of(bt0);
{$ for i in range(GR) $}
{$ if has_bias $}
    let bb{{ i }} = bias_base_of(bt0 + {{ i }}u);
{$ endif $}
{$ if has_cond $}
    let cb{{ i }} = cond_base_of(bt0 + {{ i }}u);
{$ endif $}
{$ endfor $}
{$ if window $}
    // keys before the first row's window are skipped: no row of the workgroup sees them (a block
    // wholly before it sums nothing: m = -inf, l = 0, weight 0 in the reduce)
    // (max(..) - ..: never below 0, also where SK and SQ are constants: no const-expression overflow)
    let j_lo = max(sp * tps * BK, max(SK + 1u, SQ + {{ window }}u) - SQ - {{ window }}u);
    let j_hi = min(sp * tps * BK + tps * BK, SK);
{$ else $}
    let j_lo = sp * tps * BK;
    let j_hi = min(j_lo + tps * BK, SK);
{$ endif $}
{$ if V4 $}
    // V4: q, k and v bound as vec4 (head sizes, row strides and offsets multiples of 4)
    for (var e = t; e < RB * D4; e += WG) {
        let r = e / D4;
        let qi = r % BQ;
        var x = vec4<f32>(0.0);
        if (qi < SQ) { x = {{ LD4 }}(q[(q_base_of(bt0 + r / BQ) + qi * {{ q_si }}) / 4u + (e - r * D4)]); }
        qs[e] = x;
    }
{$ else $}
    for (var e = t; e < RB * D; e += WG) {
        let r = e / D;
        let qi = r % BQ;
        var x = 0.0;
        if (qi < SQ) { x = {{ LD }}(q[q_base_of(bt0 + r / BQ) + qi * {{ q_si }} + (e - r * D)]); }
        qs[e] = x;
    }
{$ endif $}
    let row = t / TPR;             // row statistics: this thread's row (none past RB rows)
    let share = t - row * TPR;     // and its share of a tile's keys (every TPR-th)
    let ks = t / {{ CT }}u;        // outputs: this thread's key slice (every KS-th key)
    let c0 = t - ks * {{ CT }}u;   // and its first column (quad with V4)
    var m_run = neg_inf();  // the running maximum of this thread's row
    var l_run = 0.0;        // and its sum of exp(score - m_run) (the row's first thread)
    // outputs of this thread (columns c0 + u CT, every row), named accumulators: a dynamically
    // indexed local array would live in scratch memory on GPUs
{$ for u in range(NU) $}
{$ for r in range(RB) $}
    var acc{{ u }}_{{ r }} = {{ "vec4<f32>(0.0)" if V4 else "0.0" }};
{$ endfor $}
{$ endfor $}
    workgroupBarrier();
    for (var j0 = j_lo; j0 < j_hi; j0 += BK) {
        let jn = min(BK, j_hi - j0);  // keys of this tile
        {
{$ for r in range(RB) $}
            var s{{ r }} = 0.0;
{$ endfor $}
            if (t < jn) {  // key j0 + t: its K row read once for every row
{$ if V4 $}
                let kr = ({{ k_at("j0 + t", "0u") }}) / 4u;
                for (var d = 0u; d < D4; d++) {
                    let kv = {{ LD4 }}(k[kr + d]);
{$ for r in range(RB) $}
                    s{{ r }} += dot(qs[{{ r }}u * D4 + d], kv);
{$ endfor $}
                }
{$ else $}
                for (var d = 0u; d < D; d++) {
                    let kv = {{ LD }}(k[{{ k_at("j0 + t", "d") }}]);
{$ for r in range(RB) $}
                    s{{ r }} = fma(qs[{{ r }}u * D + d], kv, s{{ r }});
{$ endfor $}
                }
{$ endif $}
            }
{$ for r in range(RB) $}
            {
                var x = neg_inf();
                if (t < jn && {{ r % BQ }}u < SQ) { x = score(s{{ r }}, {{ r % BQ }}u, j0 + t, {{ ("bb" ~ (r // BQ)) if has_bias else "0u" }}, {{ ("cb" ~ (r // BQ)) if has_cond else "0u" }}, SQ, SK); }
                ps[{{ r }}u * BK + t] = x;
            }
{$ endfor $}
        }
        workgroupBarrier();
        if (row < RB) {
            var mx = m_run;
            for (var j = share; j < jn; j += TPR) { mx = max(mx, ps[row * BK + j]); }
            red[t] = mx;
        }
        workgroupBarrier();
        var a = 0.0;
        if (row < RB) {
            var m = m_run;
            for (var u = 0u; u < TPR; u++) { m = max(m, red[row * TPR + u]); }
            var ls = 0.0;
            for (var j = share; j < jn; j += TPR) {
                let p = ex(ps[row * BK + j], m);
                ps[row * BK + j] = p;
                ls += p;
            }
            red2[t] = ls;
            // rescale what earlier tiles summed; nothing was summed while the maximum was -inf
            a = select(exp(m_run - m), 0.0, is_neg_inf(m_run));
            m_run = m;
            if (share == 0u) { rowf[row] = a; }
        }
        workgroupBarrier();
        if (row < RB && share == 0u) {
            var l = 0.0;
            for (var u = 0u; u < TPR; u++) { l += red2[row * TPR + u]; }
            l_run = l_run * a + l;
        }
        if (ks < KS) {
{$ for r in range(RB) $}
            let f{{ r }} = rowf[{{ r }}u];
{$ for u in range(NU) $}
            acc{{ u }}_{{ r }} = acc{{ u }}_{{ r }} * f{{ r }};
{$ endfor $}
{$ endfor $}
            for (var j = ks; j < jn; j += KS) {
                let vr = {{ "(" if V4 else "" }}vb + (j0 + j) * {{ v_sj }}{{ ") / 4u" if V4 else "" }};
{$ for u in range(NU) $}
                {
                    let c = c0 + {{ u * CT }}u;
{$ if NU > 1 $}
                    if (c < {{ "DV4" if V4 else "DV" }}) {
{$ endif $}
                    let vv = {{ LD4 if V4 else LD }}(v[vr + c]);  // V read once for every row
{$ for r in range(RB) $}
                    acc{{ u }}_{{ r }} = fma({{ "vec4<f32>(" if V4 else "" }}ps[{{ r }}u * BK + j]{{ ")" if V4 else "" }}, vv, acc{{ u }}_{{ r }});
{$ endfor $}
{$ if NU > 1 $}
                    }
{$ endif $}
                }
{$ endfor $}
            }
        }
        workgroupBarrier();  // ps and rowf are rewritten by the next tile
    }
    if (row < RB && share == 0u) {
        rowm[row] = m_run;
        rowl[row] = l_run;
    }
    workgroupBarrier();
    if (ks < KS) {
        // partial e = block * KS + key slice of row (bt, qi): part[((bt SQ + qi) ne + e) PW ..];
        // every slice stores the block's maximum, the first one its sum (the others 0)
        let ne = ns * KS;
{$ for r in range(RB) $}
        if ({{ r % BQ }}u < SQ) {
            let pb = (((bt0 + {{ r // BQ }}u) * SQ + {{ r % BQ }}u) * ne + sp * KS + ks) * PW;
            if (c0 == 0u) {
                part[pb] = rowm[{{ r }}u];
                part[pb + 1u] = select(0.0, rowl[{{ r }}u], ks == 0u);
            }
{$ for u in range(NU) $}
            {
                let c = c0 + {{ u * CT }}u;
{$ if V4 $}
                if (c < DV4) {
{$ for i in range(4) $}
                    part[pb + 2u + 4u * c + {{ i }}u] = acc{{ u }}_{{ r }}[{{ i }}];
{$ endfor $}
                }
{$ else $}
                if (c < DV) { part[pb + 2u + c] = acc{{ u }}_{{ r }}; }
{$ endif $}
            }
{$ endfor $}
        }
{$ endfor $}
    }
{$ else $}
    let nqt = (SQ + BQ - 1u) / BQ;
{$ if TPS $}
    // key split (TPS tiles a block, runtime/wgsl.py LOOP_BUDGET): workgroup (query tile, block)
    let nsb = ((SK + BK - 1u) / BK + {{ TPS - 1 }}u) / {{ TPS }}u;
    let gk = wid.y * nwg.x + wid.x;
    if (gk >= NB * nqt * nsb) { return; }  // (uniform per workgroup: before any barrier)
    let sb = gk % nsb;
    let g = gk / nsb;
{$ else $}
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB * nqt) { return; }  // (uniform per workgroup: before any barrier)
{$ endif $}
    let bt = g / nqt;
    let q0 = (g - bt * nqt) * BQ;
    let qb = {{ q_base }};
    let kb = {{ k_base }};
    let vb = {{ v_base }};
    let obase = {{ o_base }};
    let bb = {{ bias_base if has_bias else "0u" }};
    let cb = {{ cond_base if has_cond else "0u" }};
    // keys no row of the tile sees are skipped
    var kend = keys_end(q0, SQ, SK);
    var j_lo = keys_first(q0, SQ, SK);
{$ if TPS $}
    j_lo = max(j_lo, sb * {{ TPS * BK }}u);
    kend = min(kend, sb * {{ TPS * BK }}u + {{ TPS * BK }}u);  // (a block past the causal limit sums nothing)
{$ endif $}
    var m_run = neg_inf();  // the running maximum of this thread's row
    var l_run = 0.0;        // and its sum of exp(score - m_run) (the row's first thread)
{$ if STAGE $}
    for (var e = t; e < D * BQ4; e += WG) {
        let d = e / BQ4;
        let r4 = e - d * BQ4;
        var x = vec4<f32>(0.0);
{$ for i in range(4) $}
        if (q0 + 4u * r4 + {{ i }}u < SQ) { x[{{ i }}] = {{ LD }}(q[qb + (q0 + 4u * r4 + {{ i }}u) * {{ q_si }} + d]); }
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
    for (var j0 = j_lo; j0 < kend; j0 += BK) {
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
                if (4u * c4 + {{ i }}u < DV) { x[{{ i }}] = {{ LD }}(v[vb + (j0 + j) * {{ v_sj }} + 4u * c4 + {{ i }}u]); }
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
{$ if TPS $}
    // key split: the block's partials of each row (maximum, sum, unnormalized outputs), combined
    // by the REDUCE kernel as the split decode's: pout[((bt SQ + qi) nsb + sb) PW ..]
    if (part == 0u && q0 + row < SQ) {
        let pb = ((bt * SQ + q0 + row) * nsb + sb) * (DV + 2u);
        pout[pb] = m_run;
        pout[pb + 1u] = l_run;
    }
{$ endif $}
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
{$ if TPS $}
                        pout[((bt * SQ + qi) * nsb + sb) * (DV + 2u) + 2u + 4u * (c4 + {{ u }}u) + {{ c }}u] = o{{ b }}_{{ i }}_{{ u }}[{{ c }}];
{$ else $}
                        // a row with every score -inf has l = 0: NaN, as the unfused 0 / 0
                        let y = select(o{{ b }}_{{ i }}_{{ u }}[{{ c }}] / l, {{ empty_row }}, l == 0.0);
                        let oi = obase + qi * {{ o_si }} + 4u * (c4 + {{ u }}u) + {{ c }}u;
                        out[oi] = act({{ ST }}(y), oi);
{$ endif $}
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
        if (qi < SQ) { x = {{ LD }}(q[qb + qi * {{ q_si }} + e % D]); }
        qs[e] = x;
    }
{$ set no = (BQ * DV + WG - 1) // WG $}
    // outputs of this thread (o = t + s * WG), named accumulators: a dynamically indexed local
    // array would live in scratch memory on GPUs
{$ for s in range(no) $}
    var acc{{ s }} = 0.0;
{$ endfor $}
    workgroupBarrier();
    for (var j0 = j_lo; j0 < kend; j0 += BK) {
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
                    a += ps[r * BK + j] * {{ LD }}(v[vb + (j0 + j) * {{ v_sj }} + d]);
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
            let y = select(acc{{ s }} / l, {{ empty_row }}, l == 0.0);
            let oi = obase + qi * {{ o_si }} + (o - r * DV);
            out[oi] = act({{ ST }}(y), oi);
        }
    }
{$ endfor $}
{$ endif $}
{$ endif $}
}
{$ endif $}
