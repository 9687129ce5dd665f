// Non-maximum suppression (mltensor/ops/select.py `_nms`) with onnxruntime's NonMaxSuppression
// semantics (core/providers/cpu/object_detection/non_max_suppression.cc). boxes: f32 [B, S, 4],
// scores: f32 [B, C, S]; one workgroup per (batch, class) g = b * C + c.
// Paths:
//   "select":  per g: (1) the candidates (score > the threshold; without one every score but
//              NaN) as keys (~order(score), box index) in keys[g * PMAX ..] (atomic slots: the
//              order is made by the sort); (2) a bitonic sort of the keys, ascending, i.e. by score
//              descending then box index ascending (onnxruntime's order: its priority queue
//              pops the lower index first on equal scores), padded to a power of two with
//              0xffffffff keys: chunks of L keys in workgroup memory, the longer strides in
//              storage; (3) the sorted boxes normalised as onnxruntime's BoxInfo: sbox[g * S + r]
//              = (ymin, xmin, ymax, xmax) and keys[..r] = (bits of the area, box index); (4)
//              greedy selection: the current box p is selected, then every later candidate j it
//              suppresses (IoU > threshold) gets the flag 0x80000000 on its index and the next
//              p is the first unflagged j (a workgroup atomicMin). Thread li owns the candidates
//              j = li mod WG (their flags are never read by another thread), UNROLL of them
//              an iteration. Stops after MS selections. The box indices go to sel[g * MS ..],
//              their number to cnt[g], (candidates, next p) to state[2g ..]. On CPU adapters a
//              launch stops after CAP selections and "resume" launches (resume: steps 1-3
//              skipped) continue from state (see select.py greedy_cap: lavapipe's loop budget).
//   "scatter": after shaders/nonzero.wgsl's "scan" of cnt (exclusive offsets, cnt[W] = total):
//              slot (g, k) of the W * MS writes row cnt[g] + k = (b, c, box) if k < its count,
//              else zeros at row total + (slots not selected before it): every row once.
//   "fill":    no box can be selected (max_per_class 0, a NaN score threshold): zeros, count 0.
// `selected` (int64 [rows, 3]) is bound as u32 word pairs (low, high).
{{ bindings }}
{$ include "common.wgsl" $}

const WG = {{ WORKGROUP }}u;

{$ if path == "fill" $}
{{ main_1d(WORDS) }}
    out[i] = 0u;
    if (i == 0u) { count[0] = 0; }
}
{$ elif path == "scatter" $}
const W = {{ W }}u;
const C = {{ C }}u;
const MS = {{ MS }}u;

{{ main_1d(W * MS) }}
    let g = i / MS;
    let k = i - g * MS;
    let first = cnt[g];
    let next = cnt[g + 1u];
    var row = 0u;
    var b = 0u;
    var c = 0u;
    var box = 0u;
    if (k < next - first) {
        row = first + k;
        b = g / C;
        c = g - b * C;
        box = sel[i];
    } else {
        row = cnt[W] + i - next;  // slots before i not selected: i - next (g's own: k - count)
    }
    out[6u * row] = b;
    out[6u * row + 1u] = 0u;
    out[6u * row + 2u] = c;
    out[6u * row + 3u] = 0u;
    out[6u * row + 4u] = box;
    out[6u * row + 5u] = 0u;
}
{$ else $}
const S = {{ S }}u;        // boxes
const C = {{ C }}u;        // classes
const W = {{ W }}u;        // batches * classes: workgroups
const PMAX = {{ PMAX }}u;  // keys a workgroup owns: the power of two >= S
const MS = {{ MS }}u;      // selections a (batch, class) at most: min(max_per_class, S) >= 1
const L = {{ L }}u;        // keys sorted in workgroup memory at once (a power of two)
const FLAG = 0x80000000u;  // suppressed (on a candidate's box index)
const NONE = 0xffffffffu;
const UNROLL = {{ UNROLL }}u;

var<workgroup> sk: array<vec2<u32>, {{ L }}>;
var<workgroup> n_keys: atomic<u32>;
var<workgroup> next_p: atomic<u32>;
var<workgroup> bcast: u32;
var<workgroup> bcast3: vec3<u32>;
var<private> opaque_zero: u32;  // 0, unknown to the compiler (see exact_f32)

// an f32 as itself, through an operation no compiler can see through: a product passed through
// it is rounded on its own and never contracted into an fma with the sum it feeds (onnxruntime
// rounds the product, then the sum)
fn exact_f32(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ opaque_zero);
}

