{# Sizes known only at dispatch (dynamic dimensions) are WGSL expressions over the immediate  #}
{# `dims`: the code reads every size through `sz` (sz.M is the constant M when static, declared #}
{# below) and strides through u(), so a static GEMM renders exactly as constants.               #}
// Batched GEMM: out[bt] = epilogue(A[bt] (M x K) * B[bt] (K x N)), sizes baked in.
//
// The kernels below see the operands only through these functions, so that conv2d
// (implicit GEMM, shaders/conv2d.wgsl extends this file) reuses them unchanged:
//   load_a(bt, m, k) -> f32    element (m, k) of A for batch bt, 0 outside the matrix
//   load_b(bt, k, n) -> f32    element (k, n) of B, 0 outside
//   store(bt, m, n, acc)       applies the epilogue (alpha, c / bias, act) and writes out
//   load_a4 / load_b4n / load_b4k: four of them at once (vec4 loads where the layout allows)
// act(v, i) is the fused epilogue (kc.epilogue): i is the flat index of the stored element in out.
// _fused_matmul (compiler/passes.py, ops/matmul.py `_lower_fused`) replaces the loaders' bodies
// with generated code: `a_at` (A read through a view: head merges), `b_fused` (load_b over the
// segments' B operands, columns permuted for pair segments; `b4_fused` the same a quad at a
// time) and `fused_store`, a function store4(bt, m, n, v) storing the 4 outputs n..n+3 (n a
// multiple of 4) of row m through each segment's nodes to the written values, or, where pair
// segments need 8 columns (fused_w 8: column c pairs with c + 4), store8(bt, m, n, lo, hi);
// the tiled path (RN 8 then) and the fused GEMV then store whole quads / octets. `fused_copy`:
// copy_in(group, groups, thread, threads), run by every workgroup first, copies the inputs of
// concats the kernel writes into (a KV cache's past; the new rows are the GEMM's), grid-stride.
// Element types: a, b, c, out are f32 or f16 arrays (vec4 of them for vec loads); loads widen to
// f32 (f32() / vec4<f32>() are no-ops on f32), accumulators and workgroup tiles are f32, and
// store() narrows through ST (f16_of for f16 outputs, else empty) before the epilogue.
// Paths:
//   "tiled": TY x TX threads (64 or 256), each computing an RM x RN block (RM, RN in {4, 8}) of a
//            (TY RM) x (TX RN) output tile (up to 128 x 128); A and B tiles of depth BK are staged
//            in workgroup memory as vec4, so the inner loop does (RM + RN) / 4 vec4 loads per
//            RM * RN / 4 vec4 FMAs (register blocking: each loaded value is used RN or RM times).
//            With SPLIT > 1 (split-K: too few output tiles to fill the GPU), workgroup (s, tile)
//            sums only K chunk s and writes raw partial sums to `part`; the "splitk_reduce" path
//            then adds the SPLIT partials of each output and applies the epilogue through store().
//   "gemv":  small M (<= 4 rows): a workgroup owns 4 output columns of all rows and its 64
//            threads split K; partial sums are reduced in workgroup memory, or first within
//            each subgroup (SG, where the adapter has "subgroup"; a tuning candidate).
{{ bindings }}
{$ include "common.wgsl" $}

{{ act }}

{$ if M is integer $}
const M = {{ M }}u;
{$ endif $}
{$ if N is integer $}
const N = {{ N }}u;
{$ endif $}
{$ if K is integer $}
const K = {{ K }}u;
{$ endif $}
{$ if batch is integer $}
const BATCH = {{ batch }}u;
{$ endif $}

{$ block loaders $}
// Flat offset of batch bt's matrix in a / b (batch dimensions broadcast numpy-style).
fn a_base(bt: u32) -> u32 { return {{ a_base }}; }
fn b_base(bt: u32) -> u32 { return {{ b_base }}; }

{$ if b_quad $}
{{ b_quad }}
{$ endif $}
{# The element loaders; sfx "_in": unchecked copies for tiles inside every edge (edge_a / edge_b) #}
{$ macro loaders(sfx, ca, cb) $}
fn load_a{{ sfx }}(bt: u32, m: u32, k: u32) -> f32 {
{$ if ca $}
    if (m >= {{ sz.M }} || k >= {{ sz.K }}) { return 0.0; }
{$ endif $}
{$ if a_at $}
    return f32(a[{{ a_at }}]);
{$ elif vec_a $}
    let ai = a_base(bt) + m * {{ u(a_sm) }} + k;
    return f32(a[ai / 4u][ai % 4u]);
{$ else $}
    return f32(a[a_base(bt) + m * {{ u(a_sm) }} + k * {{ u(a_sk) }}]);
{$ endif $}
}

fn load_b{{ sfx }}(bt: u32, k: u32, n: u32) -> f32 {
{$ if cb $}
    if (k >= {{ sz.K }} || n >= {{ sz.N }}) { return 0.0; }
{$ endif $}
{$ if b_fused $}
{{ b_fused }}
{$ elif vec_b $}
    let bi = b_base(bt) + k * {{ u(b_sk) }} + n;
    return f32(b[bi / 4u][bi % 4u]);
{$ else $}
    return f32(b[b_base(bt) + k * {{ u(b_sk) }} + n * {{ u(b_sn) }}]);
{$ endif $}
}

// Four elements at once, for staging: A(m, k..k+3), B(k, n..n+3), B(k..k+3, n).
fn load_a4{{ sfx }}(bt: u32, m: u32, k: u32) -> vec4<f32> {
{$ if vec_a $}
{$ if ca $}
    if (m >= {{ sz.M }} || k >= {{ sz.K }}) { return vec4<f32>(0.0); }  // K % 4 == 0: a quad is all in or all out
{$ endif $}
    return vec4<f32>(a[(a_base(bt) + m * {{ u(a_sm) }} + k) / 4u]);
{$ else $}
    return vec4<f32>(load_a{{ sfx }}(bt, m, k), load_a{{ sfx }}(bt, m, k + 1u), load_a{{ sfx }}(bt, m, k + 2u), load_a{{ sfx }}(bt, m, k + 3u));
{$ endif $}
}

fn load_b4n{{ sfx }}(bt: u32, k: u32, n: u32) -> vec4<f32> {
{$ if b4_fused $}
{$ if cb $}
    if (k >= {{ sz.K }} || n >= {{ sz.N }}) { return vec4<f32>(0.0); }  // N % 4 == 0: quads are whole
{$ endif $}
{{ b4_fused }}
{$ elif vec_b $}
{$ if cb $}
    if (k >= {{ sz.K }} || n >= {{ sz.N }}) { return vec4<f32>(0.0); }  // N % 4 == 0
{$ endif $}
    return vec4<f32>(b[(b_base(bt) + k * {{ u(b_sk) }} + n) / 4u]);
{$ else $}
    return vec4<f32>(load_b{{ sfx }}(bt, k, n), load_b{{ sfx }}(bt, k, n + 1u), load_b{{ sfx }}(bt, k, n + 2u), load_b{{ sfx }}(bt, k, n + 3u));
{$ endif $}
}

fn load_b4k{{ sfx }}(bt: u32, k: u32, n: u32) -> vec4<f32> {
    return vec4<f32>(load_b{{ sfx }}(bt, k, n), load_b{{ sfx }}(bt, k + 1u, n), load_b{{ sfx }}(bt, k + 2u, n), load_b{{ sfx }}(bt, k + 3u, n));
}

{$ endmacro $}
{{ loaders("", check_a, check_b) }}{$ if edge_a or edge_b $}
{{ loaders("_in", False, False) }}{$ endif $}
{$ if fused_store $}
{{ fused_store }}
{{ fused_copy }}
{$ if fused_rms $}
// RMS prologue: A is x, the GEMM's B rows are scaled by the norm's weight (load_bq) and each
// row's sum reaches the store scaled by 1 / sqrt(mean(x^2) + eps)
fn rms_scale(ss: f32) -> f32 { return 1.0 / sqrt(ss / f32({{ sz.K }}) + {{ fused_rms }}); }
{$ endif $}
{$ else $}
fn store(bt: u32, m: u32, n: u32, acc: f32) {
{$ if check_out $}
    if (m >= {{ sz.M }} || n >= {{ sz.N }}) { return; }
{$ endif $}
    var v = acc{$ if alpha != 1.0 $} * {{ f32_lit(alpha) }}{$ endif $};
{$ if has_c $}
    v = v + {{ f32_lit(beta) }} * f32(c[{$ if c_base $}{{ c_base }} + {$ endif $}m * {{ u(c_sm) }} + n * {{ u(c_sn) }}]);
{$ endif $}
    let oi = bt * ({{ sz.M }} * {{ sz.N }}) + m * {{ sz.N }} + n;
    out[oi] = act({{ ST }}(v), oi);
}
{$ endif $}
{$ endblock $}

{$ block kernels $}
{$ if path == "tiled" $}
// Each of the TY x TX threads computes RM x RN outputs: rows ty*RM.., columns tx*RN.. of the tile.
const BM = {{ TY * RM }}u;
const BN = {{ TX * RN }}u;
const BK = {{ BK }}u;
const THREADS = {{ TX * TY }}u;
{$ if tiles_n is integer $}
const TILES_N = {{ tiles_n }}u;
{$ endif $}
{$ if tiles_m is integer $}
const TILES_M = {{ tiles_m }}u;
{$ endif $}
{$ if tiles is integer $}
const TILES = {{ tiles }}u;     // output tiles over all batches
{$ endif $}
{$ if kchunk is integer $}
const KCHUNK = {{ kchunk }}u;   // K range of one split (a multiple of BK; K when SPLIT = 1)
{$ endif $}
const AQ = {{ TY * RM // 4 }}u; // vec4s in one k row of As (4 consecutive m each)
const BQ = {{ TX * RN // 4 }}u; // vec4s in one k row of Bs (4 consecutive n each)
const KQ = {{ BK // 4 }}u;      // quads of k in BK
const AS = {{ BK * TY * RM // 4 }}u;  // vec4s of one staged A tile
const BS = {{ BK * TX * RN // 4 }}u;

{$ if not DIRECT $}
// As[k][m] and Bs[k][n], 4 consecutive m (n) per vec4; DB (double buffering): two of each, the
// next tile is staged into one while the other is read (one barrier per step instead of two).
var<workgroup> As: array<vec4<f32>, {{ BK * TY * RM // 4 * (2 if DB else 1) }}>;
var<workgroup> Bs: array<vec4<f32>, {{ BK * TX * RN // 4 * (2 if DB else 1) }}>;
{$ endif $}
{$ if fused_rms $}
var<workgroup> rowss: array<f32, {{ TY * RM }}>;  // each row's sum of squares (RMS prologue)
{$ endif $}
{$ if post_ln $}

// Layer normalization after the epilogue (compiler/passes.py fuse_post_norms): the workgroup
// stored the sums of rows m0 .. m0 + BM - 1, every column, into {{ post_ln }} (row-major); a
// thread per row normalizes one row into {{ ln_dst }} (in place, or where the sum is a value of
// its own the normalization's output) as normalization.wgsl does: the mean, then
// the mean squared deviation from it (two passes in f32: no E[x^2] - mean^2 cancellation), then
// (x - mean) / sqrt(var + eps) * scale + bias, stored through ST. ln_rms (RMSNorm, T5's): one pass
// for the mean of the squares, then x * (1 / sqrt(ms + eps)) * scale, as normalization.wgsl's rms.
fn ln_eps() -> f32 { return {{ ln_eps }}; }

fn post_norm(bt: u32, m0: u32, li: u32) {
    storageBarrier();  // (a control barrier too) every thread's stores of the rows are visible
    for (var r = li; r < BM; r = r + THREADS) {
        let m = m0 + r;
        if (m >= {{ sz.M }}) { break; }
        let b = (bt * {{ sz.M }} + m) * {{ sz.N }};
{$ if ln_rms $}
        var v = 0.0;
        for (var n = 0u; n < {{ sz.N }}; n = n + 1u) { let x = f32({{ post_ln }}[b + n]); v = v + x * x; }
        let r = 1.0 / sqrt(v / f32({{ sz.N }}) + ln_eps());
        for (var n = 0u; n < {{ sz.N }}; n = n + 1u) {
            var y = f32({{ post_ln }}[b + n]) * r;
{$ else $}
        var s = 0.0;
        for (var n = 0u; n < {{ sz.N }}; n = n + 1u) { s = s + f32({{ post_ln }}[b + n]); }
        let mean = s / f32({{ sz.N }});
        var v = 0.0;
        for (var n = 0u; n < {{ sz.N }}; n = n + 1u) { let d = f32({{ post_ln }}[b + n]) - mean; v = v + d * d; }
        let den = sqrt(v / f32({{ sz.N }}) + ln_eps());
        for (var n = 0u; n < {{ sz.N }}; n = n + 1u) {
            var y = (f32({{ post_ln }}[b + n]) - mean) / den;
{$ endif $}
{$ if ln_scale $}
            y = y * f32(ln_s[n]);
{$ endif $}
{$ if ln_bias $}
            y = y + f32(ln_b[n]);
{$ endif $}
            {{ ln_dst }}[b + n] = {{ ST }}(y);
        }
    }
}
{$ endif $}
{$ if not DIRECT $}

// Staging: each thread loads one vec4 per step of its loop. Two mappings per operand, chosen by
// which of the operand's strides is 1, so that consecutive threads read consecutive words:
// "along m" (n): a thread takes 4 consecutive m (n) of one k row; "k-major": a thread takes 4
// consecutive k of one row m (column n), one 16-byte load where aligned, written transposed.
// k-major staging: the 4 k values v of row / column `lane` go to tile rows s, s + Q, s + 2Q,
// s + 3Q (Q = vec4s in a k row), lane `lane % 4` of vec4 `lane / 4` there.
fn put_a4(s: u32, lane: u32, v: vec4<f32>) {
    let c = s + lane / 4u;
    let l = lane % 4u;
    As[c][l] = v.x;
    As[c + AQ][l] = v.y;
    As[c + 2u * AQ][l] = v.z;
    As[c + 3u * AQ][l] = v.w;
}

fn put_b4(s: u32, lane: u32, v: vec4<f32>) {
    let c = s + lane / 4u;
    let l = lane % 4u;
    Bs[c][l] = v.x;
    Bs[c + BQ][l] = v.y;
    Bs[c + 2u * BQ][l] = v.z;
    Bs[c + 3u * BQ][l] = v.w;
}

{$ block stage_a $}
fn setup_a(bt: u32, m0: u32, li: u32) {}

{$ macro stage_a_fn(sfx) $}
fn stage_a{{ sfx }}(bt: u32, m0: u32, k0: u32, o: u32, li: u32) {
{$ if a_kmajor $}
    for (var e = li; e < AS; e = e + THREADS) {
        let ml = e / KQ;
        let kq = (e % KQ) * 4u;
        put_a4(o + kq * AQ, ml, load_a4{{ sfx }}(bt, m0 + ml, k0 + kq));
    }
{$ else $}
    for (var e = li; e < AS; e = e + THREADS) {
        let k = k0 + e / AQ;
        let m = m0 + (e % AQ) * 4u;
        As[o + e] = vec4<f32>(load_a{{ sfx }}(bt, m, k), load_a{{ sfx }}(bt, m + 1u, k),
                              load_a{{ sfx }}(bt, m + 2u, k), load_a{{ sfx }}(bt, m + 3u, k));
    }
{$ endif $}
}
{$ endmacro $}
{{ stage_a_fn("") }}{$ if edge_a $}

{{ stage_a_fn("_in") }}{$ endif $}
{$ endblock $}

{$ macro stage_b_fn(sfx) $}
fn stage_b{{ sfx }}(bt: u32, n0: u32, k0: u32, o: u32, li: u32) {
{$ if b_kmajor $}
    for (var e = li; e < BS; e = e + THREADS) {
        let nl = e / KQ;
        let kq = (e % KQ) * 4u;
        put_b4(o + kq * BQ, nl, load_b4k{{ sfx }}(bt, k0 + kq, n0 + nl));
    }
{$ else $}
    for (var e = li; e < BS; e = e + THREADS) {
        Bs[o + e] = load_b4n{{ sfx }}(bt, k0 + e / BQ, n0 + (e % BQ) * 4u);
    }
{$ endif $}
}

{$ endmacro $}
{{ stage_b_fn("") }}{$ if edge_b $}
{{ stage_b_fn("_in") }}{$ endif $}
{$ endif $}
{# Staging of the step at k into offsets oa, ob. With edge_a (edge_b): a tile inside M (N), ia #}
{# (ib), stages whole steps of K with the unchecked loaders (a uniform branch per workgroup). #}
{$ macro stage(k, oa, ob, pad) $}
{$ if edge_a $}
{{ pad }}if (ia && {{ k }} + BK <= {{ sz.K }}) { stage_a_in(bt, m0, {{ k }}, {{ oa }}, li); } else { stage_a(bt, m0, {{ k }}, {{ oa }}, li); }
{$ else $}
{{ pad }}stage_a(bt, m0, {{ k }}, {{ oa }}, li);
{$ endif $}
{$ if edge_b $}
{{ pad }}if (ib && {{ k }} + BK <= {{ sz.K }}) { stage_b_in(bt, n0, {{ k }}, {{ ob }}, li); } else { stage_b(bt, n0, {{ k }}, {{ ob }}, li); }{$ else $}
{{ pad }}stage_b(bt, n0, {{ k }}, {{ ob }}, li);{$ endif $}{$ endmacro $}
// RM x RN outputs of this thread += the staged tiles at offsets oa, ob (BK steps).
{$ macro compute(oa, ob) $}
{$ set ku = KU | default(1) $}
        // KU > 1 (the post-norm kernel, whose workgroups walk every column tile): KU steps of k
        // per iteration, so that the invocation's loop count stays under llvmpipe's cap
        for (var k4 = 0u; k4 < BK; k4 = k4 + {{ ku }}u) {
{$ for u in range(ku) $}
        {
            let kk = k4 + {{ u }}u;
{$ for j in range(RN // 4) $}
            let bv{{ j }} = Bs[{{ ob }}kk * BQ + tx * {{ RN // 4 }}u + {{ j }}u];
{$ endfor $}
{$ for q in range(RM // 4) $}
            let av{{ q }} = As[{{ oa }}kk * AQ + ty * {{ RM // 4 }}u + {{ q }}u];
{$ for i in range(4) $}
{$ for j in range(RN // 4) $}
            acc{{ 4 * q + i }}_{{ j }} = fma(vec4<f32>(av{{ q }}.{{ "xyzw"[i] }}), bv{{ j }}, acc{{ 4 * q + i }}_{{ j }});
{$ endfor $}
{$ endfor $}
{$ endfor $}
        }
{$ endfor $}
        }
{$ endmacro $}

@compute @workgroup_size({{ TX }}, {{ TY }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
{$ if grid3 $}
    // Sizes known at dispatch: a 3-D grid (tile columns, tile rows, batch * SPLIT) whose counts
    // are exact, so the tile needs no division by a size.
{$ if gate $}
    if (!({{ gate }})) { return; }  // M known at dispatch: the GEMV kernel takes small M
{$ endif $}
{$ if fused_copy $}
    copy_in(wid.x + nwg.x * (wid.y + nwg.y * wid.z), nwg.x * nwg.y * nwg.z, li, THREADS);
{$ endif $}
    let ks = wid.z % {{ SPLIT }}u;  // K chunk
    let bt = wid.z / {{ SPLIT }}u;
    let k_begin = ks * {{ sz.KCHUNK }};
    let k_end = min({{ sz.K }}, k_begin + {{ sz.KCHUNK }});
    let m0 = wid.y * BM;
{$ if not post_ln $}
    let n0 = wid.x * BN;
{$ endif $}
{$ else $}
    // Linear group index (the grid is folded into 2-D past 65535 groups); uniform per workgroup.
    let gi = wid.y * nwg.x + wid.x;
{$ if fused_copy $}
    if ({{ gate if gate else "true" }}) { copy_in(gi, nwg.x * nwg.y, li, THREADS); }
{$ endif $}
    if (gi >= {{ sz.TILES }} * {{ SPLIT }}u) { return; }
{$ if gate $}
    if (!({{ gate }})) { return; }  // M known at dispatch: the GEMV kernel takes small M
{$ endif $}
    let tile = gi % {{ sz.TILES }};
    let k_begin = (gi / {{ sz.TILES }}) * {{ sz.KCHUNK }};
    let k_end = min({{ sz.K }}, k_begin + {{ sz.KCHUNK }});
    let bt = tile / ({{ sz.TILES_M }} * {{ sz.TILES_N }});
    let r = tile % ({{ sz.TILES_M }} * {{ sz.TILES_N }});
    let m0 = (r / {{ sz.TILES_N }}) * BM;
{$ if not post_ln $}
    let n0 = (r % {{ sz.TILES_N }}) * BN;
{$ endif $}
{$ endif $}
{$ if post_ln $}
    // The normalization after the epilogue needs whole rows: this workgroup walks every column
    // tile of its rows (the grid has one tile column), then normalizes them (post_norm)
    for (var n0 = 0u; n0 < {{ sz.N }}; n0 = n0 + BN) {
{$ endif $}
    let tx = lid.x;
    let ty = lid.y;
{$ for i in range(RM) $}
{$ for j in range(RN // 4) $}
    var acc{{ i }}_{{ j }} = vec4<f32>(0.0);
{$ endfor $}
{$ endfor $}
{$ if not DIRECT $}
    setup_a(bt, m0, li);
{$ endif $}
{$ if fused_rms and DIRECT $}
{$ for i in range(RM) $}
    var rss{{ i }} = 0.0;  // RMS prologue: every thread sums the squares of its rows of A
{$ endfor $}
{$ elif fused_rms $}
    var rss = 0.0;  // RMS prologue: thread li < BM sums the squares of row m0 + li of A
{$ endif $}
{$ if edge_a $}
    let ia = m0 + BM <= {{ sz.M }};
{$ endif $}
{$ if edge_b $}
    let ib = n0 + BN <= {{ sz.N }};
{$ endif $}
{$ if DIRECT $}
    // DIRECT (CPU adapters, ops/_gemm.py direct_config): no workgroup tiles and no barriers. Each
    // thread reads its RM rows of A a quad of k at a time and its RN columns of B row by row, and
    // the threads of a workgroup (8: one SIMD group of llvmpipe, which runs invocations as vector
    // lanes) take adjacent column blocks. On llvmpipe the staging, its barriers (coroutine
    // switches) and the workgroup-memory traffic cost more than these loads, which the CPU's
    // caches serve: 2.3x the staged tile's rate at 1024^3 (measured on lavapipe, 2 cores).
    let md = m0 + ty * {{ RM }}u;
    let nd = n0 + tx * {{ RN }}u;
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + 4u) {
{$ for i in range(RM) $}
        let av{{ i }} = load_a4(bt, md + {{ i }}u, k0);
{$ if fused_rms $}
        rss{{ i }} = rss{{ i }} + dot(av{{ i }}, av{{ i }});
{$ endif $}
{$ endfor $}
{$ for u in range(4) $}
{$ for j in range(RN // 4) $}
        let bv{{ u }}_{{ j }} = load_b4n(bt, k0 + {{ u }}u, nd + {{ 4 * j }}u);
{$ endfor $}
{$ for i in range(RM) $}
{$ for j in range(RN // 4) $}
        acc{{ i }}_{{ j }} = fma(vec4<f32>(av{{ i }}.{{ "xyzw"[u] }}), bv{{ u }}_{{ j }}, acc{{ i }}_{{ j }});
{$ endfor $}
{$ endfor $}
{$ endfor $}
    }
{$ elif DB $}
{{ stage("k_begin", "0u", "0u", "    ") }}
    workgroupBarrier();
    var cur = 0u;
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
        // Stage step k0 + BK into the other buffers while this step's are read: a thread writes
        // them only after the barrier that ended the previous step's reads of them.
        if (k0 + BK < k_end) {
{{ stage("k0 + BK", "(cur ^ 1u) * AS", "(cur ^ 1u) * BS", "            ") }}
        }
        let oa = cur * AS;
        let ob = cur * BS;
{$ if fused_rms $}
        if (li < BM) { for (var kk = 0u; kk < BK; kk = kk + 1u) { let x = As[oa + kk * AQ + li / 4u][li % 4u]; rss = fma(x, x, rss); } }
{$ endif $}
{{ compute("oa + ", "ob + ") }}
        workgroupBarrier();
        cur = cur ^ 1u;
    }
{$ else $}
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
{{ stage("k0", "0u", "0u", "        ") }}
        workgroupBarrier();
{$ if fused_rms $}
        if (li < BM) { for (var kk = 0u; kk < BK; kk = kk + 1u) { let x = As[kk * AQ + li / 4u][li % 4u]; rss = fma(x, x, rss); } }
{$ endif $}
{{ compute("", "") }}
        workgroupBarrier();
    }
{$ endif $}
    let m = m0 + ty * {{ RM }}u;
    let n = n0 + tx * {{ RN }}u;
{$ if SPLIT > 1 $}
    let pbase = {{ "ks" if grid3 else "(gi / " ~ sz.TILES ~ ")" }} * ({{ sz.BATCH }} * {{ sz.M }} * {{ sz.N }}) + bt * ({{ sz.M }} * {{ sz.N }});
{$ endif $}
{$ if fused_rms and DIRECT $}
    if (tx == 0u) {
{$ for i in range(RM) $}
        rowss[ty * {{ RM }}u + {{ i }}u] = rss{{ i }};
{$ endfor $}
    }
    workgroupBarrier();
{$ elif fused_rms $}
    if (li < BM) { rowss[li] = rss; }
    workgroupBarrier();
{$ endif $}
{$ from "gemm_rows.wgsl" import row_loop $}
{$ call row_loop(RM, RN, "f32", sz.M) $}
        let mi = m + i;
{$ if fused_rms $}
        let rsc = rms_scale(rowss[ty * {{ RM }}u + i]);
{$ for j in range(RN // 4) $}
        r{{ j }} = r{{ j }} * rsc;
{$ endfor $}
{$ endif $}
{$ if SPLIT > 1 $}
        // Raw partial sums of split gi / TILES; the reduction applies the epilogue.
{$ for j in range(RN // 4) $}
{$ for c in range(4) $}
        if (mi < {{ sz.M }} && n + {{ 4 * j + c }}u < {{ sz.N }}) {
            part[pbase + mi * {{ sz.N }} + n + {{ 4 * j + c }}u] = r{{ j }}.{{ "xyzw"[c] }};
        }
{$ endfor $}
{$ endfor $}
{$ elif fused_store and fused_w == 8 $}
{$ for j in range(0, RN // 4, 2) $}
        store8(bt, mi, n + {{ 4 * j }}u, r{{ j }}, r{{ j + 1 }});
{$ endfor $}
{$ elif fused_store $}
{$ for j in range(RN // 4) $}
        store4(bt, mi, n + {{ 4 * j }}u, r{{ j }});
{$ endfor $}
{$ else $}
{$ for j in range(RN // 4) $}
{$ for c in range(4) $}
        store(bt, mi, n + {{ 4 * j + c }}u, r{{ j }}.{{ "xyzw"[c] }});
{$ endfor $}
{$ endfor $}
{$ endif $}
{$ endcall $}
{$ if post_ln $}
    }
    post_norm(bt, m0, li);
{$ endif $}
}
{$ elif path == "splitk_reduce" $}
// Split-K second pass: one thread per output (bt, m, n) adds the SPLIT partial sums (in a fixed
// order, so results are deterministic) and stores through the epilogue.
{{ main_1d(batch * M * N) }}
{$ if gate $}
    if (!({{ gate }})) { return; }
{$ endif $}
    var s = part[i];
{$ for q in range(1, SPLIT) $}
    s = s + part[i + {{ q }}u * ({{ sz.BATCH }} * {{ sz.M }} * {{ sz.N }})];
{$ endfor $}
    let bt = i / ({{ sz.M }} * {{ sz.N }});
    let r = i % ({{ sz.M }} * {{ sz.N }});
    store(bt, r / {{ sz.N }}, r % {{ sz.N }}, s);
}
{$ elif fused_store $}
// GEMV of a _fused_matmul: one workgroup per (batch, QW quads of columns), B read a quad at a
// time (pair segments keep each quad one run of columns), rows m < M <= 4 in vec4 lanes; one
// thread per row stores the workgroup's columns through store4 / store8.
{$ set QW = fused_w // 4 $}
{$ if cols is integer $}
const COLS = {{ cols }}u;   // ceil(N / (4 QW))
{$ endif $}
{$ if groups is integer $}
const GROUPS = {{ groups }}u;
{$ endif $}

var<workgroup> partial: array<mat4x4<f32>, {{ 64 * QW }}>;
{$ if fused_rms $}
var<workgroup> pss: array<vec4<f32>, 64>;
{$ endif $}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
{$ if SG $}
        @builtin(subgroup_size) sgs: u32, @builtin(subgroup_invocation_id) sid: u32,
{$ endif $}
        @builtin(local_invocation_index) li: u32) {
{$ if grid3 $}
{$ if gate $}
    if (!({{ gate }})) { return; }
{$ endif $}
{$ if fused_copy $}
    copy_in(wid.x + nwg.x * wid.y, nwg.x * nwg.y, li, 64u);
{$ endif $}
    let bt = wid.y;
    let n = wid.x * {{ 4 * QW }}u;
{$ else $}
    let g = wid.y * nwg.x + wid.x;
{$ if fused_copy $}
    if ({{ gate if gate else "true" }}) { copy_in(g, nwg.x * nwg.y, li, 64u); }
{$ endif $}
    if (g >= {{ sz.GROUPS }}) { return; }
{$ if gate $}
    if (!({{ gate }})) { return; }
{$ endif $}
    let bt = g / {{ sz.COLS }};
    let n = (g % {{ sz.COLS }}) * {{ 4 * QW }}u;
{$ endif $}
{$ for q in range(QW) $}
    var acc{{ q }} = mat4x4<f32>();  // acc{{ q }}[j]: column n + {{ 4 * q }} + j, rows 0..3 in x..w
{$ endfor $}
{$ if fused_rms $}
    var ssq = vec4<f32>(0.0);  // rows' sums of squares of A (RMS prologue)
{$ endif $}
    // the loop over k, one per segment (its B operands and columns fixed for the workgroup)
{{ gemv_loop }}
{$ if SG $}
{$ for q in range(QW) $}
    let sum{{ q }} = mat4x4<f32>(subgroupAdd(acc{{ q }}[0]), subgroupAdd(acc{{ q }}[1]), subgroupAdd(acc{{ q }}[2]), subgroupAdd(acc{{ q }}[3]));
    if (sid == 0u) { partial[{{ 64 * q }}u + li / sgs] = sum{{ q }}; }
{$ endfor $}
{$ if fused_rms $}
    let ssum = subgroupAdd(ssq);
    if (sid == 0u) { pss[li / sgs] = ssum; }
{$ endif $}
    workgroupBarrier();
    if (li < {{ sz.M }}) {
{$ if fused_rms $}
        var rs = 0.0;
        for (var s = 0u; s < (63u + sgs) / sgs; s = s + 1u) { rs = rs + pss[s][li]; }
        let rsc = rms_scale(rs);
{$ endif $}
{$ for q in range(QW) $}
        var t{{ q }} = vec4<f32>(0.0);
        for (var s = 0u; s < (63u + sgs) / sgs; s = s + 1u) {
            let p = partial[{{ 64 * q }}u + s];
            t{{ q }} = t{{ q }} + vec4<f32>(p[0][li], p[1][li], p[2][li], p[3][li]);
        }
{$ endfor $}
{$ else $}
{$ for q in range(QW) $}
    partial[{{ 64 * q }}u + li] = acc{{ q }};
{$ endfor $}
{$ if fused_rms $}
    pss[li] = ssq;
{$ endif $}
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
{$ for q in range(QW) $}
            partial[{{ 64 * q }}u + li] = partial[{{ 64 * q }}u + li] + partial[{{ 64 * q }}u + li + s];
{$ endfor $}
{$ if fused_rms $}
            pss[li] = pss[li] + pss[li + s];
{$ endif $}
        }
        workgroupBarrier();
    }
    if (li < {{ sz.M }}) {
{$ if fused_rms $}
        let rsc = rms_scale(pss[0][li]);
{$ endif $}
{$ for q in range(QW) $}
        let p{{ q }} = partial[{{ 64 * q }}u];
        let t{{ q }} = vec4<f32>(p{{ q }}[0][li], p{{ q }}[1][li], p{{ q }}[2][li], p{{ q }}[3][li]);
{$ endfor $}
{$ endif $}
{$ if QW == 2 $}
        store8(bt, li, n, t0{{ " * rsc" if fused_rms else "" }}, t1{{ " * rsc" if fused_rms else "" }});
{$ else $}
        store4(bt, li, n, t0{{ " * rsc" if fused_rms else "" }});
{$ endif $}
    }
}
{$ else $}
// GEMV: one workgroup per (batch, 4 columns); rows m < M <= 4 in vec4 lanes of 4 accumulators.
{$ if cols is integer $}
const COLS = {{ cols }}u;   // ceil(N / 4)
{$ endif $}
{$ if groups is integer $}
const GROUPS = {{ groups }}u;
{$ endif $}

var<workgroup> partial: array<mat4x4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
{$ if SG $}
        @builtin(subgroup_size) sgs: u32, @builtin(subgroup_invocation_id) sid: u32,
{$ endif $}
        @builtin(local_invocation_index) li: u32) {
{$ if grid3 $}
    // sizes known at dispatch: a 2-D grid (column quads, batch), no division by a size
{$ if gate $}
    if (!({{ gate }})) { return; }  // M known at dispatch: the tiled kernel takes large M
{$ endif $}
    let bt = wid.y;
    let n = wid.x * 4u;
{$ else $}
    let g = wid.y * nwg.x + wid.x;
    if (g >= {{ sz.GROUPS }}) { return; }
{$ if gate $}
    if (!({{ gate }})) { return; }  // M known at dispatch: the tiled kernel takes large M
{$ endif $}
    let bt = g / {{ sz.COLS }};
    let n = (g % {{ sz.COLS }}) * 4u;
{$ endif $}
    // acc[j] holds column n + j for rows 0..3 (x..w).
    var acc = mat4x4<f32>();
    for (var k = li; k < {{ sz.K }}; k = k + 64u) {
        let av = vec4<f32>(load_a(bt, 0u, k), load_a(bt, 1u, k), load_a(bt, 2u, k), load_a(bt, 3u, k));
        acc[0] = fma(av, vec4<f32>(load_b(bt, k, n)), acc[0]);
        acc[1] = fma(av, vec4<f32>(load_b(bt, k, n + 1u)), acc[1]);
        acc[2] = fma(av, vec4<f32>(load_b(bt, k, n + 2u)), acc[2]);
        acc[3] = fma(av, vec4<f32>(load_b(bt, k, n + 3u)), acc[3]);
    }
{$ if SG $}
    // Subgroup variant (the adapter has "subgroup"): each subgroup sums its lanes' 16 values in
    // registers, then the 64 / subgroup-size subgroup sums meet in workgroup memory. Subgroup
    // invocations are numbered in local_invocation_index order, as on every backend of naga.
    let sum = mat4x4<f32>(subgroupAdd(acc[0]), subgroupAdd(acc[1]), subgroupAdd(acc[2]), subgroupAdd(acc[3]));
    if (sid == 0u) { partial[li / sgs] = sum; }
    workgroupBarrier();
    if (li < 16u) {
        let j = li / 4u;
        let row = li % 4u;
        var t = 0.0;
        for (var q = 0u; q < (63u + sgs) / sgs; q = q + 1u) { t = t + partial[q][j][row]; }
        if (row < {{ sz.M }}) {
            store(bt, row, n + j, t);
        }
    }
{$ else $}
    partial[li] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) { partial[li] = partial[li] + partial[li + s]; }
        workgroupBarrier();
    }
    if (li < 16u) {
        let j = li / 4u;
        let row = li % 4u;
        if (row < {{ sz.M }}) {
            store(bt, row, n + j, partial[0][j][row]);
        }
    }
{$ endif $}
}
{$ endif $}
{$ endblock $}
