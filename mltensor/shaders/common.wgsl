// Helpers shared by all kernels. Included by every template after the bindings.

// Linear invocation index for a 1-D launch folded into 2-D (see runtime/wgsl.py grid()).
{$ if fast_div $}
// n / d for a size d read at dispatch (a u32 division by a value unknown at compile time runs
// lane by lane on CPU adapters) and n < 2^23 (ops.FAST_DIV_MAX): f32(n) is exact and WGSL bounds
// the f32 quotient within 2.5 ulp, so its truncation is within 2 of the integer quotient, which
// the remainder corrects exactly. Added to kernels that call it (runtime/wgsl.py).
fn div_fast(n: u32, d: u32) -> u32 {
    let q = u32(f32(n) / f32(d));
    let r = i32(n) - i32(q * d);
    let di = i32(d);
    return q + select(0u, 1u, r >= di) + select(0u, 1u, r >= 2 * di) - select(0u, 1u, r < 0) - select(0u, 1u, r < -di);
}

{$ endif $}
fn linear_id(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * {{ WORKGROUP }}u + lid;
}

// Bit tests: unlike `x != x` or comparisons with inf, no compiler may fold them away (WGSL lets an
// implementation assume that NaN and inf never occur in float arithmetic).
fn is_nan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn nan_f32() -> f32 { return bitcast<f32>(0x7fc00000u); }

// erfc(|x|) with relative error < 1.2e-7 (Numerical Recipes' Chebyshev fit); 0 for |x| = inf.
fn erfc_abs_f32(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    return t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
        t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
        t * (-0.82215223 + t * 0.17087277)))))))));
}

// erf: Taylor series below 0.5 (1 - erfc would cancel every digit of a small result), 1 - erfc above.
fn erf_f32(x: f32) -> f32 {
    let z = abs(x);
    let x2 = x * x;
    let small = 1.1283791670955126 * x * (1.0 + x2 * (-0.3333333333 + x2 * (0.1 + x2 * (-0.0238095238 +
        x2 * (0.0046296296 + x2 * (-0.0007575758 + x2 * 0.0001068376))))));
    let r = erfc_abs_f32(z);
    return select(select(r - 1.0, 1.0 - r, x >= 0.0), small, z < 0.5);
}

// erfc without cancellation for x > 0 (where erfc is small): gelu's left tail needs it.
fn erfc_f32(x: f32) -> f32 {
    let r = erfc_abs_f32(abs(x));
    return select(2.0 - r, r, x >= 0.0);
}

// exp(x) - 1 keeping its relative precision near 0 (Taylor series below 0.35); -1 at -inf.
fn expm1_f32(x: f32) -> f32 {
    let p = x * (1.0 + x * (0.5 + x * (0.16666666666 + x * (0.04166666666 + x * (0.00833333333 +
        x * (0.00138888888 + x * (0.000198412698 + x * (0.0000248015873 + x * 0.00000275573192))))))));
    return select(exp(x) - 1.0, p, abs(x) < 0.35);
}

// log(1 + y) for y in [0, 1] without calling log near 1 (where approximate logs lose every
// digit of a small result): 2 atanh(s), s = y / (2 + y) <= 1/3, as an odd series to s^15.
fn log1p_unit_f32(y: f32) -> f32 {
    let s = y / (2.0 + y);
    let s2 = s * s;
    return 2.0 * s * (1.0 + s2 * (0.33333333333 + s2 * (0.2 + s2 * (0.14285714286 + s2 * (0.11111111111 +
        s2 * (0.09090909091 + s2 * (0.07692307692 + s2 * 0.06666666667)))))));
}

// sin and cos of an f32 by Cody-Waite reduction modulo pi/2 (three-part constant: exact products
// for |x| < 65536) and minimax polynomials on [-pi/4, pi/4] (Cephes sinf/cosf, ~2 ulp). Drivers'
// sin/cos are only specified on [-pi, pi] (NVIDIA's lose 1e-5 absolute by |x| = 100); beyond
// 65536 the built-ins are used, and inf/NaN give NaN. `which`: 0 sin, 1 cos.
fn sincos_f32(x: f32, which: u32) -> f32 {
    let a = abs(x);
    if (!(a < 65536.0)) {
        if (is_nan_f32(x) || is_inf_f32(x)) { return nan_f32(); }
        return select(sin(x), cos(x), which == 1u);
    }
    let j = u32(a * 0.63661977236758134 + 0.5);  // nearest multiple of pi/2; a >= 0: no UB
    let y = f32(j);
    let r = ((a - y * 1.5703125) - y * 4.837512969970703125e-4) - y * 7.54978995489188216e-8;
    let z = r * r;
    let s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    let c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    // quadrant q = j mod 4 of |x|: sin: s, c, -s, -c; cos: c, -s, -c, s
    let q = (j + which) & 3u;
    var v = select(s, c, (q & 1u) == 1u);
    v = select(v, -v, q >= 2u);
    // sin is odd, cos even
    return select(v, -v, which == 0u && x < 0.0);
}

fn sin_f32(x: f32) -> f32 { return sincos_f32(x, 0u); }
fn cos_f32(x: f32) -> f32 { return sincos_f32(x, 1u); }
fn tan_f32(x: f32) -> f32 { return sincos_f32(x, 0u) / sincos_f32(x, 1u); }

