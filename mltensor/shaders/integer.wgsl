// Exact integer GEMM for ONNX's integer operators (mltensor/ops/integer.py): int8/uint8 operands
// minus their zero points, multiplied and summed in i32, never through float (an f32 sum of
// K = 3072 products near 127 * 127 is not exact). Two operand forms share the tiled core:
//   "matmul": out[bt] = (A[bt] - za) (M x K) * (B[bt] - zb) (K x N), batches broadcast
//   "conv":   implicit GEMM per (image, group): A = the group's filters (Mg x Cg*KH*KW), B = the
//             im2col matrix of the image (Cg*KH*KW x OH*OW), built as tiles are staged; padding
//             reads as the input zero point (ONNX/onnxruntime pad with it), i.e. contributes 0
// The core sees the operands only through load_a / load_b (zero point subtracted, 0 outside the
// matrix; check_a / check_b: the bounds tests, left out where static sizes are whole tiles) and
// store. Values are i32 (int8) or u32 (uint8) words, i32() of a u32 below 256 being exact, or the
// bytes of a packed constant (a_at / b_at).
// i32 products and sums wrap on overflow (WGSL defines it), as onnxruntime's int32 accumulation.
// Requantized outputs (QLinearMatMul / QLinearConv): f32(acc) * scale, clamped to the output
// range shifted by the zero point, rounded half to even (WGSL round), plus the zero point: the
// order of onnxruntime's MlasRequantizeOutput. The clamp comes before the f32 -> i32 conversion, so
// that conversion is always in range (+-inf clamp to the bounds; NaN is tested for).
{# Sizes known only at dispatch (_int_matmul's dynamic dimensions: M, N, K, batch) are WGSL #}
{# expressions over the immediate `dims`: the code reads sizes through `sz` (sz.M is the      #}
{# constant M when static), so a static build renders constants.                             #}
{{ bindings }}
{$ include "common.wgsl" $}

{$ if M is integer $}
const M = {{ M }}u;
{$ endif $}
{$ if N is integer $}
const N = {{ N }}u;
{$ endif $}
{$ if K is integer $}
const K = {{ K }}u;
{$ endif $}
// TY x TX threads, each computing RM x RN outputs (RM, RN in {4, 8}): rows ty*RM.., columns
// tx*RN.. of a BM x BN tile. A and B tiles of depth BK are staged in workgroup memory as vec4s
// of 4 consecutive m (n), so the inner loop does (RM + RN) / 4 vec4 loads per RM * RN / 4 vec4
// multiply-adds; the accumulators are named variables (no array a compiler might keep in memory).
const BM = {{ TY * RM }}u;
const BN = {{ TX * RN }}u;
const BK = {{ BK }}u;
const THREADS = {{ TX * TY }}u;
const AQ = {{ TY * RM // 4 }}u;  // vec4s in one k row of As
const BQ = {{ TX * RN // 4 }}u;  // vec4s in one k row of Bs

var<workgroup> As: array<vec4<i32>, {{ BK * TY * RM // 4 }}>;   // [k][m / 4] of the A tile
var<workgroup> Bs: array<vec4<i32>, {{ BK * TX * RN // 4 }}>;   // [k][n / 4] of the B tile

// Element i of a / b: a_packed / b_packed ("int8", "uint8"): the bytes of a constant, four to a
// little-endian u32 word (shifts below 32; an int8 byte is sign-extended by an arithmetic shift).
{$ macro element(v, packed) $}
{$ if packed == "int8" $}
    return bitcast<i32>({{ v }}[i / 4u] << (24u - (i % 4u) * 8u)) >> 24u;
{$ elif packed == "uint8" $}
    return i32(({{ v }}[i / 4u] >> ((i % 4u) * 8u)) & 0xFFu);
{$ else $}
    return i32({{ v }}[i]);
{$ endif $}
{$ endmacro $}
fn a_at(i: u32) -> i32 {
{{ element("a", a_packed) }}}

fn b_at(i: u32) -> i32 {
{{ element("b", b_packed) }}}

{$ if mode == "matmul" $}
fn a_base(bt: u32) -> u32 { return {{ a_base }}; }
fn b_base(bt: u32) -> u32 { return {{ b_base }}; }

// zero points and requantization parameters broadcast to the output [batch..., M, N]
fn zp_a(bt: u32, m: u32) -> i32 { return {$ if za $}i32(za[{{ za }}]){$ else $}0{$ endif $}; }
fn zp_b(bt: u32, n: u32) -> i32 { return {$ if zb $}i32(zb[{{ zb }}]){$ else $}0{$ endif $}; }

fn load_a(bt: u32, m: u32, k: u32) -> i32 {
{$ if check_a $}
    if (m >= {{ sz.M }} || k >= {{ sz.K }}) { return 0; }
{$ endif $}
    return a_at(a_base(bt) + m * {{ sz.K }} + k) - zp_a(bt, m);
}

fn load_b(bt: u32, k: u32, n: u32) -> i32 {
{$ if check_b $}
    if (k >= {{ sz.K }} || n >= {{ sz.N }}) { return 0; }
{$ endif $}
    return b_at(b_base(bt) + k * {{ sz.N }} + n) - zp_b(bt, n);
}

fn out_index(bt: u32, m: u32, n: u32) -> u32 { return bt * ({{ sz.M }} * {{ sz.N }}) + m * {{ sz.N }} + n; }
{$ else $}
// bt = image * G + group; m: output channel within the group; n: output pixel oh * OW + ow;
// k: (input channel within the group * KH + kh) * KW + kw
const G = {{ G }}u;
const C = {{ C }}u;          // input channels (all groups)
const CG = {{ C // G }}u;
const OC = {{ OC }}u;        // output channels (all groups)
const H = {{ H }}i;
const W = {{ W }}i;
const OW = {{ OW }}u;
const KHW = {{ KH * KW }}u;
const KW = {{ KW }}u;

fn channel(bt: u32, m: u32) -> u32 { return (bt % G) * {{ sz.M }} + m; }

fn zp_a(bt: u32, m: u32) -> i32 { return {$ if za $}i32(za[{{ za }}]){$ else $}0{$ endif $}; }
fn zp_b(bt: u32, n: u32) -> i32 { return {$ if zb $}i32(zb[0]){$ else $}0{$ endif $}; }

fn load_a(bt: u32, m: u32, k: u32) -> i32 {
{$ if check_a $}
    if (m >= {{ sz.M }} || k >= {{ sz.K }}) { return 0; }
{$ endif $}
    return a_at(channel(bt, m) * {{ sz.K }} + k) - zp_a(bt, m);
}

fn load_b(bt: u32, k: u32, n: u32) -> i32 {
{$ if check_b $}
    if (k >= {{ sz.K }} || n >= {{ sz.N }}) { return 0; }
{$ endif $}
    let c = k / KHW;
    let r = k - c * KHW;
    let kh = r / KW;
    let kw = r - kh * KW;
    let oh = n / OW;
    let ow = n - oh * OW;
    // signed: padding makes these negative at the top / left edges
    let ih = i32(oh * {{ sh }}u + kh * {{ dh }}u) - {{ ph }}i;
    let iw = i32(ow * {{ sw }}u + kw * {{ dw }}u) - {{ pw }}i;
    if (ih < 0 || ih >= H || iw < 0 || iw >= W) { return 0; }  // the zero point minus itself
    let img = bt / G;
    let ci = (bt % G) * CG + c;
    return b_at(((img * C + ci) * u32(H) + u32(ih)) * u32(W) + u32(iw)) - zp_b(bt, n);
}

fn out_index(bt: u32, m: u32, n: u32) -> u32 { return ((bt / G) * OC + channel(bt, m)) * {{ sz.N }} + n; }
{$ endif $}

fn store(bt: u32, m: u32, n: u32, acc: i32) {
    if (m >= {{ sz.M }} || n >= {{ sz.N }}) { return; }
    let oi = out_index(bt, m, n);
{$ if requant $}
    var v = acc;
{$ if bias $}
    v = v + bias[{{ bias }}];
{$ endif $}
    let zy = {$ if zy $}i32(zy[{{ zy }}]){$ else $}0{$ endif $};
    let lo = f32({{ qmin }} - zy);
    let hi = f32({{ qmax }} - zy);
    let f = f32(v) * scale[{{ scale }}];
    // NaN (a zero or NaN output scale) gives the zero point: never an undefined f32 -> i32
    let q = select(i32(round(clamp(f, lo, hi))), 0, is_nan_f32(f)) + zy;
    out[oi] = {{ otype }}(q);
{$ else $}
    out[oi] = acc;
{$ endif $}
}

{$ if SPLIT > 1 and not REDUCE $}
// split-K (K past what one invocation may loop over: runtime/wgsl.py LOOP_BUDGET, llvmpipe's
// silent cap): workgroup z = bt * SPLIT + ks sums the K chunk ks into part[ks][bt][m][n]; the
// reduce kernel adds the SPLIT chunks (i32, wrapping: the same sum in any order) and stores.
fn put_part(bt: u32, ks: u32, m: u32, n: u32, acc: i32) {
    if (m >= {{ sz.M }} || n >= {{ sz.N }}) { return; }
    part[((ks * {{ sz.BATCH }} + bt) * {{ sz.M }} + m) * {{ sz.N }} + n] = acc;
}
{$ endif $}

{$ if REDUCE $}
{{ main_1d(sz.TOTAL) }}
    var acc = 0;
    for (var s = 0u; s < {{ SPLIT }}u; s++) { acc = acc + part[s * {{ sz.TOTAL }} + i]; }
    let n = i % {{ sz.N }};
    let r = i / {{ sz.N }};
    store(r / {{ sz.M }}, r % {{ sz.M }}, n, acc);
}
{$ else $}
@compute @workgroup_size({{ TX }}, {{ TY }}, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
{$ if SPLIT > 1 $}
    let bt = wg.z / {{ SPLIT }}u;
    let ks = wg.z % {{ SPLIT }}u;
    let k_begin = ks * {{ KCHUNK }}u;
    let k_end = min({{ sz.K }}, k_begin + {{ KCHUNK }}u);
{$ else $}
    let bt = wg.z;
    let k_begin = 0u;
    let k_end = {{ sz.K }};
{$ endif $}
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let tx = lid.x;
    let ty = lid.y;
{$ for i in range(RM) $}
{$ for j in range(RN // 4) $}
    var acc{{ i }}_{{ j }} = vec4<i32>(0);
{$ endfor $}
{$ endfor $}
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
        // A: consecutive threads read consecutive k of a row (A is row-major in k), each
        // written into its lane of the tile's vec4
        for (var e = li; e < BM * BK; e = e + THREADS) {
            let r = e / BK;
            let kk = e - r * BK;
            As[kk * AQ + r / 4u][r % 4u] = load_a(bt, m0 + r, k0 + kk);
        }
        // B: consecutive threads read consecutive quads of n of a k row
        for (var e = li; e < BK * BQ; e = e + THREADS) {
            let kk = e / BQ;
            let n = n0 + (e - kk * BQ) * 4u;
            let k = k0 + kk;
            Bs[e] = vec4<i32>(load_b(bt, k, n), load_b(bt, k, n + 1u), load_b(bt, k, n + 2u), load_b(bt, k, n + 3u));
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
{$ for j in range(RN // 4) $}
            let b{{ j }} = Bs[kk * BQ + tx * {{ RN // 4 }}u + {{ j }}u];
{$ endfor $}
{$ for q in range(RM // 4) $}
            let a{{ q }} = As[kk * AQ + ty * {{ RM // 4 }}u + {{ q }}u];
{$ for i in range(4) $}
{$ for j in range(RN // 4) $}
            acc{{ 4 * q + i }}_{{ j }} = acc{{ 4 * q + i }}_{{ j }} + a{{ q }}.{{ "xyzw"[i] }} * b{{ j }};
{$ endfor $}
{$ endfor $}
{$ endfor $}
        }
        workgroupBarrier();
    }
    let m = m0 + ty * {{ RM }}u;
    let n = n0 + tx * {{ RN }}u;
    // (gemm_rows.wgsl: the epilogue a row per iteration, a loop no compiler unrolls)
{$ from "gemm_rows.wgsl" import row_loop $}
{$ call row_loop(RM, RN, "i32", sz.M) $}
{$ for j in range(RN // 4) $}
{$ for c in range(4) $}
{$ if SPLIT > 1 $}
        put_part(bt, ks, m + i, n + {{ 4 * j + c }}u, r{{ j }}.{{ "xyzw"[c] }});
{$ else $}
        store(bt, m + i, n + {{ 4 * j + c }}u, r{{ j }}.{{ "xyzw"[c] }});
{$ endif $}
{$ endfor $}
{$ endfor $}
{$ endcall $}
}
{$ endif $}
