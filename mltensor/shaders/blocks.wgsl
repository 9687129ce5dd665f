// GGUF block formats on the GPU (mltensor/ops/blocks.py): the decode step's GEMV and the
// embedding gather. Layouts and decoders: blocks_decode.wgsl.
//   "gemv":   out[m, n] = sum_k a[m, k] * W[n, k] for a static M <= 4 or a serving step's rows
//             (M known at dispatch; CPU adapters: MT rows of a a thread). A row is QKB * PARTS
//             units (a 64-value quarter of a 256-value super-block, or a whole 32-value block);
//             q_unit decodes one unit's scales and mins once, extracts its nibbles / bit planes
//             as vec4s of consecutive values and dots them with vec4 loads of a, applying the
//             mins and offsets to the sums of a. TPR threads share a row (TPR == 1: a thread owns
//             R rows, no barriers, the CPU adapters' shape; else partial sums reduced in
//             workgroup memory). MT > 1 (TPR == 1 only): each unit's words are loaded and
//             decoded once for the MT rows of a, each row's expressions (and the order of its
//             units) those of MT 1, so a row's result does not depend on the rows beside it.
//             Named accumulators only, loops over words unrolled.
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

// the 4 bytes of w as values (fields already masked into their bytes with scalar operations:
// one u32 operation serves 4 values)
fn q_bytes(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
}

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}

