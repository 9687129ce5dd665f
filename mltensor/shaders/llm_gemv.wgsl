// Matrix-vector products over 4/8-bit block weights in `_matmul_nbits`'s layout
// (mltensor/llm/kernels.py): out[m, n] = sum_k a[m, k] * (q[n, k] - zp[n, k / 32]) * scale[n, k / 32]
// for the M rows of a (one token's decode step: M = 1; a serving step: M rows, MT a thread, the
// weights' words decoded once for the MT rows). Each output's sum runs in the same order
// whatever M and MT are: a row's result does not depend on the other rows of its step.
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
const A4 = KB * 8u;      // vec4s of a row of a

// WG threads a workgroup: small, so that even a 192-row projection spreads over several
// workgroups (lavapipe runs one workgroup per core at a time)
@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let M = {{ M }};
{$ if gate $}
    if (!({{ gate }})) { return; }  // the other tile serves this M
{$ endif $}
    let mg = g / {{ GN }}u;  // the tile of MT rows of a
    if (mg * {{ MT }}u >= M) { return; }
    let first = ((g - mg * {{ GN }}u) * {{ WG }}u + lid) * {{ R }}u;
    if (first >= N) { return; }
    // rows of a mg * MT .. + MT - 1; past M (M % MT != 0) a row repeats the last one, not stored
{$ for i in range(MT) $}
    let m{{ i }} = min(mg * {{ MT }}u + {{ i }}u, M - 1u);
{$ endfor $}
    // rows first .. first + R - 1; past N (N % R != 0) a row repeats the last one and is not stored
{$ for r in range(R) $}
    let n{{ r }} = min(first + {{ r }}u, N - 1u);
{$ for i in range(MT) $}
    var acc{{ r }}_{{ i }} = 0.0;
{$ endfor $}
{$ endfor $}
    for (var blk = 0u; blk < KB; blk = blk + 1u) {
{$ for r in range(R) $}
{$ for i in range(MT) $}
        var qa{{ r }}_{{ i }} = 0.0;
{$ endfor $}
{$ endfor $}
{$ for i in range(MT) $}
        var sa{{ i }} = vec4<f32>(0.0);
{$ endfor $}
        for (var wj = 0u; wj < WPB; wj = wj + 1u) {
{$ if BITS == 4 $}
{$ for i in range(MT) $}
            let a0_{{ i }} = a[m{{ i }} * A4 + (blk * 32u + wj * 8u) / 4u];
            let a1_{{ i }} = a[m{{ i }} * A4 + (blk * 32u + wj * 8u) / 4u + 1u];
            let ae{{ i }} = vec4<f32>(a0_{{ i }}.x, a0_{{ i }}.z, a1_{{ i }}.x, a1_{{ i }}.z);
            let ao{{ i }} = vec4<f32>(a0_{{ i }}.y, a0_{{ i }}.w, a1_{{ i }}.y, a1_{{ i }}.w);
            sa{{ i }} = sa{{ i }} + a0_{{ i }} + a1_{{ i }};
{$ endfor $}
{$ for r in range(R) $}
            let w{{ r }} = vec4<u32>(b[n{{ r }} * WPR + blk * WPB + wj]);
            let we{{ r }} = vec4<f32>((w{{ r }} >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
            let wo{{ r }} = vec4<f32>((w{{ r }} >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
{$ for i in range(MT) $}
            qa{{ r }}_{{ i }} = qa{{ r }}_{{ i }} + dot(we{{ r }}, ae{{ i }}) + dot(wo{{ r }}, ao{{ i }});
{$ endfor $}
{$ endfor $}
{$ else $}
{$ for i in range(MT) $}
            let a0_{{ i }} = a[m{{ i }} * A4 + (blk * 32u + wj * 4u) / 4u];
            sa{{ i }} = sa{{ i }} + a0_{{ i }};
{$ endfor $}
{$ for r in range(R) $}
            let w{{ r }} = vec4<u32>(b[n{{ r }} * WPR + blk * WPB + wj]);
            let wb{{ r }} = vec4<f32>((w{{ r }} >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
{$ for i in range(MT) $}
            qa{{ r }}_{{ i }} = qa{{ r }}_{{ i }} + dot(wb{{ r }}, a0_{{ i }});
{$ endfor $}
{$ endfor $}
{$ endif $}
        }
{$ for i in range(MT) $}
        let suma{{ i }} = sa{{ i }}.x + sa{{ i }}.y + sa{{ i }}.z + sa{{ i }}.w;
{$ endfor $}
{$ for r in range(R) $}
{$ if has_zp $}
        let z{{ r }} = zp[n{{ r }} * KB + blk];
{$ else $}
        let z{{ r }} = {{ f32_lit(ZP) }};
{$ endif $}
        let s{{ r }} = f32(scales[n{{ r }} * KB + blk]);
{$ for i in range(MT) $}
        acc{{ r }}_{{ i }} = acc{{ r }}_{{ i }} + s{{ r }} * (qa{{ r }}_{{ i }} - z{{ r }} * suma{{ i }});
{$ endfor $}
{$ endfor $}
    }
{$ for i in range(MT) $}
    if (mg * {{ MT }}u + {{ i }}u < M) {
{$ for r in range(R) $}
        if (first + {{ r }}u < N) { out[m{{ i }} * N + first + {{ r }}u] = acc{{ r }}_{{ i }}; }
{$ endfor $}
    }
{$ endfor $}
}
