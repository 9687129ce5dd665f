// GGUF block formats read from the u32 words of `b` (mltensor/ops/blocks.py pack_blocks; layouts
// from ggml-quants.c / the gguf package's dequantizers). Row r is QKB blocks of QBV values, QWPB
// words each; a block whose f16 `d` was moved out (Q5_0, IQ4_NL, Q3_K, Q6_K) finds it in the f16
// pairs from word QDOFF. Every field is extracted from aligned words (no 2-byte reads); every
// shift amount stays below 32. In every layout the 4 bytes of a word hold 4 consecutive values
// (a nibble, a bit pair or a bit plane of each), so the decoders return vec4s of values
// k .. k + 3 (k a multiple of 4).
const QBV = {{ QBV }}u;     // values a block
const QWPB = {{ QWPB }}u;   // u32 words a block
const QKB = {{ QKB }}u;     // blocks a row
const QDOFF = {{ QDOFF }}u; // first word of the moved-out f16 scales

fn q_base(r: u32, blk: u32) -> u32 {
    return (r * QKB + blk) * QWPB;
}

// the moved-out f16 scale of block blk of row r
fn q_d(r: u32, blk: u32) -> f32 {
    let i = r * QKB + blk;
    let v = unpack2x16float(b[QDOFF + i / 2u]);
    return select(v.x, v.y, (i & 1u) == 1u);
}

// byte i (0..3) of w
fn q_byte(w: u32, i: u32) -> u32 {
    return (w >> (8u * i)) & 255u;
}

// the signed byte i (0..3) of w
fn q_i8(w: u32, i: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(w), 8u * i, 8u));
}

// the field (w's byte e >> s) & mask of each byte e, s <= 7
fn q_field(w: u32, s: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(s))) & vec4<u32>(mask);
}

fn q_bits(w: u32, s: u32, mask: u32) -> vec4<f32> {
    return vec4<f32>(q_field(w, s, mask));
}

// the low / high nibbles of w's 4 bytes
fn q_lo4(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
}

fn q_hi4(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
}

{$ if KIND in ("Q4_K", "Q5_K") $}
// scale and min (6 bits each) of sub-block `is` (0..7) from the 12 bytes in words s0, s1, s2
// (ggml's get_scale_min_k4)
fn q_k4_sm(s0: u32, s1: u32, s2: u32, is: u32) -> vec2<f32> {
    let i = is & 3u;
    let b0 = q_byte(s0, i);
    let b1 = q_byte(s1, i);
    let b2 = q_byte(s2, i);
    let hi = is >= 4u;
    let sc = select(b0 & 63u, (b2 & 15u) | ((b0 >> 6u) << 4u), hi);
    let m = select(b1 & 63u, (b2 >> 4u) | ((b1 >> 6u) << 4u), hi);
    return vec2<f32>(f32(sc), f32(m));
}
{$ endif $}

{$ if KIND in ("IQ4_NL", "IQ4_XS") $}
// IQ4's non-linear table: entry n is the signed byte n % 4 of word n / 4
fn q_iq4(n: vec4<u32>) -> vec4<f32> {
    let odd = (n & vec4<u32>(4u)) != vec4<u32>(0u);
    let high = (n & vec4<u32>(8u)) != vec4<u32>(0u);
    let w = select(select(vec4<u32>({{ IQ4[0] }}u), vec4<u32>({{ IQ4[1] }}u), odd),
                   select(vec4<u32>({{ IQ4[2] }}u), vec4<u32>({{ IQ4[3] }}u), odd), high);
    let sh = vec4<u32>(24u) - (n & vec4<u32>(3u)) * 8u;
    return vec4<f32>(bitcast<vec4<i32>>(w << sh) >> vec4<u32>(24u));
}
{$ endif $}