// order-preserving u32 of a non-NaN f32 (-0.0 as +0.0: equal scores)
fn order_of(bits: u32) -> u32 {
    let b = select(bits, 0u, bits == 0x80000000u);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn is_candidate(bits: u32) -> bool {
    if ((bits & 0x7fffffffu) > 0x7f800000u) { return false; }  // NaN
{$ if has_threshold $}
    return order_of(bits) > {{ ST_ORDER }}u;  // score > score_threshold
{$ else $}
    return true;
{$ endif $}
}

fn key_less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

// -- the exact comparison RN(a / u) > THR (onnxruntime's f32 division, correctly rounded, then
// compared; WGSL's division may be off by 2.5 ulp). RN(q) > THR iff q is above the midpoint
// MID = THR + ulp(THR) / 2 = MID_M * 2^MID_E, or on it with THR's significand odd (ties to even).

struct Parts {
    m: u32,  // significand (with the implicit bit of normal numbers)
    e: i32,  // x = m * 2^e
}

fn parts(b: u32) -> Parts {
    let f = b & 0x7fffffu;
    let ex = (b >> 23u) & 0xffu;
    if (ex == 0u) { return Parts(f, -149); }
    return Parts(f | 0x800000u, i32(ex) - 150);
}

// x * y as (low, high) words, x < 2^25, y < 2^24
fn wide_mul(x: u32, y: u32) -> vec2<u32> {
    let xl = x & 0xffffu;
    let xh = x >> 16u;
    let yl = y & 0xffffu;
    let yh = y >> 16u;
    let ll = xl * yl;
    let mid = xl * yh + xh * yl;  // < 2^26
    let lo = ll + (mid << 16u);
    return vec2<u32>(lo, xh * yh + (mid >> 16u) + select(0u, 1u, lo < ll));
}

fn bitlen64(v: vec2<u32>) -> u32 {
    if (v.y != 0u) { return 64u - countLeadingZeros(v.y); }
    return 32u - countLeadingZeros(v.x);
}

fn shl64(v: vec2<u32>, s: u32) -> vec2<u32> {  // s < 64
    if (s == 0u) { return v; }
    if (s >= 32u) { return vec2<u32>(0u, v.x << (s - 32u)); }
    return vec2<u32>(v.x << s, (v.y << s) | (v.x >> (32u - s)));
}

// sign of a / u - MID for positive finite a, u (bits ab, ub): a against MID * u, exactly
fn ratio_vs_mid(ab: u32, ub: u32) -> i32 {
    let a = parts(ab);
    let u = parts(ub);
    var xv = vec2<u32>(a.m, 0u);
    var yv = wide_mul({{ MID_M }}u, u.m);
    let lx = bitlen64(xv);
    let ly = bitlen64(yv);
    let px = i32(lx) + a.e;  // a < 2^px, a >= 2^(px - 1)
    let py = i32(ly) + u.e + {{ MID_E }};
    if (px != py) { return select(-1, 1, px > py); }
    if (lx < ly) { xv = shl64(xv, ly - lx); } else { yv = shl64(yv, lx - ly); }
    if (xv.y != yv.y) { return select(-1, 1, xv.y > yv.y); }
    if (xv.x != yv.x) { return select(-1, 1, xv.x > yv.x); }
    return 0;
}

// RN(a / u) > THR for the intersection a > 0 and the union u (bit tests: no NaN or inf reaches
// a float comparison)
fn iou_above(a: f32, u: f32) -> bool {
    let ab = bitcast<u32>(a);
    let ub = bitcast<u32>(u);
    if ((ab & 0x7fffffffu) > 0x7f800000u || (ub & 0x7fffffffu) > 0x7f800000u) { return false; }  // NaN
    if (ab >= 0x80000000u || ab == 0u) { return false; }  // a ratio <= 0 (THR >= 0)
    if (ub == 0u) { return true; }                         // +inf
    if (ub >= 0x80000000u || ub == 0x7f800000u) { return false; }  // negative, or 0 / NaN
    if (ab == 0x7f800000u) { return true; }                // +inf
    let q = a / u;  // within a few ulp: decides unless it is close to THR
    if (q > {{ f32_lit(THR_HI) }}) { return true; }
    if (q < {{ f32_lit(THR_LO) }}) { return false; }
    let r = ratio_vs_mid(ab, ub);
    return r > 0 || (r == 0 && {{ "true" if MID_TIE else "false" }});
}

// onnxruntime's BoxInfo::SuppressByIOU of candidate c (area ca) against the selected box s
// (area sa), boxes as (ymin, xmin, ymax, xmax): std::max / std::min as selects (their operand
// order), the same early outs, union = (ca + sa) - intersection
fn suppresses(c: vec4<f32>, ca: f32, s: vec4<f32>, sa: f32) -> bool {
    let ixmin = select(c.y, s.y, c.y < s.y);
    let ixmax = select(c.w, s.w, s.w < c.w);
    if (ixmax <= ixmin) { return false; }
    let iymin = select(c.x, s.x, c.x < s.x);
    let iymax = select(c.z, s.z, s.z < c.z);
    if (iymax <= iymin) { return false; }
    let inter = exact_f32((ixmax - ixmin) * (iymax - iymin));
    if (inter <= 0.0) { return false; }
    let sum = ca + sa;
    return iou_above(inter, sum - inter);
}

// candidate j against the selected box p (ps, area pa): flags it if suppressed; returns j if it
// is still a candidate, else NONE
fn visit(base: u32, bbase: u32, j: u32, ps: vec4<f32>, pa: f32) -> u32 {
    let kj = keys[base + j];
    if (kj.y >= FLAG) { return NONE; }
    if (suppresses(sbox[bbase + j], bitcast<f32>(kj.x), ps, pa)) {
        keys[base + j] = vec2<u32>(kj.x, kj.y | FLAG);
        return NONE;
    }
    return j;
}

// one bitonic pass over the n keys in workgroup memory (n <= L a power of two, `off` their
// first index in the whole sequence, which sets the directions): stage k, distance j. Unrolled
// (L / 2 pairs over WG threads): a loop per pass would be most of the sort's loop iterations.
fn local_pass(n: u32, off: u32, k: u32, j: u32, li: u32) {
{$ for u in range(LP) $}
    {
        let t = li + {{ u * WORKGROUP }}u;
        if (t < n / 2u) {
            let i = ((t & ~(j - 1u)) << 1u) | (t & (j - 1u));
            let l = i | j;
            let a = sk[i];
            let b = sk[l];
            if (key_less(b, a) == (((off + i) & k) == 0u)) {
                sk[i] = b;
                sk[l] = a;
            }
        }
    }
{$ endfor $}
    workgroupBarrier();
}

// the chunk [c0, c0 + n) of the keys: loaded into workgroup memory, passes j = jmax .. 1 of every
// stage k from kmin to kmax, stored back
fn chunk_passes(base: u32, c0: u32, n: u32, kmin: u32, kmax: u32, jmax: u32, li: u32) {
{$ for u in range(LC) $}
    if (li + {{ u * WORKGROUP }}u < n) { sk[li + {{ u * WORKGROUP }}u] = keys[base + c0 + li + {{ u * WORKGROUP }}u]; }
{$ endfor $}
    workgroupBarrier();
    for (var k = kmin; k <= kmax; k = k << 1u) {
        for (var j = min(k >> 1u, jmax); j > 0u; j = j >> 1u) {
            local_pass(n, c0, k, j, li);
        }
    }
{$ for u in range(LC) $}
    if (li + {{ u * WORKGROUP }}u < n) { keys[base + c0 + li + {{ u * WORKGROUP }}u] = sk[li + {{ u * WORKGROUP }}u]; }
{$ endfor $}
    workgroupBarrier();
}

// ascending sort of keys[base .. base + p) (p a power of two)
fn sort_keys(base: u32, p: u32, li: u32) {
    let lc = min(p, L);
    for (var c0 = 0u; c0 < p; c0 = c0 + lc) {
        chunk_passes(base, c0, lc, 2u, lc, lc, li);
    }
    storageBarrier();
    for (var k = lc << 1u; k <= p; k = k << 1u) {
        for (var j = k >> 1u; j >= lc; j = j >> 1u) {
            for (var t = li; t < p / 2u; t = t + WG) {
                let i = ((t & ~(j - 1u)) << 1u) | (t & (j - 1u));
                let l = i | j;
                let a = keys[base + i];
                let b = keys[base + l];
                if (key_less(b, a) == ((i & k) == 0u)) {
                    keys[base + i] = b;
                    keys[base + l] = a;
                }
            }
            storageBarrier();
        }
        for (var c0 = 0u; c0 < p; c0 = c0 + lc) {
            chunk_passes(base, c0, lc, k, k, lc >> 1u, li);
        }
        storageBarrier();
    }
}

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= W) { return; }  // uniform per workgroup
    opaque_zero = nwg.z - 1u;  // launches are (x, y, 1)
    let base = g * PMAX;
    let bbase = g * S;
    var nk = 0u;  // candidates
    var p = 0u;   // the current box (uniform)
    var n = 0u;   // boxes selected
{$ if resume $}
    // a later launch of the greedy pass (CPU adapters: see select.py): where the last one stopped
    if (li == 0u) {
        atomicStore(&next_p, 0xffffffffu);
        bcast3 = vec3<u32>(state[2u * g], state[2u * g + 1u], cnt[g]);
    }
    let st = workgroupUniformLoad(&bcast3);
    nk = st.x;
    p = st.y;
    n = st.z;
    if (n >= MS || p >= nk) { return; }
{$ else $}
    if (li == 0u) {
        atomicStore(&n_keys, 0u);
        atomicStore(&next_p, 0xffffffffu);
    }
    workgroupBarrier();

    // 1. candidates
    for (var i = li; i < S; i = i + WG) {
        let sb = bitcast<u32>(scores[bbase + i]);
        if (is_candidate(sb)) {
            keys[base + atomicAdd(&n_keys, 1u)] = vec2<u32>(~order_of(sb), i);
        }
    }
    workgroupBarrier();
    if (li == 0u) { bcast = atomicLoad(&n_keys); }
    nk = workgroupUniformLoad(&bcast);
    if (nk == 0u) {
        if (li == 0u) {
            cnt[g] = 0u;
            state[2u * g] = 0u;
            state[2u * g + 1u] = 0u;
        }
        return;
    }

    // 2. sort (the padding keys sort last)
    var np2 = 1u;
    while (np2 < nk) { np2 = np2 << 1u; }
    for (var t = nk + li; t < np2; t = t + WG) { keys[base + t] = vec2<u32>(0xffffffffu, 0xffffffffu); }
    storageBarrier();
    sort_keys(base, np2, li);

    // 3. the candidates' boxes in sorted order, as onnxruntime's BoxInfo
    let bb = (g / C) * S;  // the batch's first box
    for (var r = li; r < nk; r = r + WG) {
        let box = keys[base + r].y;
        let o = (bb + box) * 4u;
        let v0 = boxes[o];
        let v1 = boxes[o + 1u];
        let v2 = boxes[o + 2u];
        let v3 = boxes[o + 3u];
{$ if center $}
        // [x_center, y_center, width, height]; area width * height
        let hw = v2 * 0.5;
        let hh = v3 * 0.5;
        let area = exact_f32(v2 * v3);
        sbox[bbase + r] = vec4<f32>(v1 - hh, v0 - hw, v1 + hh, v0 + hw);
{$ else $}
        // [y1, x1, y2, x2], either corner first (MaxMin: lhs >= rhs gives min = rhs)
        let ymin = select(v0, v2, v0 >= v2);
        let ymax = select(v2, v0, v0 >= v2);
        let xmin = select(v1, v3, v1 >= v3);
        let xmax = select(v3, v1, v1 >= v3);
        let area = exact_f32((ymax - ymin) * (xmax - xmin));
        sbox[bbase + r] = vec4<f32>(ymin, xmin, ymax, xmax);
{$ endif $}
        keys[base + r] = vec2<u32>(bitcast<u32>(area), box);
    }
    storageBarrier();
{$ endif $}

    // 4. greedy selection: p is selected; the candidates it suppresses are flagged, the next p
    // is the first candidate left
{$ if CAP < MS $}
    let stop = n + {{ CAP }}u;  // selections this launch at most
{$ endif $}
    loop {
        let ps = sbox[bbase + p];
        let pk = keys[base + p];
        if (li == 0u) { sel[g * MS + n] = pk.y; }  // never flagged
        n = n + 1u;
        if (n >= MS) { break; }
        let pa = bitcast<f32>(pk.x);
        // this thread's candidates after p: the first j > p with j = li (mod WG), then every WG,
        // UNROLL of them an iteration (independent loads in flight; fewer loop iterations for
        // lavapipe's budget, see select.py)
        let first = p + 1u;
        var best = NONE;
        for (var j = first + ((li + WG - (first & (WG - 1u))) & (WG - 1u)); j < nk; j = j + UNROLL * WG) {
{$ for u in range(UNROLL) $}
{$ if u == 0 $}
            best = min(best, visit(base, bbase, j, ps, pa));
{$ else $}
            if (j + {{ u }}u * WG < nk) { best = min(best, visit(base, bbase, j + {{ u }}u * WG, ps, pa)); }
{$ endif $}
{$ endfor $}
        }
        if (best != NONE) { atomicMin(&next_p, best); }
        workgroupBarrier();
        if (li == 0u) {
            bcast = atomicLoad(&next_p);
            atomicStore(&next_p, 0xffffffffu);
        }
        p = workgroupUniformLoad(&bcast);
        if (p >= nk) { break; }
{$ if CAP < MS $}
        if (n >= stop) { break; }  // p: where the next launch starts
{$ endif $}
    }
    if (li == 0u) {
        cnt[g] = n;
        state[2u * g] = nk;
        state[2u * g + 1u] = p;
    }
}
{$ endif $}
