// int64 / uint64 emulated with two 32-bit words, for devices without "shader-int64".
// A value is vec2<u32>(low word, high word) in two's complement: exactly the storage form, so
// tensors are bound in place as on a device with native 64-bit integers. Included by common.wgsl
// only into kernels that use it (see runtime/wgsl.py); the Python side spells every operation on
// these types through runtime/wgsl.py (binop, compare, unop, convert, lit), never with operators.
// Results are bit-exact with native i64/u64 (wrapping add/sub/mul, truncating division, WGSL's
// saturating float conversions; only NaN -> integer, indeterminate in WGSL, may differ).
alias i64e = vec2<u32>;
alias u64e = vec2<u32>;

fn e64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn e64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn e64_neg(a: vec2<u32>) -> vec2<u32> { return e64_sub(vec2<u32>(0u, 0u), a); }

// The full 64-bit product of two 32-bit words, from 16-bit halves.
fn e64_mul32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u;
    let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// Low 64 bits of the product: the same for signed and unsigned (two's complement).
fn e64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = e64_mul32(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}

fn e64_eq(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x == b.x && a.y == b.y; }

fn u64e_lt(a: u64e, b: u64e) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn u64e_le(a: u64e, b: u64e) -> bool { return !u64e_lt(b, a); }
fn i64e_lt(a: i64e, b: i64e) -> bool {
    let ah = bitcast<i32>(a.y);
    let bh = bitcast<i32>(b.y);
    return ah < bh || (ah == bh && a.x < b.x);
}
fn i64e_le(a: i64e, b: i64e) -> bool { return !i64e_lt(b, a); }

fn u64e_max(a: u64e, b: u64e) -> u64e { return select(a, b, u64e_lt(a, b)); }
fn u64e_min(a: u64e, b: u64e) -> u64e { return select(a, b, u64e_lt(b, a)); }
fn i64e_max(a: i64e, b: i64e) -> i64e { return select(a, b, i64e_lt(a, b)); }
fn i64e_min(a: i64e, b: i64e) -> i64e { return select(a, b, i64e_lt(b, a)); }

fn i64e_negative(a: i64e) -> bool { return (a.y >> 31u) == 1u; }
// abs of the minimum wraps to itself, as native i64 does.
fn i64e_abs(a: i64e) -> i64e { return select(a, e64_neg(a), i64e_negative(a)); }
fn i64e_sign(a: i64e) -> i64e {
    if (i64e_negative(a)) { return vec2<u32>(0xffffffffu, 0xffffffffu); }
    return vec2<u32>(select(0u, 1u, a.x != 0u || a.y != 0u), 0u);
}

fn e64_clz(a: vec2<u32>) -> u32 { return select(countLeadingZeros(a.y), 32u + countLeadingZeros(a.x), a.y == 0u); }

// a << s for 0 <= s < 64.
fn e64_shl(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 32u) { return vec2<u32>(0u, a.x << (s - 32u)); }
    return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}

// Truncating division; division by zero gives 0 (as the native kernels do).
fn u64e_div(a: u64e, b: u64e) -> u64e {
    if (b.x == 0u && b.y == 0u) { return vec2<u32>(0u, 0u); }
    if (a.y == 0u && b.y == 0u) { return vec2<u32>(a.x / b.x, 0u); }
    if (u64e_lt(a, b)) { return vec2<u32>(0u, 0u); }
    // shift-subtract long division with the divisor aligned to the dividend's top bit: one step
    // per quotient bit (bit length of a minus that of b, plus one), not 64
    let n = e64_clz(b) - e64_clz(a);
    var d = e64_shl(b, n);
    var r = a;
    var q = vec2<u32>(0u, 0u);
    for (var k = 0u; k <= n; k++) {
        q = vec2<u32>(q.x << 1u, (q.y << 1u) | (q.x >> 31u));
        if (!u64e_lt(r, d)) {
            r = e64_sub(r, d);
            q.x = q.x | 1u;
        }
        d = vec2<u32>((d.x >> 1u) | (d.y << 31u), d.y >> 1u);
    }
    return q;
}

// The minimum divided by -1 wraps to the minimum, as native i64 does.
fn i64e_div(a: i64e, b: i64e) -> i64e {
    let q = u64e_div(i64e_abs(a), i64e_abs(b));
    return select(q, e64_neg(q), i64e_negative(a) != i64e_negative(b));
}

