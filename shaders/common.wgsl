// Helpers shared by all kernels. Included by every template after the bindings.

// Linear invocation index for a 1-D launch folded into 2-D (see runtime/wgsl.py grid()).
fn linear_id(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * {{ WORKGROUP }}u + lid;
}

// erf with |error| < 1.2e-7 (Numerical Recipes erfc Chebyshev fit), exact at 0 and odd.
fn erf_f32(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
        t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
        t * (-0.82215223 + t * 0.17087277)))))))));
    return select(r - 1.0, 1.0 - r, x >= 0.0);
}

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

{$ if emu64 $}
{$ include "int64e.wgsl" $}
{$ endif $}

// Round half to even (WGSL round() already does this; kept as a named helper for clarity).
fn round_even_f32(x: f32) -> f32 { return round(x); }

// tanh that stays finite for large |x| (some drivers return NaN for tanh(±inf)/large inputs).
fn tanh_f32(x: f32) -> f32 {
    let c = clamp(x, -15.0, 15.0);
    let e = exp(2.0 * c);
    return (e - 1.0) / (e + 1.0);
}

// One exp: for large -x, exp overflows to inf and 1/inf gives the exact limit 0.
fn sigmoid_f32(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn softplus_f32(x: f32) -> f32 {
    return max(x, 0.0) + log(1.0 + exp(-abs(x)));
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
