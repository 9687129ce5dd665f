// Block-quantized 2/4/8-bit weights read packed (mltensor/ops/nbits.py): onnxruntime's MatMulNBits
// and GatherBlockQuantized layouts. Quantized row r (an output column n of the GEMM, a table row
// of the gather) is KB blocks of BS values, BITS bits each, packed low bits first: read as
// little-endian u32 words, value e of word w is (w >> (e * BITS)) & MASK, VPW values a word, WPR
// words a row. A word never straddles two blocks (BS is a multiple of VPW), so one scale and one
// zero point decode a whole word: value = (q - zp) * scale, in f32 (onnxruntime's formula).
// Zero points (zp_mode): "none" (2^(BITS-1)), "packed" (bytes of ZPB per row, BITS bits per
// block, low bits first, read as u32 words), "float" (one per block, the scales' type).
// Paths:
//   "gemv":  M <= 4 rows of A: a workgroup owns 4 output columns, its 64 threads split the K
//            words (consecutive threads read consecutive words of a row), the rows in vec4
//            lanes of 4 accumulators; partial sums reduced in workgroup memory.
//   "tiled": TY x TX threads, RM x RN outputs each, A and dequantized B staged per BK-deep step
//            in workgroup memory as vec4 (As[k][m], Bs[k][n]), as shaders/matmul.wgsl's tiles.
//   "gather": one thread per output element; the table's rows are packed back to back (no
//            padding to whole blocks), the scales and zero points per block as above.
// Accumulation is f32 whatever the type of a / scales (f32() widens an f16); stores go through ST.
{{ bindings }}
{$ include "common.wgsl" $}

const BITS = {{ BITS }}u;
const VPW = {{ VPW }}u;    // values per u32 word
const BS = {{ BS }}u;      // block size
const KB = {{ KB }}u;      // blocks per quantized row
const WPR = {{ WPR }}u;    // u32 words per quantized row
const MASK = {{ MASK }}u;

{$ if KIND $}
// a GGUF block type (mltensor/ops/blocks.py): the tiled path stages B through q_deq4
{$ include "blocks_decode.wgsl" $}
{$ else $}
// scale and zero point of block `blk` of quantized row `r`
fn scale_of(r: u32, blk: u32) -> f32 {
    return f32(scales[r * KB + blk]);
}

fn zp_of(r: u32, blk: u32) -> f32 {
{$ if zp_mode == "packed" $}
    let byte = r * {{ ZPB }}u + (blk * BITS) / 8u;
    let sh = (byte % 4u) * 8u + (blk * BITS) % 8u;  // <= 30
    return f32((zp[byte / 4u] >> sh) & MASK);
{$ elif zp_mode == "float" $}
    return f32(zp[r * KB + blk]);
{$ else $}
    return {{ f32_lit(ZP_DEFAULT) }};
{$ endif $}
}
{$ endif $}

{$ if path == "gather" $}
const H = {{ H }}u;
const V = {{ V }}u;