// pow by squaring (wrapping, as pow_i64 / pow_u64 in common.wgsl). A negative exponent gives
// 1 / a^-e truncated: 1 for a = 1, +-1 for a = -1, else 0.
fn u64e_pow(a: u64e, b: u64e) -> u64e {
    var r = vec2<u32>(1u, 0u);
    var base = a;
    var e = b;
    loop {
        if (e.x == 0u && e.y == 0u) { break; }
        if ((e.x & 1u) == 1u) { r = e64_mul(r, base); }
        base = e64_mul(base, base);
        e = vec2<u32>((e.x >> 1u) | (e.y << 31u), e.y >> 1u);
    }
    return r;
}

fn i64e_pow(a: i64e, b: i64e) -> i64e {
    if (i64e_negative(b)) {
        if (a.x == 1u && a.y == 0u) { return a; }
        if (a.x == 0xffffffffu && a.y == 0xffffffffu) { return select(a, vec2<u32>(1u, 0u), (b.x & 1u) == 0u); }
        return vec2<u32>(0u, 0u);
    }
    return u64e_pow(a, b);  // the low 64 bits of the product do not depend on the sign
}

fn i64e_clamp(x: i64e, lo: i64e, hi: i64e) -> i64e { return i64e_max(i64e_min(x, hi), lo); }
fn u64e_clamp(x: u64e, lo: u64e, hi: u64e) -> u64e { return u64e_max(u64e_min(x, hi), lo); }

// -- conversions --------------------------------------------------------------------------------

fn i64e_from_i32(x: i32) -> i64e { return vec2<u32>(bitcast<u32>(x), select(0u, 0xffffffffu, x < 0i)); }
fn e64_from_u32(x: u32) -> vec2<u32> { return vec2<u32>(x, 0u); }

// Round to nearest even, like a native u64 -> f32 conversion and numpy.
fn u64e_to_f32(a: u64e) -> f32 {
    if (a.y == 0u) { return f32(a.x); }
    // normalize: the top 32 significant bits in m, whatever is below them in `sticky`
    let s = countLeadingZeros(a.y);
    var m = a.y;
    var sticky = a.x;
    if (s > 0u) {
        m = (a.y << s) | (a.x >> (32u - s));
        sticky = a.x << s;
    }
    var keep = m >> 8u;  // 24 bits, the leading one included
    let rest = m & 0xffu;
    if (rest > 0x80u || (rest == 0x80u && (sticky != 0u || (keep & 1u) == 1u))) { keep = keep + 1u; }
    // value = keep * 2^(40 - s); the leading one adds 1 to the exponent field (and a rounding
    // carry to 2^24 adds one more, leaving the fraction 0)
    return bitcast<f32>((u32(127 + 40 + 23 - 1) - s) * 0x800000u + keep);
}

fn i64e_to_f32(a: i64e) -> f32 {
    let m = u64e_to_f32(i64e_abs(a));
    return select(m, -m, i64e_negative(a));
}

// |x| truncated, for 0 <= |x| < 2^64 (callers saturate first).
fn e64_from_abs_f32(ax: f32) -> vec2<u32> {
    if (ax < 4294967296.0) { return vec2<u32>(u32(ax), 0u); }
    // ax >= 2^32 is an integer with at most 24 significant bits: both halves are exact
    let hi = floor(ax / 4294967296.0);
    return vec2<u32>(u32(ax - hi * 4294967296.0), u32(hi));
}

// Truncates toward zero and saturates like WGSL's native conversions: out-of-range values clamp to
// the f32 values nearest the type's bounds (2^63 - 2^39 and -2^63; 2^64 - 2^40 and 0). NaN, whose
// conversion WGSL leaves indeterminate, gives 0.
fn i64e_from_f32(x: f32) -> i64e {
    if (!(abs(x) < 9223372036854775808.0)) {
        if (x != x) { return vec2<u32>(0u, 0u); }
        return select(vec2<u32>(0u, 0x7fffff80u), vec2<u32>(0u, 0x80000000u), x < 0.0);
    }
    let m = e64_from_abs_f32(trunc(abs(x)));
    return select(m, e64_neg(m), x < 0.0);
}

fn u64e_from_f32(x: f32) -> u64e {
    if (!(x > 0.0)) { return vec2<u32>(0u, 0u); }
    if (x >= 18446744073709551616.0) { return vec2<u32>(0u, 0xffffff00u); }
    return e64_from_abs_f32(trunc(x));
}

// An int64 index into a dimension of size n: negative counts from the end; out of range
// (including values beyond 32 bits) is clamped, so no read or write leaves the tensor.
fn wrap_i64e(v: i64e, n: u32) -> u32 {
    let lo = bitcast<i32>(v.x);
    if (bitcast<i32>(v.y) != (lo >> 31u)) { return select(n - 1u, 0u, i64e_negative(v)); }
    var k = lo;
    if (k < 0i) { k = k + i32(n); }
    return u32(clamp(k, 0i, i32(n) - 1i));
}
