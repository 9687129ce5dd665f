// TopK along one axis (mltensor/ops/sort.py): the k first elements of each row (the elements
// sharing the coordinates outside the axis, N of them, INNER apart) in the order
//   largest: NaN first, then descending values; smallest: ascending values, NaN last;
//   ties (-0 equal to +0, every NaN equal): the lower index first (onnxruntime's order).
// Every element becomes a sort key (KT: u32, or vec2<u32> = (high, low) words for 64-bit
// integers) whose ascending order is that order, and (key, index) pairs are compared
// lexicographically: a strict total order, so every algorithm below gives the same result.
// Padding slots hold the sentinel (all-ones key, index 0xffffffff), after every real element.
//
// mode "row":   one thread per chunk of CL elements of a row keeps its best K in named registers
//               (K <= 16: a chunk of a row, or a whole row)
// mode "reg":   one workgroup per chunk of a row; each thread keeps its best K in named registers
//               over a strided part of the chunk, then the lists are merged pairwise through
//               workgroup memory (log2 WG rounds)
// mode "block": one workgroup per chunk of B (a power of two) elements: a bitonic sort of the
//               (key, index) pairs in workgroup memory, its first L kept
// mode "merge": one thread per slot of the S sorted runs (L pairs each) of a row: runs 2m and
//               2m + 1 are merged by rank (the slot's position in its run plus a binary search
//               in the other run), the first LO pairs kept
// Every mode writes either pairs (`pout`, PW = KW + 1 words a pair, runs back to back per row)
// or, when FINAL, the outputs: indices (int64: two words, high word 0) and values (copied from x).
// Barriers sit in loops with constant trip counts; nothing read from memory steers them.
{{ bindings }}
{$ include "common.wgsl" $}

{$ if KW == 1 $}
alias KT = u32;
const SENT_K = 0xffffffffu;
fn before(ak: KT, ai: u32, bk: KT, bi: u32) -> bool {
    return ak < bk || (ak == bk && ai < bi);
}
{$ else $}
alias KT = vec2<u32>;  // (high word, low word)
const SENT_K = vec2<u32>(0xffffffffu, 0xffffffffu);
fn before(ak: KT, ai: u32, bk: KT, bi: u32) -> bool {
    if (ak.x != bk.x) { return ak.x < bk.x; }
    if (ak.y != bk.y) { return ak.y < bk.y; }
    return ai < bi;
}
{$ endif $}
const SENT_I = 0xffffffffu;
const N = {{ N }}u;          // row length
const INNER = {{ INNER }}u;  // distance of a row's elements in x
const KO = {{ KO }}u;        // k: the output's length along the axis
const PW = {{ KW + 1 }}u;    // words a pair

{$ if has_x $}
// element j of row r in x (and, with KO for N, position q of row r in the outputs)
fn xaddr(r: u32, j: u32) -> u32 {
{$ if INNER == 1 $}
    return r * N + j;
{$ else $}
    return (r / INNER) * (N * INNER) + r % INNER + j * INNER;
{$ endif $}
}

// the sort key of the element at x offset a
fn xkey(a: u32) -> KT {
{$ if kind in ("f32", "f16") $}
{$ if kind == "f16" $}
    let b = bitcast<u32>(f32(x[a]));  // exact (naga has no bitcast of an f16's bits)
{$ else $}
    let b = x[a];
{$ endif $}
    // bit tests only: NaN above +inf (one key for all), -0 as +0, negatives with every bit flipped
    var o = select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
    if ((b & 0x7fffffffu) > 0x7f800000u) { o = 0xffffffffu; }
    if (b == 0x80000000u) { o = 0x80000000u; }
{$ elif kind == "i32" $}
    let o = x[a] ^ 0x80000000u;
{$ elif kind == "u32" $}
    let o = x[a];
{$ elif kind == "i64" $}
    let o = vec2<u32>(x[2u * a + 1u] ^ 0x80000000u, x[2u * a]);
{$ else $}
    let o = vec2<u32>(x[2u * a + 1u], x[2u * a]);
{$ endif $}
{$ if LARGEST $}
    return ~o;
{$ else $}
    return o;
{$ endif $}
}
{$ endif $}

