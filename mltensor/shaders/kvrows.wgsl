// `_kv_scatter` and `_attention_rows` (mltensor/ops/kvrows.py): a step over rows of several
// sequences whose keys and values share one KV cache of slots.
{{ bindings }}
{$ include "common.wgsl" $}
{$ if SCATTER $}
// One thread per element of the rows' values: value k's row r goes to cache row dst[r] (rows
// at or past the cache's `rows` are dropped: the host never sends one).
{{ main_1d(n) }}
    let r = i / {{ ROW }}u;
    let e = i - r * {{ ROW }}u;
    let at = dst[r];
    if (at < 0 || u32(at) >= {{ rows }}u) { return; }
{$ for size in sizes $}
{$ if size == ROW $}
    dst{{ loop.index0 }}[u32(at) * {{ ROW }}u + e] = src{{ loop.index0 }}[i];
{$ else $}
    if (e < {{ size }}u) { dst{{ loop.index0 }}[u32(at) * {{ size }}u + e] = src{{ loop.index0 }}[r * {{ size }}u + e]; }
{$ endif $}
{$ endfor $}
}
{$ elif CPU $}
// CPU adapters: one thread per (row r, head h), no workgroup memory and no barriers (llvmpipe
// runs a workgroup's invocations as SIMD lanes of one core, where every barrier is a switch
// between them). The thread keeps q and its DV outputs in named vec4s and walks its keys one at a
// time with an online softmax: the first key sets m (no infinities), each later one rescales the
// running sum l and the outputs by exp(m_old - m_new). All sums in f32.
const H: u32 = {{ H }}u;
const HKV: u32 = {{ HKV }}u;
const GRP: u32 = {{ H // HKV }}u;

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let g = (wid.y * nwg.x + wid.x) * {{ WG }}u + t;
    if (g >= {{ R }} * H) { return; }
    let r = g / H;
    let h = g - r * H;
    let kh = h / GRP;
    let p = u32(max(pos[r], 0));
    let dr = u32(max(dst[r], 0));
{$ if RING $}
    let base = dr - min(p % {{ RING }}u, dr);
{$ else $}
    let base = dr - min(p, dr);
{$ endif $}
    var lo = 0u;
{$ if window $}
    if (p + 1u > {{ window }}u) { lo = p + 1u - {{ window }}u; }
{$ endif $}
    let qb = (r * H + h) * {{ D }}u;
{$ for c in range(D // 4) $}
    let q{{ c }} = vec4<f32>({{ LD }}(q[qb + {{ 4 * c }}u]), {{ LD }}(q[qb + {{ 4 * c + 1 }}u]),
                          {{ LD }}(q[qb + {{ 4 * c + 2 }}u]), {{ LD }}(q[qb + {{ 4 * c + 3 }}u]));
{$ endfor $}
    var m = 0.0;
    var l = 0.0;
{$ for c in range(DV // 4) $}
    var acc{{ c }} = vec4<f32>(0.0);
{$ endfor $}
    for (var j = lo; j <= p; j = j + 1u) {
        let row = (base + {$ if RING $}j % {{ RING }}u{$ else $}j{$ endif $}) * HKV + kh;
        let kb = row * {{ D }}u;
        var s = 0.0;
{$ for c in range(D // 4) $}
{$ if V4 $}
        s = s + dot(q{{ c }}, k[kb / 4u + {{ c }}u]);
{$ else $}
        s = s + dot(q{{ c }}, vec4<f32>({{ LD }}(k[kb + {{ 4 * c }}u]), {{ LD }}(k[kb + {{ 4 * c + 1 }}u]),
                                      {{ LD }}(k[kb + {{ 4 * c + 2 }}u]), {{ LD }}(k[kb + {{ 4 * c + 3 }}u])));
{$ endif $}
{$ endfor $}
        s = s * {{ scale }};
{$ if softcap $}
        s = {{ softcap }} * tanh(s * {{ inv_softcap }});
{$ endif $}
        let first = j == lo;
        let mn = select(max(m, s), s, first);
        let alpha = select(exp(min(m - mn, 0.0)), 0.0, first);  // (first: m is no score yet)
        let e = exp(s - mn);
        l = l * alpha + e;
        let vb = row * {{ DV }}u;
{$ for c in range(DV // 4) $}
{$ if V4 $}
        acc{{ c }} = acc{{ c }} * alpha + e * v[vb / 4u + {{ c }}u];
{$ else $}
        acc{{ c }} = acc{{ c }} * alpha + e * vec4<f32>({{ LD }}(v[vb + {{ 4 * c }}u]), {{ LD }}(v[vb + {{ 4 * c + 1 }}u]),
                                                     {{ LD }}(v[vb + {{ 4 * c + 2 }}u]), {{ LD }}(v[vb + {{ 4 * c + 3 }}u]));
{$ endif $}
{$ endfor $}
        m = mn;
    }
    let ob = (r * H + h) * {{ DV }}u;
{$ for c in range(DV // 4) $}
    out[ob + {{ 4 * c }}u] = {{ ST }}(acc{{ c }}.x / l);
    out[ob + {{ 4 * c + 1 }}u] = {{ ST }}(acc{{ c }}.y / l);
    out[ob + {{ 4 * c + 2 }}u] = {{ ST }}(acc{{ c }}.z / l);
    out[ob + {{ 4 * c + 3 }}u] = {{ ST }}(acc{{ c }}.w / l);
{$ endfor $}
}
{$ else $}
// One workgroup per (row r, head h): the keys of r's sequence, cache rows dst[r] - pos[r] ..
// dst[r] (from dst[r] - (window - 1) on a sliding-window layer; in a ring of RING positions a
// slot's position j is its row j mod RING), in tiles of WG keys. Per tile:
// a thread's key's score (q staged in workgroup memory), the tile's maximum and the sum of
// exp(score - m) by tree reductions (online softmax: the running sum l and the outputs are
// rescaled by exp(m_old - m_new)), then each thread adds p_j v_j over the tile's keys for its
// columns t, t + WG, ... (NC named accumulators). All sums in f32.
const H: u32 = {{ H }}u;
const HKV: u32 = {{ HKV }}u;
const GRP: u32 = {{ H // HKV }}u;
const D: u32 = {{ D }}u;
const DV: u32 = {{ DV }}u;
const WG: u32 = {{ WG }}u;

var<workgroup> qs: array<f32, {{ D }}>;
var<workgroup> ps: array<f32, {{ WG }}>;
var<workgroup> red: array<f32, {{ WG }}>;
var<workgroup> bcast: vec2<u32>;

fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= {{ R }} * H) { return; }  // (uniform per workgroup: before the barriers)
    let r = g / H;
    let h = g - r * H;
    let kh = h / GRP;
    if (t == 0u) { bcast = vec2<u32>(u32(max(pos[r], 0)), u32(max(dst[r], 0))); }
    let pd = workgroupUniformLoad(&bcast);  // (uniform: the loop bounds below hold barriers)
    let p = pd.x;
    // the cache row of the slot's first position: dst - p (a ring of RING positions: dst - p % RING)
{$ if RING $}
    let base = pd.y - min(p % {{ RING }}u, pd.y);
{$ else $}
    let base = pd.y - min(p, pd.y);
{$ endif $}
    var lo = 0u;
{$ if window $}
    if (p + 1u > {{ window }}u) { lo = p + 1u - {{ window }}u; }
{$ endif $}
    for (var d = t; d < D; d = d + WG) { qs[d] = {{ LD }}(q[(r * H + h) * D + d]); }
    workgroupBarrier();
    var m = neg_inf();
    var l = 0.0;
{$ for c in range(NC) $}
    var acc{{ c }} = 0.0;
{$ endfor $}
    for (var j0 = lo; j0 <= p; j0 = j0 + WG) {
        let j = j0 + t;
        var s = neg_inf();
        if (j <= p) {
            let kb = ((base + {$ if RING $}j % {{ RING }}u{$ else $}j{$ endif $}) * HKV + kh) * D;
            var dot = 0.0;
            for (var d = 0u; d < D; d = d + 1u) { dot = dot + qs[d] * {{ LD }}(k[kb + d]); }
            s = dot * {{ scale }};
{$ if softcap $}
            s = {{ softcap }} * tanh(s * {{ inv_softcap }});
{$ endif $}
        }
        red[t] = s;
        workgroupBarrier();
        for (var w = WG / 2u; w > 0u; w = w >> 1u) {
            if (t < w) { red[t] = max(red[t], red[t + w]); }
            workgroupBarrier();
        }
        let mn = max(m, red[0]);
        workgroupBarrier();
        let e = select(exp(s - mn), 0.0, j > p);
        ps[t] = e;
        red[t] = e;
        workgroupBarrier();
        for (var w = WG / 2u; w > 0u; w = w >> 1u) {
            if (t < w) { red[t] = red[t] + red[t + w]; }
            workgroupBarrier();
        }
        let alpha = select(exp(m - mn), 0.0, m == neg_inf());
        l = l * alpha + red[0];
        let cnt = min(WG, p + 1u - j0);
{$ for c in range(NC) $}
        acc{{ c }} = acc{{ c }} * alpha;
{$ endfor $}
        for (var jj = 0u; jj < cnt; jj = jj + 1u) {
            let pj = ps[jj];
            let vb = ((base + {$ if RING $}(j0 + jj) % {{ RING }}u{$ else $}j0 + jj{$ endif $}) * HKV + kh) * DV;
{$ for c in range(NC) $}
            if (t + {{ c * WG }}u < DV) { acc{{ c }} = acc{{ c }} + pj * {{ LD }}(v[vb + t + {{ c * WG }}u]); }
{$ endfor $}
        }
        m = mn;
        workgroupBarrier();  // (ps and red are rewritten by the next tile)
    }
    let ob = (r * H + h) * DV;
{$ for c in range(NC) $}
    if (t + {{ c * WG }}u < DV) { out[ob + t + {{ c * WG }}u] = {{ ST }}(acc{{ c }} / l); }
{$ endfor $}
}
{$ endif $}
