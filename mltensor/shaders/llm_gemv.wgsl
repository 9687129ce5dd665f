// One token's matrix-vector product over 4/8-bit block weights in `_matmul_nbits`'s layout
// (mltensor/llm/kernels.py): out[n] = sum_k a[k] * (q[n, k] - zp[n, k / 32]) * scale[n, k / 32].
// One thread per R output rows, no workgroup memory and no barriers: on CPU adapters (lavapipe),
// where a workgroup runs its invocations as SIMD lanes of one core, this beats splitting a row's
// words over a workgroup and reducing them; a thread's R rows share each load of a. Per block
// of 32 values the sum is regrouped as scale * (sum q*a - zp * sum a), the weights' nibbles /
// bytes are extracted as vec4s and multiplied with dot(): value e of a word is
// (w >> (e * BITS)) & MASK, so for 4 bits the even values are the low nibbles of the 4 bytes and
// the odd values the high ones.
{{ bindings }}
{$ include "common.wgsl" $}

const N = {{ N }}u;
const KB = {{ KB }}u;    // blocks of 32 values a row
const WPB = {{ BITS }}u; // u32 words a block (32 values * BITS bits / 32)
const WPR = KB * WPB;    // u32 words a row

// WG threads a workgroup: small, so that even a 192-row projection spreads over several
// workgroups (lavapipe runs one workgroup per core at a time)
@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = ((wid.y * nwg.x + wid.x) * {{ WG }}u + lid) * {{ R }}u;
    if (first >= N) { return; }
    // rows first .. first + R - 1; past N (N % R != 0) a row repeats the last one and is not stored
{$ for r in range(R) $}
    let n{{ r }} = min(first + {{ r }}u, N - 1u);
    var acc{{ r }} = 0.0;
{$ endfor $}
    for (var blk = 0u; blk < KB; blk = blk + 1u) {
{$ for r in range(R) $}
        var qa{{ r }} = 0.0;
{$ endfor $}
        var sa = vec4<f32>(0.0);
        for (var wj = 0u; wj < WPB; wj = wj + 1u) {
{$ if BITS == 4 $}
            let a0 = a[(blk * 32u + wj * 8u) / 4u];
            let a1 = a[(blk * 32u + wj * 8u) / 4u + 1u];
            let ae = vec4<f32>(a0.x, a0.z, a1.x, a1.z);
            let ao = vec4<f32>(a0.y, a0.w, a1.y, a1.w);
            sa = sa + a0 + a1;
{$ for r in range(R) $}
            let w{{ r }} = vec4<u32>(b[n{{ r }} * WPR + blk * WPB + wj]);
            qa{{ r }} = qa{{ r }} + dot(vec4<f32>((w{{ r }} >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)), ae)
                + dot(vec4<f32>((w{{ r }} >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u)), ao);
{$ endfor $}
{$ else $}
            let a0 = a[(blk * 32u + wj * 4u) / 4u];
            sa = sa + a0;
{$ for r in range(R) $}
            let w{{ r }} = vec4<u32>(b[n{{ r }} * WPR + blk * WPB + wj]);
            qa{{ r }} = qa{{ r }} + dot(vec4<f32>((w{{ r }} >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u)), a0);
{$ endfor $}
{$ endif $}
        }
        let suma = sa.x + sa.y + sa.z + sa.w;
{$ for r in range(R) $}
{$ if has_zp $}
        let z{{ r }} = zp[n{{ r }} * KB + blk];
{$ else $}
        let z{{ r }} = {{ f32_lit(ZP) }};
{$ endif $}
        acc{{ r }} = acc{{ r }} + f32(scales[n{{ r }} * KB + blk]) * (qa{{ r }} - z{{ r }} * suma);
{$ endfor $}
    }
{$ for r in range(R) $}
    if (first + {{ r }}u < N) { out[first + {{ r }}u] = acc{{ r }}; }
{$ endfor $}
}