// values k .. k + 3 of row r (k a multiple of 4)
fn q_deq4(r: u32, k: u32) -> vec4<f32> {
    let blk = k / QBV;
    let v = k % QBV;
    let wb = q_base(r, blk);
{$ if KIND == "Q4_K" or KIND == "Q5_K" $}
    // d, dmin; 12 bytes of scales; (Q5_K: 32 bytes of high bits, bit 2j / 2j+1 of byte l for
    // values 64j + l / 64j + 32 + l); 128 bytes of nibbles: byte 32j + l holds values 64j + l
    // (low) and 64j + 32 + l (high)
    let dm = unpack2x16float(b[wb]);
    let j = v / 64u;
    let hi = (v / 32u) & 1u;
    let l = v % 32u;
    let sm = q_k4_sm(b[wb + 1u], b[wb + 2u], b[wb + 3u], 2u * j + hi);
{$ if KIND == "Q4_K" $}
    let q = q_bits(b[wb + 4u + 8u * j + l / 4u], 4u * hi, 15u);
{$ else $}
    let q = q_bits(b[wb + 12u + 8u * j + l / 4u], 4u * hi, 15u) + 16.0 * q_bits(b[wb + 4u + l / 4u], 2u * j + hi, 1u);
{$ endif $}
    return (dm.x * sm.x) * q - vec4<f32>(dm.y * sm.y);
{$ elif KIND == "Q6_K" $}
    // 128 bytes of low nibbles, 64 of bit pairs, 16 int8 scales (one per 16 values); half h of
    // 128 values: quarter t, position l: nibble t / 2 of byte 64h + 32 (t % 2) + l, bits 2t of
    // byte 32h + l
    let h = v / 128u;
    let t = (v / 32u) & 3u;
    let l = v % 32u;
    let ql = b[wb + 16u * h + 8u * (t & 1u) + l / 4u];
    let qh = b[wb + 32u + 8u * h + l / 4u];
    let q = q_bits(ql, 4u * (t >> 1u), 15u) + 16.0 * q_bits(qh, 2u * t, 3u) - vec4<f32>(32.0);
    let is = v / 16u;
    return (q_d(r, blk) * q_i8(b[wb + 48u + is / 4u], is % 4u)) * q;
{$ elif KIND == "Q3_K" or KIND == "Q2_K" $}
    // half h of 128 values: group j of 32, position l: bits 2j of byte 32h + l of qs;
    // 16 scales, one per 16 values
    let h = v / 128u;
    let j = (v / 32u) & 3u;
    let l = v % 32u;
    let is = v / 16u;
{$ if KIND == "Q3_K" $}
    // 32 bytes of high bits (bit 4h + j of byte l: 0 subtracts 4), 64 of low bit pairs, 12
    // bytes of 6-bit scales (low nibbles in bytes 0..7, high bit pairs in bytes 8..11), minus 32
    let lo = q_bits(b[wb + 8u + 8u * h + l / 4u], 2u * j, 3u);
    let hb = q_bits(b[wb + l / 4u], 4u * h + j, 1u);
    let sl = (b[wb + 24u + (is % 8u) / 4u] >> (8u * (is % 4u) + 4u * (is / 8u))) & 15u;
    let sh = (b[wb + 26u] >> (8u * (is % 4u) + 2u * (is / 4u))) & 3u;
    let sc = f32(sl | (sh << 4u)) - 32.0;
    return (q_d(r, blk) * sc) * (lo + 4.0 * hb - vec4<f32>(4.0));
{$ else $}
    // 16 bytes of scales (low nibble scale, high nibble min), 64 of bit pairs, d, dmin
    let q = q_bits(b[wb + 4u + 8u * h + l / 4u], 2u * j, 3u);
    let sc = q_byte(b[wb + is / 4u], is % 4u);
    let dm = unpack2x16float(b[wb + 20u]);
    return (dm.x * f32(sc & 15u)) * q - vec4<f32>(dm.y * f32(sc >> 4u));
{$ endif $}
{$ elif KIND == "Q5_0" or KIND == "Q5_1" or KIND == "IQ4_NL" $}
    // 16 bytes of nibbles: byte l holds values l (low) and 16 + l (high); Q5: bit v of qh
    let hi = v / 16u;
    let l = v % 16u;
{$ if KIND == "Q5_0" $}
    let qh = b[wb];
    let q = q_bits(b[wb + 1u + l / 4u], 4u * hi, 15u)
        + 16.0 * vec4<f32>((vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(v))) & vec4<u32>(1u));
    return q_d(r, blk) * (q - vec4<f32>(16.0));
{$ elif KIND == "Q5_1" $}
    let dm = unpack2x16float(b[wb]);
    let qh = b[wb + 1u];
    let q = q_bits(b[wb + 2u + l / 4u], 4u * hi, 15u)
        + 16.0 * vec4<f32>((vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(v))) & vec4<u32>(1u));
    return dm.x * q + vec4<f32>(dm.y);
{$ else $}
    return q_d(r, blk) * q_iq4(q_field(b[wb + l / 4u], 4u * hi, 15u));
{$ endif $}
{$ elif KIND == "IQ4_XS" $}
    // d and 16 bits of scale high pairs; 4 bytes of scale low nibbles; 128 bytes of nibbles,
    // 16 a sub-block of 32 (byte l: values l and 16 + l)
    let ib = v / 32u;
    let hi = (v / 16u) & 1u;
    let l = v % 16u;
    let w0 = b[wb];
    let ls = ((q_byte(b[wb + 1u], ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((w0 >> (16u + 2u * ib)) & 3u) << 4u);
    let dl = unpack2x16float(w0).x * (f32(ls) - 32.0);
    return dl * q_iq4(q_field(b[wb + 2u + 4u * ib + l / 4u], 4u * hi, 15u));
{$ elif KIND == "BF16" $}
    // 2 values a word, the low half first; a bfloat16 is the high half of an f32
    let w0 = b[wb + v / 2u];
    let w1 = b[wb + v / 2u + 1u];
    return vec4<f32>(bitcast<f32>(w0 << 16u), bitcast<f32>(w0 & 0xffff0000u), bitcast<f32>(w1 << 16u),
                     bitcast<f32>(w1 & 0xffff0000u));
{$ elif KIND == "F16" $}
    // 2 values a word, the low half first
    return vec4<f32>(unpack2x16float(b[wb + v / 2u]), unpack2x16float(b[wb + v / 2u + 1u]));
{$ elif KIND == "F32" $}
    return vec4<f32>(bitcast<f32>(b[wb + v]), bitcast<f32>(b[wb + v + 1u]), bitcast<f32>(b[wb + v + 2u]),
                     bitcast<f32>(b[wb + v + 3u]));
{$ endif $}
}