// pow that, like numpy, gives real results for a negative base with an integral exponent.
fn pow_f32(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (a < 0.0 && b == floor(b)) {
        let m = pow(-a, b);
        return select(m, -m, (abs(b) % 2.0) == 1.0);
    }
    return pow(a, b);
}

fn pow_i32(a: i32, b: i32) -> i32 {
    var r = 1i; var base = a; var e = b;
    if (e < 0) {
        if (a == 1) { return 1i; }
        if (a == -1) { return select(-1i, 1i, (e & 1) == 0); }
        return 0i;
    }
    loop { if (e == 0) { break; } if ((e & 1) == 1) { r = r * base; } base = base * base; e = e >> 1u; }
    return r;
}

fn pow_u32(a: u32, b: u32) -> u32 {
    var r = 1u; var base = a; var e = b;
    loop { if (e == 0u) { break; } if ((e & 1u) == 1u) { r = r * base; } base = base * base; e = e >> 1u; }
    return r;
}

{$ if wide64 $}
// 64-bit integer helpers: only in kernels that use 64-bit integers (see runtime/wgsl.py).
fn pow_i64(a: i64, b: i64) -> i64 {
    var r = 1li; var base = a; var e = b;
    if (e < 0li) {
        if (a == 1li) { return 1li; }
        if (a == -1li) { return select(-1li, 1li, (e & 1li) == 0li); }
        return 0li;
    }
    loop { if (e == 0li) { break; } if ((e & 1li) == 1li) { r = r * base; } base = base * base; e = e >> 1u; }
    return r;
}

fn pow_u64(a: u64, b: u64) -> u64 {
    var r = 1lu; var base = a; var e = b;
    loop { if (e == 0lu) { break; } if ((e & 1lu) == 1lu) { r = r * base; } base = base * base; e = e >> 1u; }
    return r;
}

// sign() of WGSL has no 64-bit integer overload.
fn sign_i64(x: i64) -> i64 { return select(select(0li, -1li, x < 0li), 1li, x > 0li); }
{$ endif $}

{$ if f16 $}
// f16 helpers: only in kernels that use f16 (see runtime/wgsl.py).
fn is_nan_f16(x: f16) -> bool { return is_nan_f32(f32(x)); }

// An f32 as f16, rounded to nearest; +-inf from 65520 on (where round to nearest even reaches
// inf) and NaN for NaN, like numpy's float16 (WGSL leaves f16() of an out-of-range f32
// undefined, so the finite case is clamped first).
fn f16_of(x: f32) -> f16 {
    let b = bitcast<u32>(x) & 0x7fffffffu;
    let special = select(f16(bitcast<f32>((bitcast<u32>(x) & 0x80000000u) | 0x7f800000u)),
                         f16(bitcast<f32>(0x7fc00000u)), b > 0x7f800000u);
    return select(f16(clamp(x, -65504.0, 65504.0)), special, b >= 0x477ff000u);
}
{$ endif $}

{$ if emu64 $}
{$ include "int64e.wgsl" $}
{$ endif $}

// Round half to even (WGSL round() already does this; kept as a named helper for clarity).
fn round_even_f32(x: f32) -> f32 { return round(x); }

// tanh as Eigen's rational minimax fit (a few ulp, no exp): exact-enough near 0, where
// (e - 1) / (e + 1) cancels every digit, and no inf / inf for large |x| (it saturates at +-7.9).
fn tanh_f32(x: f32) -> f32 {
    let c = clamp(x, -7.90531110763549805, 7.90531110763549805);
    let x2 = c * c;
    var p = x2 * -2.76076847742355e-16 + 2.00018790482477e-13;
    p = x2 * p + -8.60467152213735e-11;
    p = x2 * p + 5.12229709037114e-08;
    p = x2 * p + 1.48572235717979e-05;
    p = x2 * p + 6.37261928875436e-04;
    p = x2 * p + 4.89352455891786e-03;
    var q = x2 * 1.19825839466702e-06 + 1.18534705686654e-04;
    q = x2 * q + 2.26843463243900e-03;
    q = x2 * q + 4.89352518554385e-03;
    let r = select(c * p / q, c, abs(c) < 0.0004);  // tanh(x) = x in f32 below 4e-4
    return select(r, x, is_nan_f32(x));
}

// One exp: for large -x, exp overflows to inf and 1/inf gives the exact limit 0.
fn sigmoid_f32(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// max(x, 0) + log(1 + exp(-|x|)), the log1p without log (softplus(-20) = 2e-9, not 0); NaN stays NaN.
fn softplus_f32(x: f32) -> f32 {
    return select(max(x, 0.0) + log1p_unit_f32(exp(-abs(x))), x, is_nan_f32(x));
}

// IEEE binary16 bits of an f32, round to nearest even; inf, NaN and subnormals handled.
fn f32_to_f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let e = i32((x >> 23u) & 0xffu);
    var m = x & 0x7fffffu;
    if (e == 255) {
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let ue = e - 127 + 15;
    if (ue >= 31) { return sign | 0x7c00u; }
    if (ue <= 0) {
        if (ue < -10) { return sign; }
        m = m | 0x800000u;
        let shift = u32(14 - ue);
        var h = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u) == 1u)) { h = h + 1u; }
        return sign | h;
    }
    var h = (u32(ue) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) { h = h + 1u; }
    return sign | h;
}

fn f16_bits_to_f32(h: u32) -> f32 {
    return unpack2x16float(h & 0xffffu).x;
}