{{ main_1d(n) }}
    let row = i / H;
    let k = i % H;
    // negative indices count from the end; out of range ones are clamped into [0, V)
    var ix = idx[row];
    if (ix < 0) { ix = ix + i32(V); }
    let r = u32(clamp(ix, 0, i32(V) - 1));
    let blk = k / BS;
    // the table's rows are packed back to back (H values each, no padding)
    let pos = r * H + k;
    let q = (b[pos / VPW] >> ((pos % VPW) * BITS)) & MASK;
    out[i] = {{ ST }}((f32(q) - zp_of(r, blk)) * scale_of(r, blk));
}
{$ else $}
{$ if M is not none $}
const M = {{ M }}u;
{$ endif $}
const N = {{ N }}u;
const K = {{ K }}u;
const KW = {{ (K + VPW - 1) // VPW }}u;  // words of a row holding values below K

fn load_a(m: u32, k: u32) -> f32 {
{$ if check_m $}
    if (m >= {{ SM }}) { return 0.0; }
{$ endif $}
{$ if K % VPW != 0 $}
    if (k >= K) { return 0.0; }
{$ endif $}
    return f32(a[m * K + k]);
}

fn store(m: u32, n: u32, acc: f32) {
{$ if has_bias $}
    out[m * N + n] = {{ ST }}(acc + f32(bias[n]));
{$ else $}
    out[m * N + n] = {{ ST }}(acc);
{$ endif $}
}

{# The VPW dequantized values of word w (scale s, zero point z) as d0..d{VPW-1}; values at #}
{# k >= K (the last block's padding) are 0, so that a padding scale never reaches a sum.   #}
{$ macro decode(w, k0, pad) $}
{$ for e in range(VPW) $}
{$ if K % VPW != 0 $}
{{ pad }}let d{{ e }} = select(0.0, (f32(({{ w }} >> {{ e * BITS }}u) & MASK) - z) * s, {{ k0 }} + {{ e }}u < K);
{$ else $}
{{ pad }}let d{{ e }} = (f32(({{ w }} >> {{ e * BITS }}u) & MASK) - z) * s;
{$ endif $}
{$ endfor $}
{$ endmacro $}

{$ if path == "gemv" $}
const COLS = {{ COLS }}u;  // ceil(N / 4) workgroups

var<workgroup> partial: array<mat4x4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= COLS) { return; }  // uniform per workgroup
{$ if gate $}
    if (!({{ gate }})) { return; }  // M known at dispatch: the tiled kernel takes M > 4
{$ endif $}
    let n0 = g * 4u;
    // acc_j holds column n0 + j for rows 0..3 (x..w): named accumulators, the column loop
    // unrolled (a dynamically indexed local matrix would live in scratch memory on GPUs)
{$ for j in range(4) $}
    var acc_{{ j }} = vec4<f32>();
{$ endfor $}
    for (var wi = li; wi < KW; wi = wi + 64u) {
        let k0 = wi * VPW;
        let blk = k0 / BS;
{$ for e in range(VPW) $}
        let a{{ e }} = vec4<f32>({$ for m in range(4) $}{$ if m < MROWS $}load_a({{ m }}u, k0 + {{ e }}u){$ else $}0.0{$ endif $}{{ ", " if m < 3 else "" }}{$ endfor $});
{$ endfor $}
{$ for j in range(4) $}
        {
            let n = n0 + {{ j }}u;
{$ if N % 4 != 0 $}
            if (n < N) {
{$ else $}
            {
{$ endif $}
            let s = scale_of(n, blk);
            let z = zp_of(n, blk);
            let w = b[n * WPR + wi];
{{ decode("w", "k0", "            ") }}
{$ for e in range(VPW) $}
            acc_{{ j }} = fma(a{{ e }}, vec4<f32>(d{{ e }}), acc_{{ j }});
{$ endfor $}
            }
        }
{$ endfor $}
    }
    partial[li] = mat4x4<f32>(acc_0, acc_1, acc_2, acc_3);
    workgroupBarrier();
    for (var h = 32u; h > 0u; h = h >> 1u) {
        if (li < h) { partial[li] = partial[li] + partial[li + h]; }
        workgroupBarrier();
    }
    if (li < 16u) {
        let j = li / 4u;
        let m = li % 4u;
        if (m < {{ SM }} && n0 + j < N) {
            store(m, n0 + j, partial[0][j][m]);
        }
    }
}
{$ elif path == "reduce" $}
// split-K's second pass: one thread per output adds its SPLIT chunk sums in order, then stores
{{ main_1d(SM ~ " * N", "o") }}
    var acc = 0.0;
    for (var ks = 0u; ks < {{ SPLIT }}u; ks++) { acc = acc + part[ks * {{ SM }} * N + o]; }
    store(o / N, o % N, acc);
}
{$ else $}
// Tiled: each of the TY x TX threads computes RM x RN outputs: rows ty*RM.., columns tx*RN.. of
// a BM x BN tile.
const BM = {{ TY * RM }}u;
const BN = {{ TX * RN }}u;
const BK = {{ BK }}u;      // a multiple of VPW: each step stages whole words of B
const BKW = {{ BK // VPW }}u;
const THREADS = {{ TX * TY }}u;
const TILES_N = {{ TILES_N }}u;
const AQ = {{ TY * RM // 4 }}u;  // vec4s in one k row of As
const BQ = {{ TX * RN // 4 }}u;  // vec4s in one k row of Bs

var<workgroup> As: array<vec4<f32>, {{ BK * TY * RM // 4 }}>;
var<workgroup> Bs: array<vec4<f32>, {{ BK * TX * RN // 4 }}>;

@compute @workgroup_size({{ TX }}, {{ TY }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
{$ if SPLIT > 1 $}
    // split-K (runtime/wgsl.py LOOP_BUDGET, llvmpipe's silent loop cap): group (ks, tile) sums
    // the K chunk ks of its tile into part[ks][m][n]; the reduce kernel adds them in order
    let gk = wid.y * nwg.x + wid.x;
    if (gk >= {{ TILES }} * {{ SPLIT }}u) { return; }  // uniform
    let ks = gk / {{ TILES }};
    let gi = gk - ks * {{ TILES }};
    let k_begin = ks * {{ KCHUNK }}u;
    let k_end = min(K, k_begin + {{ KCHUNK }}u);
{$ else $}
    let gi = wid.y * nwg.x + wid.x;
    if (gi >= {{ TILES }}) { return; }  // output tiles (read at dispatch when M is); uniform
    let k_begin = 0u;
    let k_end = K;
{$ endif $}
{$ if gate $}
    if (!({{ gate }})) { return; }  // M known at dispatch: the GEMV kernel takes M <= 4
{$ endif $}
    let m0 = (gi / TILES_N) * BM;
    let n0 = (gi % TILES_N) * BN;
    let tx = lid.x;
    let ty = lid.y;
{$ for i in range(RM) $}
{$ for j in range(RN // 4) $}
    var acc{{ i }}_{{ j }} = vec4<f32>(0.0);
{$ endfor $}
{$ endfor $}
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
        // A: consecutive threads take consecutive k of a row (row-major A: coalesced)
        for (var e = li; e < BK * BM; e = e + THREADS) {
            let kk = e % BK;
            let ml = e / BK;
            let m = m0 + ml;
            var v = 0.0;
            if (m < {{ SM }} && k0 + kk < K) { v = f32(a[m * K + k0 + kk]); }
            As[kk * AQ + ml / 4u][ml % 4u] = v;
        }
        // B: a thread decodes one packed word (VPW consecutive k of a column)
        for (var e = li; e < BKW * BN; e = e + THREADS) {
            let wl = e % BKW;
            let nl = e / BKW;
            let n = n0 + nl;
            let wi = k0 / VPW + wl;
            let kq = k0 + wl * VPW;
            let c = wl * VPW * BQ + nl / 4u;
            let l = nl % 4u;
            if (n < N && wi < KW) {
{$ if KIND $}
                let dv = q_deq4(n, kq);
{$ for e in range(4) $}
                Bs[c + {{ e }}u * BQ][l] = dv.{{ "xyzw"[e] }};
{$ endfor $}
{$ else $}
                let blk = kq / BS;
                let s = scale_of(n, blk);
                let z = zp_of(n, blk);
                let w = b[n * WPR + wi];
{{ decode("w", "kq", "                ") }}
{$ for e in range(VPW) $}
                Bs[c + {{ e }}u * BQ][l] = d{{ e }};
{$ endfor $}
{$ endif $}
            } else {
{$ for e in range(VPW) $}
                Bs[c + {{ e }}u * BQ][l] = 0.0;
{$ endfor $}
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
{$ for j in range(RN // 4) $}
            let bv{{ j }} = Bs[kk * BQ + tx * {{ RN // 4 }}u + {{ j }}u];
{$ endfor $}
{$ for q in range(RM // 4) $}
            let av{{ q }} = As[kk * AQ + ty * {{ RM // 4 }}u + {{ q }}u];
{$ for i in range(4) $}
{$ for j in range(RN // 4) $}
            acc{{ 4 * q + i }}_{{ j }} = fma(vec4<f32>(av{{ q }}.{{ "xyzw"[i] }}), bv{{ j }}, acc{{ 4 * q + i }}_{{ j }});
{$ endfor $}
{$ endfor $}
{$ endfor $}
        }
        workgroupBarrier();
    }
    let m = m0 + ty * {{ RM }}u;
    let n = n0 + tx * {{ RN }}u;
{$ for i in range(RM) $}
    if (m + {{ i }}u < {{ SM }}) {
{$ for j in range(RN // 4) $}
{$ for c in range(4) $}
{$ if SPLIT > 1 $}
        if (n + {{ 4 * j + c }}u < N) { part[(ks * {{ SM }} + m + {{ i }}u) * N + n + {{ 4 * j + c }}u] = acc{{ i }}_{{ j }}.{{ "xyzw"[c] }}; }
{$ else $}
        if (n + {{ 4 * j + c }}u < N) { store(m + {{ i }}u, n + {{ 4 * j + c }}u, acc{{ i }}_{{ j }}.{{ "xyzw"[c] }}); }
{$ endif $}
{$ endfor $}
{$ endfor $}
    }
{$ endfor $}
}
{$ endif $}
{$ endif $}