{$ set X = "xyzw" $}
{$ if MT > 1 $}
// MT rows of a a pass (a serving step, CPU adapters): row i's offset into a and its unit's dot
// products with output row r, res{r}_{i} (q_unit loads and decodes a unit's weight words once
// and dots them with each row's a)
{$ for i in RS $}
var<private> am{{ i }}: u32;
{$ for r in range(R) $}
var<private> res{{ r }}{{ i }}: f32;
{$ endfor $}
{$ endfor $}
{$ endif $}
{# RES: the result of row of a i (its suffix) and output row r; ROW: output row r #}
{$ macro RES(i, r) $}{{ ("res" ~ i ~ "." ~ X[r]) if MT == 1 else ("res" ~ r ~ i) }}{$ endmacro $}
{$ macro ROW(r) $}{{ ("rows." ~ X[r]) if MT == 1 else ("n" ~ r) }}{$ endmacro $}
// the dot products of unit p of block blk of rows rows.x .. (R of them: component r of the
// result) with a's vec4s from ab0 (the block's first); a's loads and sums are shared by the rows.
// MT > 1 (the CPU branches only): output rows first .. first + R - 1, ab0 the block's offset in a
// row of a, results in res{r}_{i}; each row's expressions are those of MT 1 (its names suffixed
// by the row of a: RS), so a row's result does not depend on the rows beside it
{$ if MT == 1 $}
fn q_unit(rows: vec4<u32>, blk: u32, p: u32, ab0: u32) -> vec4<f32> {
{$ for r in range(R) $}
    let wb{{ r }} = q_base(rows.{{ X[r] }}, blk);
{$ endfor $}
    var res = vec4<f32>(0.0);
{$ else $}
fn q_unit(first: u32, blk: u32, p: u32, ab0: u32) {
{$ for r in range(R) $}
    let n{{ r }} = min(first + {{ r }}u, N - 1u);
    let wb{{ r }} = q_base(n{{ r }}, blk);
{$ endfor $}
{$ for i in RS $}
    let ab0{{ i }} = am{{ i }} + ab0;
{$ endfor $}
{$ endif $}
{$ if PARTS == 16 and KIND == "Q4_K" $}
    // GPUs (llama.cpp's Vulkan split): 16 threads a super-block, thread p reads qs words
    // 8j + i and 8j + 16 + i (j = p / 8, i = p % 8; neighbours read neighbouring words): values
    // 64j + 4i .. +3 (low nibbles, sub-block 2j), 64j + 32 + 4i (high, 2j + 1), and the same
    // 128 values later (sub-blocks 2j + 4, 2j + 5)
    let j = p / 8u;
    let i = p % 8u;
    let ab = ab0 + 16u * j + i;
    let x0 = a[ab];
    let x1 = a[ab + 8u];
    let x2 = a[ab + 32u];
    let x3 = a[ab + 40u];
    let s0 = hsum(x0);
    let s1 = hsum(x1);
    let s2 = hsum(x2);
    let s3 = hsum(x3);
{$ for r in range(R) $}
    {
        let q0 = b[wb{{ r }} + 4u + 8u * j + i];
        let q1 = b[wb{{ r }} + 20u + 8u * j + i];
        let dm = unpack2x16float(b[wb{{ r }}]);
        let sc0 = b[wb{{ r }} + 1u];
        let sc1 = b[wb{{ r }} + 2u];
        let sc2 = b[wb{{ r }} + 3u];
        let m0 = q_k4_sm(sc0, sc1, sc2, 2u * j);
        let m1 = q_k4_sm(sc0, sc1, sc2, 2u * j + 1u);
        let m2 = q_k4_sm(sc0, sc1, sc2, 2u * j + 4u);
        let m3 = q_k4_sm(sc0, sc1, sc2, 2u * j + 5u);
        res.{{ X[r] }} = dm.x * (m0.x * dot(q_lo4(q0), x0) + m1.x * dot(q_hi4(q0), x1) + m2.x * dot(q_lo4(q1), x2)
            + m3.x * dot(q_hi4(q1), x3)) - dm.y * (m0.y * s0 + m1.y * s1 + m2.y * s2 + m3.y * s3);
    }
{$ endfor $}
{$ elif PARTS == 16 and KIND == "Q6_K" $}
    // GPUs: 16 threads a super-block, thread p: half h = p / 8, positions 4i .. 4i + 3 (i = p % 8)
    // of its four quarters t: nibble t / 2 of ql word 16h + 8 (t % 2) + i, bit pair 2t of qh word
    // 32 + 8h + i (neighbours read neighbouring words); scale 8h + 2t + i / 4
    let h = p / 8u;
    let i = p % 8u;
    let ab = ab0 + 32u * h + i;
{$ for t in range(4) $}
    let x{{ t }} = a[ab + {{ 8 * t }}u];
    let s{{ t }} = 32.0 * hsum(x{{ t }});
{$ endfor $}
{$ for r in range(R) $}
    {
        let l0 = b[wb{{ r }} + 16u * h + i];
        let l1 = b[wb{{ r }} + 16u * h + 8u + i];
        let qh = b[wb{{ r }} + 32u + 8u * h + i];
        let sw0 = b[wb{{ r }} + 48u + 2u * h];
        let sw1 = b[wb{{ r }} + 49u + 2u * h];
        let c = i / 4u;
        res.{{ X[r] }} = q_d(rows.{{ X[r] }}, blk) * (
            q_i8(sw0, c) * (dot(q_bytes((l0 & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4u)), x0) - s0)
            + q_i8(sw0, c + 2u) * (dot(q_bytes((l1 & 0x0F0F0F0Fu) | ((qh & 0x0C0C0C0Cu) << 2u)), x1) - s1)
            + q_i8(sw1, c) * (dot(q_bytes(((l0 >> 4u) & 0x0F0F0F0Fu) | (qh & 0x30303030u)), x2) - s2)
            + q_i8(sw1, c + 2u) * (dot(q_bytes(((l1 >> 4u) & 0x0F0F0F0Fu) | ((qh >> 2u) & 0x30303030u)), x3) - s3));
    }
{$ endfor $}
{$ elif KIND == "Q4_K" or KIND == "Q5_K" $}
    // sub-blocks 2p (low nibbles of bytes 32p..32p+31) and 2p + 1 (their high nibbles)
{$ if KIND == "Q4_K" $}
    let qo = 4u + 8u * p;
{$ else $}
    let qo = 12u + 8u * p;
{$ endif $}
{$ for i in RS $}
    let ab{{ i }} = ab0{{ i }} + 16u * p;
    var sa0{{ i }} = vec4<f32>(0.0);
    var sa1{{ i }} = vec4<f32>(0.0);
{$ for r in range(R) $}
    var t{{ r }}0{{ i }} = 0.0;
    var t{{ r }}1{{ i }} = 0.0;
{$ endfor $}
{$ endfor $}
{$ for w in range(8) $}
    {
{$ for i in RS $}
        let x0{{ i }} = a[ab{{ i }} + {{ w }}u];
        let x1{{ i }} = a[ab{{ i }} + {{ 8 + w }}u];
        sa0{{ i }} = sa0{{ i }} + x0{{ i }};
        sa1{{ i }} = sa1{{ i }} + x1{{ i }};
{$ endfor $}
{$ for r in range(R) $}
        let q{{ r }} = b[wb{{ r }} + qo + {{ w }}u];
{$ if KIND == "Q4_K" $}
        let v{{ r }}0 = q_lo4(q{{ r }});
        let v{{ r }}1 = q_hi4(q{{ r }});
{$ else $}
        let h{{ r }} = b[wb{{ r }} + {{ 4 + w }}u];
        let v{{ r }}0 = q_bytes((q{{ r }} & 0x0F0F0F0Fu) | (((h{{ r }} >> (2u * p)) & 0x01010101u) << 4u));
        let v{{ r }}1 = q_bytes(((q{{ r }} >> 4u) & 0x0F0F0F0Fu) | (((h{{ r }} >> (2u * p + 1u)) & 0x01010101u) << 4u));
{$ endif $}
{$ for i in RS $}
        t{{ r }}0{{ i }} = t{{ r }}0{{ i }} + dot(v{{ r }}0, x0{{ i }});
        t{{ r }}1{{ i }} = t{{ r }}1{{ i }} + dot(v{{ r }}1, x1{{ i }});
{$ endfor $}
{$ endfor $}
    }
{$ endfor $}
{$ for i in RS $}
    let s0{{ i }} = hsum(sa0{{ i }});
    let s1{{ i }} = hsum(sa1{{ i }});
{$ endfor $}
{$ for r in range(R) $}
    {
        let dm = unpack2x16float(b[wb{{ r }}]);
        let sc0 = b[wb{{ r }} + 1u];
        let sc1 = b[wb{{ r }} + 2u];
        let sc2 = b[wb{{ r }} + 3u];
        let sm0 = q_k4_sm(sc0, sc1, sc2, 2u * p);
        let sm1 = q_k4_sm(sc0, sc1, sc2, 2u * p + 1u);
{$ for i in RS $}
        {{ RES(i, r) }} = dm.x * (sm0.x * t{{ r }}0{{ i }} + sm1.x * t{{ r }}1{{ i }}) - dm.y * (sm0.y * s0{{ i }} + sm1.y * s1{{ i }});
{$ endfor $}
    }
{$ endfor $}
{$ elif KIND == "Q6_K" $}
    // half h = p / 2, positions l = 16 (p % 2) .. + 15 of its four quarters (scales 8h + p % 2
    // + 0, 2, 4, 6): nibbles of bytes 64h + l (quarters 0, 2) and 64h + 32 + l (1, 3), bit pairs
    // 0, 2, 4, 6 of byte 32h + l
    let h = p / 2u;
    let ls = p % 2u;
    let lo = 16u * h + 4u * ls;
    let ho = 32u + 8u * h + 4u * ls;
{$ for i in RS $}
    let ab{{ i }} = ab0{{ i }} + 32u * h + 4u * ls;
{$ for t in range(4) $}
    var sa{{ t }}{{ i }} = vec4<f32>(0.0);
{$ for r in range(R) $}
    var t{{ r }}{{ t }}{{ i }} = 0.0;
{$ endfor $}
{$ endfor $}
{$ endfor $}
{$ for w in range(4) $}
    {
{$ for i in RS $}
{$ for t in range(4) $}
        let x{{ t }}{{ i }} = a[ab{{ i }} + {{ 8 * t + w }}u];
        sa{{ t }}{{ i }} = sa{{ t }}{{ i }} + x{{ t }}{{ i }};
{$ endfor $}
{$ endfor $}
{$ for r in range(R) $}
        let l0{{ r }} = b[wb{{ r }} + lo + {{ w }}u];
        let l1{{ r }} = b[wb{{ r }} + lo + {{ 8 + w }}u];
        let qh{{ r }} = b[wb{{ r }} + ho + {{ w }}u];
        let v{{ r }}0 = q_bytes((l0{{ r }} & 0x0F0F0F0Fu) | ((qh{{ r }} & 0x03030303u) << 4u));
        let v{{ r }}1 = q_bytes((l1{{ r }} & 0x0F0F0F0Fu) | ((qh{{ r }} & 0x0C0C0C0Cu) << 2u));
        let v{{ r }}2 = q_bytes(((l0{{ r }} >> 4u) & 0x0F0F0F0Fu) | (qh{{ r }} & 0x30303030u));
        let v{{ r }}3 = q_bytes(((l1{{ r }} >> 4u) & 0x0F0F0F0Fu) | ((qh{{ r }} >> 2u) & 0x30303030u));
{$ for i in RS $}
{$ for t in range(4) $}
        t{{ r }}{{ t }}{{ i }} = t{{ r }}{{ t }}{{ i }} + dot(v{{ r }}{{ t }}, x{{ t }}{{ i }});
{$ endfor $}
{$ endfor $}
{$ endfor $}
    }
{$ endfor $}
{$ for i in RS $}
{$ for t in range(4) $}
    let s{{ t }}{{ i }} = 32.0 * hsum(sa{{ t }}{{ i }});
{$ endfor $}
{$ endfor $}
{$ for r in range(R) $}
    {
        let sw0 = b[wb{{ r }} + 48u + 2u * h];
        let sw1 = b[wb{{ r }} + 49u + 2u * h];
        let d = q_d({{ ROW(r) }}, blk);
        let c0 = q_i8(sw0, ls);
        let c1 = q_i8(sw0, ls + 2u);
        let c2 = q_i8(sw1, ls);
        let c3 = q_i8(sw1, ls + 2u);
{$ for i in RS $}
        {{ RES(i, r) }} = d * (c0 * (t{{ r }}0{{ i }} - s0{{ i }}) + c1 * (t{{ r }}1{{ i }} - s1{{ i }})
            + c2 * (t{{ r }}2{{ i }} - s2{{ i }}) + c3 * (t{{ r }}3{{ i }} - s3{{ i }}));
{$ endfor $}
    }
{$ endfor $}
{$ elif KIND == "Q3_K" or KIND == "Q2_K" $}
    // half h = p / 2 of 128 values, positions l = 16 (p % 2) .. + 15 of its four groups j of 32
    // (bit pair 2j of byte 32h + l; Q3_K: bit 4h + j of hmask byte l), so each word is read
    // once; scale of group j: 8h + 2j + p % 2 (one per 16 values)
    let h = p / 2u;
    let ls = p % 2u;
    let ab = ab0 + 32u * h + 4u * ls;
{$ if KIND == "Q3_K" $}
    let qo = 8u + 8u * h + 4u * ls;
{$ else $}
    let qo = 4u + 8u * h + 4u * ls;
{$ endif $}
{$ for t in range(4) $}
    var sa{{ t }} = vec4<f32>(0.0);
{$ for r in range(R) $}
    var t{{ r }}{{ t }} = 0.0;
{$ endfor $}
{$ endfor $}
{$ for w in range(4) $}
    {
{$ for j in range(4) $}
        let x{{ j }} = a[ab + {{ 8 * j + w }}u];
        sa{{ j }} = sa{{ j }} + x{{ j }};
{$ endfor $}
{$ for r in range(R) $}
        let q{{ r }} = b[wb{{ r }} + qo + {{ w }}u];
{$ if KIND == "Q3_K" $}
        let m{{ r }} = b[wb{{ r }} + 4u * ls + {{ w }}u] >> (4u * h);
{$ for j in range(4) $}
        t{{ r }}{{ j }} = t{{ r }}{{ j }} + dot(q_bytes(((q{{ r }} >> {{ 2 * j }}u) & 0x03030303u) | (((m{{ r }} >> {{ j }}u) & 0x01010101u) << 2u)), x{{ j }});
{$ endfor $}
{$ else $}
{$ for j in range(4) $}
        t{{ r }}{{ j }} = t{{ r }}{{ j }} + dot(q_bytes((q{{ r }} >> {{ 2 * j }}u) & 0x03030303u), x{{ j }});
{$ endfor $}
{$ endif $}
{$ endfor $}
    }
{$ endfor $}
{$ for t in range(4) $}
    let s{{ t }} = hsum(sa{{ t }});
{$ endfor $}
{$ for r in range(R) $}
    {
{$ if KIND == "Q3_K" $}
        // 6-bit scales minus 32 (scale i: low nibble i / 8 of byte i % 8, high bit pair i / 4 of
        // byte 8 + i % 4); q = low + 4 hbit - 4
        let sl0 = b[wb{{ r }} + 24u] >> (8u * ls + 4u * h);
        let sl1 = b[wb{{ r }} + 25u] >> (8u * ls + 4u * h);
        let shw = b[wb{{ r }} + 26u] >> (8u * ls + 4u * h);
{$ for j in range(4) $}
        let c{{ j }} = f32(((sl{{ j // 2 }} >> {{ 16 * (j % 2) }}u) & 15u) | (((shw >> {{ 16 * (j % 2) + 2 * (j // 2) }}u) & 3u) << 4u)) - 32.0;
{$ endfor $}
        res.{{ X[r] }} = q_d(rows.{{ X[r] }}, blk) * (c0 * (t{{ r }}0 - 4.0 * s0) + c1 * (t{{ r }}1 - 4.0 * s1)
            + c2 * (t{{ r }}2 - 4.0 * s2) + c3 * (t{{ r }}3 - 4.0 * s3));
{$ else $}
        // scale bytes 8h + 2j + ls: low nibble scale, high nibble min
        let sw0 = b[wb{{ r }} + 2u * h] >> (8u * ls);
        let sw1 = b[wb{{ r }} + 2u * h + 1u] >> (8u * ls);
        let dm = unpack2x16float(b[wb{{ r }} + 20u]);
{$ for j in range(4) $}
        let c{{ j }} = (sw{{ j // 2 }} >> {{ 16 * (j % 2) }}u) & 255u;
{$ endfor $}
        res.{{ X[r] }} = dm.x * (f32(c0 & 15u) * t{{ r }}0 + f32(c1 & 15u) * t{{ r }}1 + f32(c2 & 15u) * t{{ r }}2
            + f32(c3 & 15u) * t{{ r }}3) - dm.y * (f32(c0 >> 4u) * s0 + f32(c1 >> 4u) * s1 + f32(c2 >> 4u) * s2
            + f32(c3 >> 4u) * s3);
{$ endif $}
    }
{$ endfor $}
{$ elif KIND == "IQ4_XS" $}
    // sub-blocks 2p and 2p + 1: 16 bytes each (byte l: values l, 16 + l); 6-bit scales minus 32
    let qo = 2u + 8u * p;
{$ for i in RS $}
    let ab{{ i }} = ab0{{ i }} + 16u * p;
{$ for r in range(R) $}
    var t{{ r }}0{{ i }} = 0.0;
    var t{{ r }}1{{ i }} = 0.0;
{$ endfor $}
{$ endfor $}
{$ for s in range(2) $}
{$ for w in range(4) $}
    {
{$ for i in RS $}
        let x0{{ i }} = a[ab{{ i }} + {{ 8 * s + w }}u];
        let x1{{ i }} = a[ab{{ i }} + {{ 8 * s + 4 + w }}u];
{$ endfor $}
{$ for r in range(R) $}
        let q{{ r }} = b[wb{{ r }} + qo + {{ 4 * s + w }}u];
        let v{{ r }}0 = q_iq4(q_field(q{{ r }}, 0u, 15u));
        let v{{ r }}1 = q_iq4(q_field(q{{ r }}, 4u, 15u));
{$ for i in RS $}
        t{{ r }}{{ s }}{{ i }} = t{{ r }}{{ s }}{{ i }} + dot(v{{ r }}0, x0{{ i }}) + dot(v{{ r }}1, x1{{ i }});
{$ endfor $}
{$ endfor $}
    }
{$ endfor $}
{$ endfor $}
{$ for r in range(R) $}
    {
        let w0 = b[wb{{ r }}];
        let bl = q_byte(b[wb{{ r }} + 1u], p);
        let d = unpack2x16float(w0).x;
        let dl0 = d * (f32((bl & 15u) | (((w0 >> (16u + 4u * p)) & 3u) << 4u)) - 32.0);
        let dl1 = d * (f32((bl >> 4u) | (((w0 >> (18u + 4u * p)) & 3u) << 4u)) - 32.0);
{$ for i in RS $}
        {{ RES(i, r) }} = dl0 * t{{ r }}0{{ i }} + dl1 * t{{ r }}1{{ i }};
{$ endfor $}
    }
{$ endfor $}
{$ elif KIND == "Q5_0" or KIND == "Q5_1" or KIND == "IQ4_NL" $}
    // byte l of the 16 holds values l (low nibble) and 16 + l (high); Q5: bit v of qh above
{$ if KIND == "Q5_0" $}
    let qo = 1u;
{$ elif KIND == "Q5_1" $}
    let qo = 2u;
{$ else $}
    let qo = 0u;
{$ endif $}
{$ for r in range(R) $}
{$ if KIND == "Q5_0" $}
    let qh{{ r }} = b[wb{{ r }}];
{$ elif KIND == "Q5_1" $}
    let qh{{ r }} = b[wb{{ r }} + 1u];
{$ endif $}
{$ endfor $}
{$ for i in RS $}
    var sa{{ i }} = vec4<f32>(0.0);
{$ for r in range(R) $}
    var t{{ r }}{{ i }} = 0.0;
{$ endfor $}
{$ endfor $}
{$ for w in range(4) $}
    {
{$ for i in RS $}
        let x0{{ i }} = a[ab0{{ i }} + {{ w }}u];
        let x1{{ i }} = a[ab0{{ i }} + {{ 4 + w }}u];
        sa{{ i }} = sa{{ i }} + x0{{ i }} + x1{{ i }};
{$ endfor $}
{$ for r in range(R) $}
        let q{{ r }} = b[wb{{ r }} + qo + {{ w }}u];
{$ if KIND == "IQ4_NL" $}
        let v{{ r }}0 = q_iq4(q_field(q{{ r }}, 0u, 15u));
        let v{{ r }}1 = q_iq4(q_field(q{{ r }}, 4u, 15u));
{$ else $}
        // bits 4w .. 4w + 3 of qh spread to bit 0 of 4 bytes (x * 0x204081: copies of x at
        // bits 0, 7, 14, 21, which do not overlap), then to bit 4 above the nibbles
        let hl{{ r }} = ((((qh{{ r }} >> {{ 4 * w }}u) & 15u) * 0x204081u) & 0x01010101u) << 4u;
        let hh{{ r }} = ((((qh{{ r }} >> {{ 16 + 4 * w }}u) & 15u) * 0x204081u) & 0x01010101u) << 4u;
        let v{{ r }}0 = q_bytes((q{{ r }} & 0x0F0F0F0Fu) | hl{{ r }});
        let v{{ r }}1 = q_bytes(((q{{ r }} >> 4u) & 0x0F0F0F0Fu) | hh{{ r }});
{$ endif $}
{$ for i in RS $}
        t{{ r }}{{ i }} = t{{ r }}{{ i }} + dot(v{{ r }}0, x0{{ i }}) + dot(v{{ r }}1, x1{{ i }});
{$ endfor $}
{$ endfor $}
    }
{$ endfor $}
{$ for r in range(R) $}
    {
{$ if KIND == "Q5_1" $}
        let dm = unpack2x16float(b[wb{{ r }}]);
{$ else $}
        let d = q_d({{ ROW(r) }}, blk);
{$ endif $}
{$ for i in RS $}
{$ if KIND == "Q5_0" $}
        {{ RES(i, r) }} = d * (t{{ r }}{{ i }} - 16.0 * hsum(sa{{ i }}));
{$ elif KIND == "Q5_1" $}
        {{ RES(i, r) }} = dm.x * t{{ r }}{{ i }} + dm.y * hsum(sa{{ i }});
{$ else $}
        {{ RES(i, r) }} = d * t{{ r }}{{ i }};
{$ endif $}
{$ endfor $}
    }
{$ endfor $}
{$ elif KIND == "BF16" or KIND == "F16" or KIND == "F32" $}
{$ for w in range(8) $}
    {
{$ for i in RS $}
        let x{{ i }} = a[ab0{{ i }} + {{ w }}u];
{$ endfor $}
{$ for r in range(R) $}
{$ if KIND == "BF16" $}
        let w0{{ r }} = b[wb{{ r }} + {{ 2 * w }}u];
        let w1{{ r }} = b[wb{{ r }} + {{ 2 * w + 1 }}u];
        let v{{ r }} = vec4<f32>(bitcast<f32>(w0{{ r }} << 16u), bitcast<f32>(w0{{ r }} & 0xffff0000u),
            bitcast<f32>(w1{{ r }} << 16u), bitcast<f32>(w1{{ r }} & 0xffff0000u));
{$ elif KIND == "F16" $}
        let v{{ r }} = vec4<f32>(unpack2x16float(b[wb{{ r }} + {{ 2 * w }}u]), unpack2x16float(b[wb{{ r }} + {{ 2 * w + 1 }}u]));
{$ else $}
        let v{{ r }} = vec4<f32>(bitcast<f32>(b[wb{{ r }} + {{ 4 * w }}u]), bitcast<f32>(b[wb{{ r }} + {{ 4 * w + 1 }}u]),
            bitcast<f32>(b[wb{{ r }} + {{ 4 * w + 2 }}u]), bitcast<f32>(b[wb{{ r }} + {{ 4 * w + 3 }}u]));
{$ endif $}
{$ for i in RS $}
        {{ RES(i, r) }} = {{ RES(i, r) }} + dot(v{{ r }}, x{{ i }});
{$ endfor $}
{$ endfor $}
    }
{$ endfor $}
{$ endif $}
{$ if MT == 1 $}
    return res;
{$ endif $}
}

{$ if TPR > 1 $}
var<workgroup> red: array<f32, {{ WG * R }}>;
{$ endif $}

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
{$ if MT > 1 $}
    // MT rows of a a thread (a serving step of several rows, CPU adapters, TPR 1), workgroup g:
    // rows of a MT (g / GN) .., output rows of its part g % GN. q_unit decodes a unit's words
    // once for the MT rows (res{r}_{i}); each row's sum over the units runs in the same order as
    // alone (MT 1). Past M a row repeats the last one, past N an output row: neither is stored.
    let mg = g / {{ GN }}u;
    let m0 = mg * {{ MT }}u;
    let first = ((g - mg * {{ GN }}u) * {{ WG }}u + lid) * {{ R }}u;
    if (m0 >= {{ M }} || first >= N) { return; }
{$ for k in range(MT) $}
    am{{ RS[k] }} = min(m0 + {{ k }}u, {{ M }} - 1u) * K4;
{$ for r in range(R) $}
    var acc{{ r }}{{ RS[k] }} = 0.0;
{$ endfor $}
{$ endfor $}
    for (var u = 0u; u < UNITS; u = u + 1u) {
        let blk = u / PARTS;
{$ for k in range(MT) $}
{$ for r in range(R) $}
        res{{ r }}{{ RS[k] }} = 0.0;
{$ endfor $}
{$ endfor $}
        q_unit(first, blk, u % PARTS, blk * {{ QBV // 4 }}u);
{$ for k in range(MT) $}
{$ for r in range(R) $}
        acc{{ r }}{{ RS[k] }} = acc{{ r }}{{ RS[k] }} + res{{ r }}{{ RS[k] }};
{$ endfor $}
{$ endfor $}
    }
{$ for k in range(MT) $}
    if (m0 + {{ k }}u < {{ M }}) {
{$ for r in range(R) $}
        if (first + {{ r }}u < N) { out[(m0 + {{ k }}u) * N + first + {{ r }}u] = acc{{ r }}{{ RS[k] }}; }
{$ endfor $}
    }
{$ endfor $}
{$ else $}
    let lane = lid % TPR;
    let first = (g * {{ WG // TPR }}u + lid / TPR) * {{ R }}u;
{$ if TPR == 1 $}
    if (first >= N) { return; }
{$ endif $}
    // rows first .. first + R - 1; past N a row repeats the last one and is not stored
    let rows = min(vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(N - 1u));
    for (var m = 0u; m < {{ M }}; m = m + 1u) {
        var acc = vec4<f32>(0.0);
        for (var u = lane; u < UNITS; u = u + TPR) {
            let blk = u / PARTS;
            acc = acc + q_unit(rows, blk, u % PARTS, m * K4 + blk * {{ QBV // 4 }}u);
        }
{$ for r in range(R) $}
        let acc{{ r }} = acc.{{ X[r] }};
{$ endfor $}
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
{$ endif $}
}
{$ endif $}
