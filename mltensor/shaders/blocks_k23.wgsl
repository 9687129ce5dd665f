// The decode GEMV of Q2_K and Q3_K on CPU adapters (mltensor/ops/blocks.py `_launch_k23`):
// out[m, n] = sum_k a[m, k] * W[n, k] for M <= 4 rows of a (or a serving step's rows), the blocks
// in pack_blocks' layout (blocks_decode.wgsl). Two kernels:
//   "prep": a's rows times powers of two into xq (so that the weights need no shifts), and after
//     them (from vec4 SS) the sums of a over each 16-value sub-block;
//   "gemv": a thread owns R rows; for each block it loads the block's 64 vec4s of xq once, then
//     for each of its rows reads the row's words and adds the block's share to out.
// A quant field at bit o of a word is taken as f32(word & (mask << o)) = q * 2^o (exact: a few
// significant bits, below bit 31) against a's value times 2^-o (powers of two: exact but for
// |a| under 2^-88 or so, which flushes). Each 16-value sub-block's sum of q * a has a named
// accumulator, multiplied by its scale once; the mins (Q2_K) and the -4 offset (Q3_K) apply to
// the staged sums of a.
// Q2_K (per half h of 128 values, position l: 2-bit field j of byte 32h + l; scale byte
// 8h + 2j + l / 16, scale low nibble, min high nibble): a word's 16 values are 4 positions of its
// 4 groups j, field (e, j) at bit 8e + 2j; lanes 0, 1 of its vec4 read the word, lanes 2, 3 the
// word >> 16 (fields below bit 16). Scale byte e' = 2 (j % 2) + l / 16 of word 2h + j / 2 is
// taken as f32(word & (15 << 8e')), its 2^8e' folded into xq too (and into the sums, for the mins).
// Q3_K: the 2-bit field j and the hmask bit 4h + j (byte l) form the 3-bit value q = lo + 4 hb,
// assembled for groups 0, 2 (bits 8e and 8e + 4 of ca) and 1, 3 (cb) with word operations:
// ((m & 0x05050505) * 20) puts bits 8e and 8e + 2 at 8e + 2 and 8e + 6 (the carry of their sum
// at 8e + 4 stops at 8e + 5, masked off); fields below bit 31.
{{ bindings }}
{$ include "common.wgsl" $}
{$ if path == "gemv" $}
{$ include "blocks_decode.wgsl" $}
{$ else $}
const QBV = {{ QBV }}u;
const QKB = {{ QKB }}u;
{$ endif $}