{$ if FINAL $}
// output position q of row r: index j of the row's element, its value copied from x
fn store_out(r: u32, q: u32, j: u32) {
{$ if INNER == 1 $}
    let o = r * KO + q;
{$ else $}
    let o = (r / INNER) * (KO * INNER) + r % INNER + q * INNER;
{$ endif $}
    idxs[2u * o] = j;
    idxs[2u * o + 1u] = 0u;
    let a = xaddr(r, j);
{$ if XW == 2 $}
    vals[2u * o] = x[2u * a];
    vals[2u * o + 1u] = x[2u * a + 1u];
{$ else $}
    vals[o] = x[a];
{$ endif $}
}
{$ else $}
fn store_pair(s: u32, k: KT, j: u32) {
{$ if KW == 1 $}
    pout[s * PW] = k;
{$ else $}
    pout[s * PW] = k.x;
    pout[s * PW + 1u] = k.y;
{$ endif $}
    pout[s * PW + {{ KW }}u] = j;
}
{$ endif $}

{$ if has_pin $}
fn pin_key(s: u32) -> KT {
{$ if KW == 1 $}
    return pin[s * PW];
{$ else $}
    return vec2<u32>(pin[s * PW], pin[s * PW + 1u]);
{$ endif $}
}
fn pin_idx(s: u32) -> u32 { return pin[s * PW + {{ KW }}u]; }
{$ endif $}

