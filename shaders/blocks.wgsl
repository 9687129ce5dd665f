// GGUF block formats on the GPU (mltensor/ops/blocks.py): the decode step's GEMV and the
// embedding gather. Layouts and decoders: blocks_decode.wgsl.
//   "gemv":   out[m, n] = sum_k a[m, k] * W[n, k] for a static M <= 4. A row is QKB * PARTS
//             units (a 64-value quarter of a 256-value super-block, or a whole 32-value block);
//             q_unit decodes one unit's scales and mins once, extracts its nibbles / bit planes
//             as vec4s of consecutive values and dots them with vec4 loads of a, applying the
//             mins and offsets to the sums of a. TPR threads share a row (TPR == 1: a thread owns
//             R rows, no barriers, the CPU adapters' shape; else partial sums reduced in
//             workgroup memory). Named accumulators only, loops over words unrolled.
//   "gather": one thread per 4 output values of the gathered rows.
{{ bindings }}
{$ include "common.wgsl" $}
{$ include "blocks_decode.wgsl" $}

{$ if path == "gather" $}
const H = {{ H }}u;
const V = {{ V }}u;

{{ main_1d(n) }}
    let row = (4u * i) / H;
    let k = (4u * i) % H;
    // negative indices count from the end; out of range ones are clamped into [0, V)
    var ix = idx[row];
    if (ix < 0) { ix = ix + i32(V); }
    let r = u32(clamp(ix, 0, i32(V) - 1));
    let v = q_deq4(r, k);
    out[4u * i] = {{ ST }}(v.x);
    out[4u * i + 1u] = {{ ST }}(v.y);
    out[4u * i + 2u] = {{ ST }}(v.z);
    out[4u * i + 3u] = {{ ST }}(v.w);
}
{$ else $}
const N = {{ N }}u;
const K4 = {{ K // 4 }}u;  // vec4s of a row of a
const PARTS = {{ PARTS }}u;
const UNITS = QKB * PARTS;
const TPR = {{ TPR }}u;

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}

// the dot product of unit p of block blk of row r with a's vec4s from ab0 (the block's first)
fn q_unit(r: u32, blk: u32, p: u32, ab0: u32) -> f32 {
    let wb = q_base(r, blk);
{$ if KIND == "Q6_K" $}
    let ab = ab0 + 32u * (p / 2u) + 4u * (p % 2u);
{$ else $}
    let ab = ab0 + 16u * p;  // 64 values a unit (32-value blocks: p == 0)
{$ endif $}
{$ if KIND == "Q4_K" or KIND == "Q5_K" $}
    // sub-blocks 2p (low nibbles of bytes 32p..32p+31) and 2p + 1 (their high nibbles)
    let dm = unpack2x16float(b[wb]);
    let s0 = b[wb + 1u];
    let s1 = b[wb + 2u];
    let s2 = b[wb + 3u];
    let sm0 = q_k4_sm(s0, s1, s2, 2u * p);
    let sm1 = q_k4_sm(s0, s1, s2, 2u * p + 1u);
{$ if KIND == "Q4_K" $}
    let qb = wb + 4u + 8u * p;
{$ else $}
    let qb = wb + 12u + 8u * p;
{$ endif $}
    var t0 = 0.0;
    var t1 = 0.0;
    var sa0 = vec4<f32>(0.0);
    var sa1 = vec4<f32>(0.0);
{$ for w in range(8) $}
    {
        let q = b[qb + {{ w }}u];
        let x0 = a[ab + {{ w }}u];
        let x1 = a[ab + {{ 8 + w }}u];
{$ if KIND == "Q4_K" $}
        t0 = t0 + dot(q_lo4(q), x0);
        t1 = t1 + dot(q_hi4(q), x1);
{$ else $}
        let h = b[wb + {{ 4 + w }}u];
        t0 = t0 + dot(q_lo4(q) + 16.0 * q_bits(h, 2u * p, 1u), x0);
        t1 = t1 + dot(q_hi4(q) + 16.0 * q_bits(h, 2u * p + 1u, 1u), x1);
{$ endif $}
        sa0 = sa0 + x0;
        sa1 = sa1 + x1;
    }
{$ endfor $}
    return dm.x * (sm0.x * t0 + sm1.x * t1) - dm.y * (sm0.y * hsum(sa0) + sm1.y * hsum(sa1));
{$ elif KIND == "Q6_K" $}
    // half h = p / 2, positions l = 16 (p % 2) .. + 15 of its four quarters (scales 8h + p % 2
    // + 0, 2, 4, 6): nibbles of bytes 64h + l (quarters 0, 2) and 64h + 32 + l (1, 3), bit pairs
    // 0, 2, 4, 6 of byte 32h + l
    let h = p / 2u;
    let ls = p % 2u;
    let sw0 = b[wb + 48u + 2u * h];
    let sw1 = b[wb + 49u + 2u * h];
    let lb = wb + 16u * h + 4u * ls;
    let hb = wb + 32u + 8u * h + 4u * ls;
    var t0 = 0.0;
    var t1 = 0.0;
    var t2 = 0.0;
    var t3 = 0.0;
    var sa0 = vec4<f32>(0.0);
    var sa1 = vec4<f32>(0.0);
    var sa2 = vec4<f32>(0.0);
    var sa3 = vec4<f32>(0.0);
{$ for w in range(4) $}
    {
        let l0 = b[lb + {{ w }}u];
        let l1 = b[lb + {{ 8 + w }}u];
        let qh = b[hb + {{ w }}u];
        let x0 = a[ab + {{ w }}u];
        let x1 = a[ab + {{ 8 + w }}u];
        let x2 = a[ab + {{ 16 + w }}u];
        let x3 = a[ab + {{ 24 + w }}u];
        t0 = t0 + dot(q_lo4(l0) + 16.0 * q_bits(qh, 0u, 3u), x0);
        t1 = t1 + dot(q_lo4(l1) + 16.0 * q_bits(qh, 2u, 3u), x1);
        t2 = t2 + dot(q_hi4(l0) + 16.0 * q_bits(qh, 4u, 3u), x2);
        t3 = t3 + dot(q_hi4(l1) + 16.0 * q_bits(qh, 6u, 3u), x3);
        sa0 = sa0 + x0;
        sa1 = sa1 + x1;
        sa2 = sa2 + x2;
        sa3 = sa3 + x3;
    }
{$ endfor $}
    return q_d(r, blk) * (q_i8(sw0, ls) * (t0 - 32.0 * hsum(sa0)) + q_i8(sw0, ls + 2u) * (t1 - 32.0 * hsum(sa1))
        + q_i8(sw1, ls) * (t2 - 32.0 * hsum(sa2)) + q_i8(sw1, ls + 2u) * (t3 - 32.0 * hsum(sa3)));
{$ elif KIND == "Q3_K" or KIND == "Q2_K" $}
    // half h = p / 2, groups j = 2 (p % 2) and j + 1 of 32 values (bit pair 2j of bytes 32h + l),
    // scales 4p .. 4p + 3 (one per 16 values)
    let h = p / 2u;
    let j0 = 2u * (p % 2u);
{$ for t in range(4) $}
    var t{{ t }} = 0.0;
    var sa{{ t }} = vec4<f32>(0.0);
{$ endfor $}
{$ for jj in range(2) $}
{$ for w in range(8) $}
    {
        let x = a[ab + {{ 8 * jj + w }}u];
{$ if KIND == "Q3_K" $}
        let q = q_bits(b[wb + 8u + 8u * h + {{ w }}u], 2u * (j0 + {{ jj }}u), 3u)
            + 4.0 * q_bits(b[wb + {{ w }}u], 4u * h + j0 + {{ jj }}u, 1u);
{$ else $}
        let q = q_bits(b[wb + 4u + 8u * h + {{ w }}u], 2u * (j0 + {{ jj }}u), 3u);
{$ endif $}
        t{{ 2 * jj + w // 4 }} = t{{ 2 * jj + w // 4 }} + dot(q, x);
        sa{{ 2 * jj + w // 4 }} = sa{{ 2 * jj + w // 4 }} + x;
    }
{$ endfor $}
{$ endfor $}
{$ if KIND == "Q3_K" $}
    // 6-bit scales minus 32: low nibbles in byte t of word 24 + p % 2 (nibble h), high bit
    // pairs in byte t of word 26 (pair p); q = low + 4 hbit - 4
    let slw = b[wb + 24u + p % 2u] >> (4u * h);
    let shw = b[wb + 26u] >> (2u * p);
{$ for t in range(4) $}
    let c{{ t }} = f32(((slw >> {{ 8 * t }}u) & 15u) | (((shw >> {{ 8 * t }}u) & 3u) << 4u)) - 32.0;
{$ endfor $}
    return q_d(r, blk) * (c0 * (t0 - 4.0 * hsum(sa0)) + c1 * (t1 - 4.0 * hsum(sa1))
        + c2 * (t2 - 4.0 * hsum(sa2)) + c3 * (t3 - 4.0 * hsum(sa3)));
{$ else $}
    let sw = b[wb + p];
    let dm = unpack2x16float(b[wb + 20u]);
{$ for t in range(4) $}
    let c{{ t }} = (sw >> {{ 8 * t }}u) & 255u;
{$ endfor $}
    return dm.x * (f32(c0 & 15u) * t0 + f32(c1 & 15u) * t1 + f32(c2 & 15u) * t2 + f32(c3 & 15u) * t3)
        - dm.y * (f32(c0 >> 4u) * hsum(sa0) + f32(c1 >> 4u) * hsum(sa1) + f32(c2 >> 4u) * hsum(sa2)
        + f32(c3 >> 4u) * hsum(sa3));
{$ endif $}
{$ elif KIND == "IQ4_XS" $}
    // sub-blocks 2p and 2p + 1: 16 bytes each (byte l: values l, 16 + l); 6-bit scales minus 32
    let w0 = b[wb];
    let bl = q_byte(b[wb + 1u], p);
    let d = unpack2x16float(w0).x;
    let dl0 = d * (f32((bl & 15u) | (((w0 >> (16u + 4u * p)) & 3u) << 4u)) - 32.0);
    let dl1 = d * (f32((bl >> 4u) | (((w0 >> (18u + 4u * p)) & 3u) << 4u)) - 32.0);
    let qb = wb + 2u + 8u * p;
    var t0 = 0.0;
    var t1 = 0.0;
{$ for s in range(2) $}
{$ for w in range(4) $}
    {
        let q = b[qb + {{ 4 * s + w }}u];
        t{{ s }} = t{{ s }} + dot(q_iq4(q_field(q, 0u, 15u)), a[ab + {{ 8 * s + w }}u])
            + dot(q_iq4(q_field(q, 4u, 15u)), a[ab + {{ 8 * s + 4 + w }}u]);
    }
{$ endfor $}
{$ endfor $}
    return dl0 * t0 + dl1 * t1;
{$ elif KIND == "Q5_0" or KIND == "Q5_1" or KIND == "IQ4_NL" $}
    // byte l of the 16 holds values l (low nibble) and 16 + l (high); Q5: bit v of qh above
{$ if KIND == "Q5_0" $}
    let qh = b[wb];
    let qb = wb + 1u;
{$ elif KIND == "Q5_1" $}
    let dm = unpack2x16float(b[wb]);
    let qh = b[wb + 1u];
    let qb = wb + 2u;
{$ else $}
    let qb = wb;
{$ endif $}
    var t = 0.0;
    var sa = vec4<f32>(0.0);
{$ for w in range(4) $}
    {
        let q = b[qb + {{ w }}u];
        let x0 = a[ab + {{ w }}u];
        let x1 = a[ab + {{ 4 + w }}u];
{$ if KIND == "IQ4_NL" $}
        t = t + dot(q_iq4(q_field(q, 0u, 15u)), x0) + dot(q_iq4(q_field(q, 4u, 15u)), x1);
{$ else $}
        t = t + dot(q_lo4(q) + 16.0 * vec4<f32>((vec4<u32>(qh) >> vec4<u32>({{ 4 * w }}u, {{ 4 * w + 1 }}u, {{ 4 * w + 2 }}u, {{ 4 * w + 3 }}u)) & vec4<u32>(1u)), x0)
            + dot(q_hi4(q) + 16.0 * vec4<f32>((vec4<u32>(qh) >> vec4<u32>({{ 16 + 4 * w }}u, {{ 17 + 4 * w }}u, {{ 18 + 4 * w }}u, {{ 19 + 4 * w }}u)) & vec4<u32>(1u)), x1);
        sa = sa + x0 + x1;
{$ endif $}
    }
{$ endfor $}
{$ if KIND == "Q5_0" $}
    return q_d(r, blk) * (t - 16.0 * hsum(sa));
{$ elif KIND == "Q5_1" $}
    return dm.x * t + dm.y * hsum(sa);
{$ else $}
    return q_d(r, blk) * t;
{$ endif $}
{$ elif KIND == "BF16" $}
    var t = 0.0;
{$ for w in range(8) $}
    {
        let w0 = b[wb + {{ 2 * w }}u];
        let w1 = b[wb + {{ 2 * w + 1 }}u];
        t = t + dot(vec4<f32>(bitcast<f32>(w0 << 16u), bitcast<f32>(w0 & 0xffff0000u), bitcast<f32>(w1 << 16u),
                              bitcast<f32>(w1 & 0xffff0000u)), a[ab + {{ w }}u]);
    }
{$ endfor $}
    return t;
{$ endif $}
}

{$ if TPR > 1 $}
var<workgroup> red: array<f32, {{ WG * R }}>;
{$ endif $}

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let lane = lid % TPR;
    let first = (g * {{ WG // TPR }}u + lid / TPR) * {{ R }}u;
{$ if TPR == 1 $}
    if (first >= N) { return; }
{$ endif $}
    // rows first .. first + R - 1; past N a row repeats the last one and is not stored
{$ for r in range(R) $}
    let n{{ r }} = min(first + {{ r }}u, N - 1u);
{$ endfor $}
    for (var m = 0u; m < {{ M }}u; m = m + 1u) {
{$ for r in range(R) $}
        var acc{{ r }} = 0.0;
{$ endfor $}
        for (var u = lane; u < UNITS; u = u + TPR) {
            let blk = u / PARTS;
            let p = u % PARTS;
            let ab = m * K4 + blk * {{ QBV // 4 }}u;
{$ for r in range(R) $}
            acc{{ r }} = acc{{ r }} + q_unit(n{{ r }}, blk, p, ab);
{$ endfor $}
        }
{$ if TPR == 1 $}
{$ for r in range(R) $}
        if (first + {{ r }}u < N) { out[m * N + first + {{ r }}u] = acc{{ r }}; }
{$ endfor $}
{$ else $}
{$ for r in range(R) $}
        red[lid * {{ R }}u + {{ r }}u] = acc{{ r }};
{$ endfor $}
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s = s >> 1u) {
            if (lane < s) {
{$ for r in range(R) $}
                red[lid * {{ R }}u + {{ r }}u] = red[lid * {{ R }}u + {{ r }}u] + red[(lid + s) * {{ R }}u + {{ r }}u];
{$ endfor $}
            }
            workgroupBarrier();
        }
        if (lane == 0u) {
{$ for r in range(R) $}
            if (first + {{ r }}u < N) { out[m * N + first + {{ r }}u] = red[lid * {{ R }}u + {{ r }}u]; }
{$ endfor $}
        }
        workgroupBarrier();
{$ endif $}
    }
}
{$ endif $}