const N = {{ N }}u;
const K4 = {{ K // 4 }}u;  // vec4s of a row of a
const SS = {{ MMAX * K // 4 }}u;  // first vec4 of the sub-block sums in xq
const R = {{ R }}u;        // rows a thread

{$ set X = "xyzw" $}
{$ if path == "prep" $}
// exponents of the prescaling of a's vec4 v of a block (position 4v .. 4v + 3)
fn x_shift(v: u32) -> vec4<i32> {
    let j = (v % 32u) / 8u;
{$ if KIND == "Q2_K" $}
    let ls = (v % 8u) / 4u;
    let o = vec4<u32>(0u, 8u, 0u, 8u) + vec4<u32>(2u * j + 8u * ((2u * j + ls) % 4u));
{$ else $}
    let o = vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(4u * (j / 2u));
{$ endif $}
    return -vec4<i32>(o);
}

// sub-block sums of a: entry s of a block is half h = s / 2, groups j = 2 (s % 2) + (0, 1), lanes
// (j % 2, l / 16)
fn x_sums(base: u32, s: u32) -> vec4<f32> {
    var t0 = vec4<f32>(0.0);
    var t1 = vec4<f32>(0.0);
    var t2 = vec4<f32>(0.0);
    var t3 = vec4<f32>(0.0);
{$ for w in range(4) $}
    t0 = t0 + a[base + {{ w }}u];
    t1 = t1 + a[base + {{ 4 + w }}u];
    t2 = t2 + a[base + {{ 8 + w }}u];
    t3 = t3 + a[base + {{ 12 + w }}u];
{$ endfor $}
    let s4 = vec4<f32>(dot(t0, vec4<f32>(1.0)), dot(t1, vec4<f32>(1.0)), dot(t2, vec4<f32>(1.0)), dot(t3, vec4<f32>(1.0)));
{$ if KIND == "Q2_K" $}
    // against the min nibbles of the scale bytes e' = 0..3, taken as (min << 8e')
    return ldexp(s4, vec4<i32>(0, -8, -16, -24));
{$ else $}
    return 4.0 * s4;
{$ endif $}
}

{$ endif $}
{$ if path == "prep" $}
// thread i: entry s = i % 4 of block (i / 4) % QKB of row i / (4 QKB) of a: its 64 values
// prescaled into xq, their 4 sub-block sums after
{{ main_1d(n) }}
    let row = i / (4u * QKB);
    if (row >= {{ M }}) { return; }
    let s = i % 4u;
    let ab = (i / 4u) * {{ QBV // 4 }}u + 32u * (s / 2u) + 16u * (s % 2u);
{$ for w in range(16) $}
    xq[ab + {{ w }}u] = ldexp(a[ab + {{ w }}u], x_shift(ab + {{ w }}u));
{$ endfor $}
    xq[SS + i] = x_sums(ab, s);
}
{$ else $}
// A unit is a block (256 values): its 64 vec4s of prescaled a are loaded once (a load inside a
// loop is a per-invocation gather on llvmpipe, so loads shared by R rows are what counts), then
// each of the thread's R rows reads its words (Q3_K: an hmask word serves both halves), sums its
// 16 sub-blocks and adds the block's share to its output (read back from `out`: each row is its
// thread's alone).
@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let first = (g * {{ WG }}u + lid) * R;
    if (first >= N) { return; }
    for (var m = 0u; m < {{ M }}; m = m + 1u) {
        for (var blk = 0u; blk < QKB; blk = blk + 1u) {
            let xb = m * K4 + blk * {{ QBV // 4 }}u;
{$ for h in range(2) $}
{$ for j in range(4) $}
{$ for ls in range(2) $}
{$ for w in range(4) $}
            let x{{ h }}{{ j }}{{ ls }}{{ w }} = xq[xb + {{ 32 * h + 8 * j + 4 * ls + w }}u];
{$ endfor $}
{$ endfor $}
{$ endfor $}
            let s{{ h }}0 = xq[SS + (m * QKB + blk) * 4u + {{ 2 * h }}u];
            let s{{ h }}1 = xq[SS + (m * QKB + blk) * 4u + {{ 2 * h + 1 }}u];
{$ endfor $}
            for (var r = 0u; r < R; r = r + 1u) {
                // rows past N repeat the last row and are not stored
                let n = min(first + r, N - 1u);
                let wb = q_base(n, blk);
{$ for h in range(2) $}
{$ for j in range(4) $}
                var t{{ h }}{{ j }}0 = 0.0;
                var t{{ h }}{{ j }}1 = 0.0;
{$ endfor $}
{$ endfor $}
{$ for ls in range(2) $}
{$ for w in range(4) $}
                {
{$ if KIND == "Q3_K" $}
                    let mw = b[wb + {{ 4 * ls + w }}u];
{$ endif $}
{$ for h in range(2) $}
{$ if KIND == "Q2_K" $}
                    let q{{ h }} = b[wb + {{ 4 + 8 * h + 4 * ls + w }}u];
                    let qv{{ h }} = vec4<u32>(q{{ h }}, q{{ h }}, q{{ h }} >> 16u, q{{ h }} >> 16u);
{$ for j in range(4) $}
                    t{{ h }}{{ j }}{{ ls }} = t{{ h }}{{ j }}{{ ls }} + dot(vec4<f32>(qv{{ h }} & vec4<u32>({{ 3 * 4 ** j }}u, {{ 768 * 4 ** j }}u, {{ 3 * 4 ** j }}u, {{ 768 * 4 ** j }}u)), x{{ h }}{{ j }}{{ ls }}{{ w }});
{$ endfor $}
{$ else $}
                    let q{{ h }} = b[wb + {{ 8 + 8 * h + 4 * ls + w }}u];
                    let ca{{ h }} = vec4<u32>((q{{ h }} & 0x33333333u) | ((((mw >> {{ 4 * h }}u) & 0x05050505u) * 20u) & 0x44444444u));
                    let cb{{ h }} = vec4<u32>(((q{{ h }} >> 2u) & 0x33333333u) | ((((mw >> {{ 4 * h + 1 }}u) & 0x05050505u) * 20u) & 0x44444444u));
{$ for j in range(4) $}
                    t{{ h }}{{ j }}{{ ls }} = t{{ h }}{{ j }}{{ ls }} + dot(vec4<f32>({{ "ca" if j % 2 == 0 else "cb" }}{{ h }} & vec4<u32>({{ 7 * 16 ** (j // 2) }}u, {{ 1792 * 16 ** (j // 2) }}u, {{ 458752 * 16 ** (j // 2) }}u, {{ 117440512 * 16 ** (j // 2) }}u)), x{{ h }}{{ j }}{{ ls }}{{ w }});
{$ endfor $}
{$ endif $}
{$ endfor $}
                }
{$ endfor $}
{$ endfor $}
{$ if KIND == "Q2_K" $}
                let lo = vec4<u32>(15u, 0xF00u, 0xF0000u, 0xF000000u);
                var vd = 0.0;
                var vm = 0.0;
{$ for h in range(2) $}
                {
                    let sw0 = vec4<u32>(b[wb + {{ 2 * h }}u]);
                    let sw1 = vec4<u32>(b[wb + {{ 2 * h + 1 }}u]);
                    vd = vd + dot(vec4<f32>(sw0 & lo), vec4<f32>(t{{ h }}00, t{{ h }}01, t{{ h }}10, t{{ h }}11))
                        + dot(vec4<f32>(sw1 & lo), vec4<f32>(t{{ h }}20, t{{ h }}21, t{{ h }}30, t{{ h }}31));
                    vm = vm + dot(vec4<f32>((sw0 >> vec4<u32>(4u)) & lo), s{{ h }}0) + dot(vec4<f32>((sw1 >> vec4<u32>(4u)) & lo), s{{ h }}1);
                }
{$ endfor $}
                let dm = unpack2x16float(b[wb + 20u]);
                let v = dm.x * vd - dm.y * vm;
{$ else $}
                // scale i = 8h + 2j + l / 16 (lane 2 (j % 2) + l / 16): low nibble h of byte i % 8
                // (words 24, 25), high bit pair i / 4 of byte 8 + i % 4 (word 26); minus 32
                let sl0 = vec4<u32>(b[wb + 24u]);
                let sl1 = vec4<u32>(b[wb + 25u]);
                let shw = vec4<u32>(b[wb + 26u]);
                var vd = 0.0;
{$ for h in range(2) $}
                {
                    let sh = vec4<u32>({{ 4 * h }}u, {{ 8 + 4 * h }}u, {{ 16 + 4 * h }}u, {{ 24 + 4 * h }}u);
                    let hw = shw >> sh;
                    let c0 = vec4<f32>(((sl0 >> sh) & vec4<u32>(15u)) | ((hw & vec4<u32>(3u)) << vec4<u32>(4u))) - vec4<f32>(32.0);
                    let c1 = vec4<f32>(((sl1 >> sh) & vec4<u32>(15u)) | ((hw & vec4<u32>(12u)) << vec4<u32>(2u))) - vec4<f32>(32.0);
                    vd = vd + dot(c0, vec4<f32>(t{{ h }}00, t{{ h }}01, t{{ h }}10, t{{ h }}11) - s{{ h }}0)
                        + dot(c1, vec4<f32>(t{{ h }}20, t{{ h }}21, t{{ h }}30, t{{ h }}31) - s{{ h }}1);
                }
{$ endfor $}
                let v = q_d(n, blk) * vd;
{$ endif $}
                if (first + r < N) {
                    let o = m * N + first + r;
                    out[o] = select(out[o], 0.0, blk == 0u) + v;
                }
            }
        }
    }
}
{$ endif $}