{# -- named register lists (modes row and reg): lk0..lk{K-1}, li0..li{K-1}, sorted -- #}
{$ macro declare_list() $}
{$ for q in range(K) $}
    var lk{{ q }} = SENT_K;
    var li{{ q }} = SENT_I;
{$ endfor $}
{$ endmacro $}
{# insert (ck, ci) into the list: it bubbles down from the top, the last pair falls off #}
{$ macro insert(ck, ci) $}
    if (before({{ ck }}, {{ ci }}, lk{{ K - 1 }}, li{{ K - 1 }})) {
        var ck_ = {{ ck }};
        var ci_ = {{ ci }};
{$ for q in range(K) $}
        {
            let sw = before(ck_, ci_, lk{{ q }}, li{{ q }});
            let tk = lk{{ q }};
            let ti = li{{ q }};
            lk{{ q }} = select(tk, ck_, sw);
            li{{ q }} = select(ti, ci_, sw);
            ck_ = select(ck_, tk, sw);
            ci_ = select(ci_, ti, sw);
        }
{$ endfor $}
    }
{$ endmacro $}

{$ if mode == "row" $}
const S = {{ S }}u;    // chunks a row
const CL = {{ CL }}u;  // elements a chunk
{{ main_1d(ROWS * S) }}
    let r = i / S;
    let c = i % S;
    let end = min(c * CL + CL, N);
{{ declare_list() }}
    for (var j = c * CL; j < end; j++) {
        let ck = xkey(xaddr(r, j));
{{ insert("ck", "j") }}
    }
{$ for q in range(K) $}
{$ if FINAL $}
    store_out(r, {{ q }}u, li{{ q }});
{$ else $}
    store_pair(i * {{ K }}u + {{ q }}u, lk{{ q }}, li{{ q }});
{$ endif $}
{$ endfor $}
}

{$ elif mode == "reg" $}
const WG = {{ WG }}u;
const S = {{ S }}u;    // chunks a row
const CL = {{ CL }}u;  // elements a chunk
const K = {{ K }}u;
var<workgroup> shk: array<KT, {{ WG // 2 * K }}>;
var<workgroup> shi: array<u32, {{ WG // 2 * K }}>;

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;  // (uniform: past the last group, the whole group returns)
    if (g >= {{ GROUPS }}u) { return; }
    let r = g / S;
    let c = g % S;
    let end = min(c * CL + CL, N);
{{ declare_list() }}
    for (var j = c * CL + lid; j < end; j += WG) {
        let ck = xkey(xaddr(r, j));
{{ insert("ck", "j") }}
    }
    // pairwise merges: threads [s, 2s) hand their lists to threads [0, s)
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid >= s && lid < 2u * s) {
            let base = (lid - s) * K;
{$ for q in range(K) $}
            shk[base + {{ q }}u] = lk{{ q }};
            shi[base + {{ q }}u] = li{{ q }};
{$ endfor $}
        }
        workgroupBarrier();
        if (lid < s) {
            for (var q = 0u; q < K; q++) {
                let ck = shk[lid * K + q];
                let ci = shi[lid * K + q];
                if (!before(ck, ci, lk{{ K - 1 }}, li{{ K - 1 }})) { break; }  // the rest is sorted after it
{{ insert("ck", "ci") }}
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
{$ for q in range(K) $}
{$ if FINAL $}
        store_out(r, {{ q }}u, li{{ q }});
{$ else $}
        store_pair(g * K + {{ q }}u, lk{{ q }}, li{{ q }});
{$ endif $}
{$ endfor $}
    }
}

{$ elif mode == "block" $}
const WG = {{ WG }}u;
const S = {{ S }}u;   // chunks a row
const B = {{ B }}u;   // elements a chunk (a power of two; the last chunk padded)
const L = {{ L }}u;   // pairs kept a chunk
var<workgroup> sk: array<KT, {{ B }}>;
var<workgroup> si: array<u32, {{ B }}>;

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;  // (uniform: past the last group, the whole group returns)
    if (g >= {{ GROUPS }}u) { return; }
    let r = g / S;
    let c = g % S;
    for (var e = lid; e < B; e += WG) {
        let j = c * B + e;
        var k = SENT_K;
        var ji = SENT_I;
        if (j < N) {
            k = xkey(xaddr(r, j));
            ji = j;
        }
        sk[e] = k;
        si[e] = ji;
    }
    workgroupBarrier();
    // bitonic sort, ascending
    for (var size = 2u; size <= B; size = size << 1u) {
        for (var stride = size >> 1u; stride > 0u; stride = stride >> 1u) {
            for (var p = lid; p < B / 2u; p += WG) {
                let a = 2u * p - (p & (stride - 1u));
                let b = a + stride;
                let ka = sk[a];
                let ia = si[a];
                let kb = sk[b];
                let ib = si[b];
                // ascending halves want a before b: swap when b comes first (descending: the
                // reverse; equal pairs are sentinels, where a swap changes nothing)
                if (before(kb, ib, ka, ia) == ((a & size) == 0u)) {
                    sk[a] = kb;
                    si[a] = ib;
                    sk[b] = ka;
                    si[b] = ia;
                }
            }
            workgroupBarrier();
        }
    }
    for (var q = lid; q < L; q += WG) {
{$ if FINAL $}
        store_out(r, q, si[q]);
{$ else $}
        store_pair(g * L + q, sk[q], si[q]);
{$ endif $}
    }
}

{$ elif mode == "merge" $}
const S = {{ S }}u;    // runs a row
const L = {{ L }}u;    // pairs a run
const LO = {{ LO }}u;  // pairs kept of a merged run
const SO = {{ (S + 1) // 2 }}u;

{{ main_1d(TOTAL) }}
    let r = i / (S * L);
    let run = (i / L) % S;
    let p = i % L;
    let ek = pin_key(i);
    let ei = pin_idx(i);
    let other = run ^ 1u;
    var pos = p;
    if (other < S) {
        // rank in the other run: pairs strictly before this one (ties, between sentinels only,
        // put the even run first, so every position is taken once)
        let ob = (r * S + other) * L;
        var lo = 0u;
        var hi = L;
        if ((run & 1u) == 0u) {
            while (lo < hi) {
                let mid = (lo + hi) >> 1u;
                let before_e = before(pin_key(ob + mid), pin_idx(ob + mid), ek, ei);
                if (before_e) { lo = mid + 1u; } else { hi = mid; }
            }
        } else {
            while (lo < hi) {
                let mid = (lo + hi) >> 1u;
                let after_e = before(ek, ei, pin_key(ob + mid), pin_idx(ob + mid));
                if (after_e) { hi = mid; } else { lo = mid + 1u; }
            }
        }
        pos = p + lo;
    }
{$ if FINAL $}
    if (pos < LO) { store_out(r, pos, ei); }
{$ else $}
    let ob = (r * SO + run / 2u) * LO;
    if (pos < LO) { store_pair(ob + pos, ek, ei); }
    // a run without a partner: the slots past its own are padding
    if (other >= S && p + L < LO) { store_pair(ob + p + L, SENT_K, SENT_I); }
{$ endif $}
}
{$ endif $}
