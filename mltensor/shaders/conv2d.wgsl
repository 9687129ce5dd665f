{# conv2d / conv_transpose2d. Extends the GEMM of matmul.wgsl: #}
{# - implicit GEMM ("tiled"/"gemv"): per group g, A = im2col(input) (rows m = output pixels     #}
{#   n*OH*OW, columns k = (kh, kw, ic) or (ic, kh, kw)), B = filter (k x output channel of g).   #}
{#   im2col is never materialized: load_a computes the input coordinate of (m, k) on the fly.    #}
{# - "dw": depthwise (one input channel per group), one thread per output element.              #}
{# - "direct": fewer than 4 output channels per group, one thread per output pixel.              #}
{# Layouts are handled by baked strides: tensor (n, c, h, w) lives at n*sn + c*sc + h*sh + w*sw, #}
{# filter (o, i, kh, kw) at o*fo + i*fi + kh*fh + kw*fw, whatever the layout string.            #}
{# x, w, bias, out are f32 or f16 (matmul.wgsl): reads widen to f32, stores narrow through ST. #}
{$ extends "matmul.wgsl" $}

{$ block loaders $}
{$ from "conv_sizes.wgsl" import ohw, IHi, IWi, fd, dv, md with context $}
{$ if (OH * OW) is integer $}
const OHW = {{ OH * OW }}u;
{$ endif $}

// Input element at flat index i (channel c): every read of x goes through x_at / x_at4, which
// apply the step's prologue (compiler/passes.py ConvPrologue, text from conv.py): "bn" / "scaled"
// transform the loaded value (pro), "resample" computes the element from the resample's input
// (rs_at). Padding never goes through them: it stays 0, the padding of the transformed tensor
// (a merged "pad" prologue is just more of it). "dw" replaces load_a of a 1x1 conv (dw_at).
{$ if pro_kind == "resample" $}
{$ include "resample_at.wgsl" $}
{$ endif $}
{{ pro }}

fn x_at(i: u32, c: u32) -> f32 {
{$ if pro_kind == "resample" $}
    return rs_at(i);  // x is the resample's (smaller) input
{$ else $}
{$ if x_vec $}
    let v = f32(x[i / 4u][i % 4u]);
{$ else $}
    let v = f32(x[i]);
{$ endif $}
{$ if pro_kind in ("bn", "scaled") $}
    return pro(v, c, i);
{$ else $}
    return v;
{$ endif $}
{$ endif $}
}

fn in_at(n: u32, c: u32, h: u32, w: u32) -> f32 {
    return x_at(n * {{ u(in_s[0]) }} + c * {{ u(in_s[1]) }} + h * {{ u(in_s[2]) }} + w * {{ u(in_s[3]) }}, c);
}

// (ic, kh, kw) of reduction index k (columns ordered (kh, kw, ic) for NHWC, else (ic, kh, kw)),
// shared by load_a (im2col) and load_b (filter).
fn k_coords(k: u32) -> vec3<u32> {
{$ if ic_inner $}
    return vec3<u32>(k % {{ ICg }}u, k / {{ ICg * KW }}u, (k / {{ ICg }}u) % {{ KW }}u);
{$ else $}
    return vec3<u32>(k / {{ KH * KW }}u, (k / {{ KW }}u) % {{ KH }}u, k % {{ KW }}u);
{$ endif $}
}

{$ if pointwise $}
// 1x1, stride 1, no padding: A is the input itself (pixels x channels), or with a depthwise
// prologue ("dw") the depthwise conv's output, computed here from its input x (dw_at, above).
fn load_a(g: u32, m: u32, k: u32) -> f32 {
{$ if check_a $}
    if (m >= {{ sz.M }} || k >= K) { return 0.0; }
{$ endif $}
{$ if pro_kind == "dw" $}
    return dw_at(m, k);
{$ elif in_s[1] == 1 and groups == 1 $}
    return x_at(m * {{ IC }}u + k, k);
{$ else $}
    let n = {{ dv("m", ohw) }};
    let p = {{ md("m", ohw) }};
    return x_at(n * {{ u(in_s[0]) }} + (g * {{ ICg }}u + k) * {{ u(in_s[1]) }} + p * {{ u(in_s[3]) }}, g * {{ ICg }}u + k);
{$ endif $}
}
{$ else $}
fn load_a(g: u32, m: u32, k: u32) -> f32 {
{$ if check_a $}
    if (m >= {{ sz.M }} || k >= K) { return 0.0; }
{$ endif $}
    let n = {{ dv("m", ohw) }};
    let p = {{ md("m", ohw) }};
    let oh = {{ dv("p", u(OW)) }};
    let ow = {{ md("p", u(OW)) }};
    let kc = k_coords(k);
    let ic = kc.x;
    let kh = kc.y;
    let kw = kc.z;
{$ if transposed $}
    // output row oh gathers input row ih where oh = ih * SH - PT + kh * DH
    let th = i32(oh) + {{ PT }} - i32(kh * {{ DH }}u);
    let tw = i32(ow) + {{ PL }} - i32(kw * {{ DW }}u);
    if (th < 0 || tw < 0) { return 0.0; }
    let ih = u32(th) / {{ SH }}u;
    let iw = u32(tw) / {{ SW }}u;
    if (ih * {{ SH }}u != u32(th) || iw * {{ SW }}u != u32(tw) || ih >= {{ u(IH) }} || iw >= {{ u(IW) }}) {
        return 0.0;
    }
{$ else $}
    let th = i32(oh * {{ SH }}u + kh * {{ DH }}u) - {{ PT }};
    let tw = i32(ow * {{ SW }}u + kw * {{ DW }}u) - {{ PL }};
    if (th < 0 || tw < 0 || th >= {{ IHi }} || tw >= {{ IWi }}) { return 0.0; }
    let ih = u32(th);
    let iw = u32(tw);
{$ endif $}
    return in_at(n, g * {{ ICg }}u + ic, ih, iw);
}
{$ endif $}

fn load_b(g: u32, k: u32, o: u32) -> f32 {
{$ if check_b $}
    if (k >= K || o >= N) { return 0.0; }
{$ endif $}
{$ if pointwise $}
    let ic = k;
    let kh = 0u;
    let kw = 0u;
{$ else $}
    let kc = k_coords(k);
    let ic = kc.x;
    let kh = kc.y;
    let kw = kc.z;
{$ endif $}
    // f_g: offset of group g's filter slice (along o for conv2d, along i for the transpose)
    return f32(w[g * {{ f_g }}u + o * {{ f_s[0] }}u + ic * {{ f_s[1] }}u + kh * {{ f_s[2] }}u + kw * {{ f_s[3] }}u]);
}

// Filter offset of reduction index k (group g, output channel 0 of the group).
fn w_k(g: u32, k: u32) -> u32 {
{$ if pointwise $}
    return g * {{ f_g }}u + k * {{ f_s[1] }}u;
{$ else $}
    let kc = k_coords(k);
    return g * {{ f_g }}u + kc.x * {{ f_s[1] }}u + kc.y * {{ f_s[2] }}u + kc.z * {{ f_s[3] }}u;
{$ endif $}
}

fn load_b4n(g: u32, k: u32, o: u32) -> vec4<f32> {
    // the 4 output channels share k's coordinates: decomposed once
{$ if check_b $}
    if (k >= K) { return vec4<f32>(0.0); }
{$ endif $}
    let base = w_k(g, k) + o * {{ f_s[0] }}u;
    var v = vec4<f32>(0.0);
{$ for c in range(4) $}
{$ if check_b $}
    if (o + {{ c }}u < N) { v[{{ c }}] = f32(w[base + {{ c * f_s[0] }}u]); }
{$ else $}
    v[{{ c }}] = f32(w[base + {{ c * f_s[0] }}u]);
{$ endif $}
{$ endfor $}
    return v;
}

fn load_b4k(g: u32, k: u32, o: u32) -> vec4<f32> {
{$ if w_kcontig $}
    // the filter's k order is its memory order (OIHW, OHWI): 4 consecutive words
{$ if check_b $}
    if (o >= N) { return vec4<f32>(0.0); }
{$ endif $}
    let base = g * {{ f_g }}u + o * {{ f_s[0] }}u + k;
{$ if K % 4 != 0 $}
    var v = vec4<f32>(0.0);
{$ for c in range(4) $}
    if (k + {{ c }}u < K) { v[{{ c }}] = f32(w[base + {{ c }}u]); }
{$ endfor $}
    return v;
{$ else $}
    if (k >= K) { return vec4<f32>(0.0); }
    return vec4<f32>(f32(w[base]), f32(w[base + 1u]), f32(w[base + 2u]), f32(w[base + 3u]));
{$ endif $}
{$ else $}
    return vec4<f32>(load_b(g, k, o), load_b(g, k + 1u, o), load_b(g, k + 2u, o), load_b(g, k + 3u, o));
{$ endif $}
}

fn load_a4(g: u32, m: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(load_a(g, m, k), load_a(g, m, k + 1u), load_a(g, m, k + 2u), load_a(g, m, k + 3u));
}

fn store(g: u32, m: u32, o: u32, acc: f32) {
{$ if check_out $}
    if (m >= {{ sz.M }} || o >= N) { return; }
{$ endif $}
    let oc = g * {{ OCg }}u + o;
{$ if has_bias $}
    let v = acc + f32(bias[oc]);
{$ else $}
    let v = acc;
{$ endif $}
{$ if out_s[1] == 1 $}
    let oi = m * {{ OC }}u + oc;  // NHWC: pixel m's channels are contiguous
{$ else $}
    let oi = ({{ dv("m", ohw) }}) * {{ u(out_s[0]) }} + oc * {{ u(out_s[1]) }} + ({{ md("m", ohw) }}) * {{ u(out_s[3]) }};
{$ endif $}
    out[oi] = act({{ ST }}(v), oi);
}
{$ endblock $}

{$ block stage_a $}
{$ from "conv_sizes.wgsl" import ohw, IHi, IWi, fd, dv, md with context $}
{$ if a_mode == "hoist" $}
// im2col with the address math out of the inner loop: a thread always stages the same 4 rows m
// of A (THREADS is a multiple of AQ), so their output pixel -> input window origin and image base
// are computed once (setup_a); a staged k row costs one k decomposition and 4 bounds tests, no
// division per element. Rows past M get a window origin so far out that every test fails.
var<private> a_ih: vec4<i32>;
var<private> a_iw: vec4<i32>;
var<private> a_xb: vec4<u32>;

fn setup_a(g: u32, m0: u32, li: u32) {
    let mb = m0 + (li % AQ) * 4u;
{$ for q in range(4) $}
    {
        let m = mb + {{ q }}u;
        let p = {{ md("m", ohw) }};
        a_ih[{{ q }}] = select(-16777216, i32(({{ dv("p", u(OW)) }}) * {{ SH }}u) - {{ PT }}, m < {{ sz.M }});
        a_iw[{{ q }}] = select(-16777216, i32(({{ md("p", u(OW)) }}) * {{ SW }}u) - {{ PL }}, m < {{ sz.M }});
        a_xb[{{ q }}] = ({{ dv("m", ohw) }}) * {{ u(in_s[0]) }} + g * {{ u(ICg * in_s[1]) }};
    }
{$ endfor $}
}

fn stage_a(g: u32, m0: u32, k0: u32, o: u32, li: u32) {
    for (var e = li; e < AS; e = e + THREADS) {
        let k = k0 + e / AQ;
        var v = vec4<f32>(0.0);
{$ if K % BK != 0 $}
        if (k < K) {
{$ else $}
        {
{$ endif $}
{$ if pointwise $}
            let c = k;
            let dh = 0;
            let dw = 0;
{$ else $}
            let kc = k_coords(k);
            let c = kc.x;
            let dh = i32(kc.y * {{ DH }}u);
            let dw = i32(kc.z * {{ DW }}u);
{$ endif $}
            let cb = c * {{ u(in_s[1]) }};
{$ for q in range(4) $}
            {
                let ih = a_ih[{{ q }}] + dh;
                let iw = a_iw[{{ q }}] + dw;
                if (ih >= 0 && iw >= 0 && ih < {{ IHi }} && iw < {{ IWi }}) {
                    v[{{ q }}] = x_at(a_xb[{{ q }}] + cb + u32(ih) * {{ u(in_s[2]) }} + u32(iw) * {{ u(in_s[3]) }}, g * {{ ICg }}u + c);
                }
            }
{$ endfor $}
        }
        As[o + e] = v;
    }
}
{$ elif a_mode == "nhwc4" $}
// NHWC with ICg % 4 == 0: the coalesced mapping is along k (consecutive input channels), so a
// thread stages 4 consecutive k of one row m, one 16-byte load (x bound as vec4), written
// transposed into As[k][m]. Its k quad is the same at every step of its loop (THREADS is a
// multiple of KQ): decomposed once per stage, the row's pixel once per element.
fn setup_a(g: u32, m0: u32, li: u32) {}

fn x_at4(i: u32, c: u32) -> vec4<f32> {
{$ if pro_kind in ("bn", "scaled") $}
    let v = vec4<f32>(x[i / 4u]);
    return vec4<f32>(pro(v.x, c, i), pro(v.y, c + 1u, i + 1u), pro(v.z, c + 2u, i + 2u), pro(v.w, c + 3u, i + 3u));
{$ else $}
    return vec4<f32>(x[i / 4u]);
{$ endif $}
}

fn stage_a(g: u32, m0: u32, k0: u32, o: u32, li: u32) {
{$ if (TX * TY) % (BK // 4) == 0 $}
    let kq = (li % KQ) * 4u;
    let kc = k_coords(k0 + kq);
{$ endif $}
    for (var e = li; e < AS; e = e + THREADS) {
        let ml = e / KQ;
{$ if (TX * TY) % (BK // 4) != 0 $}
        let kq = (e % KQ) * 4u;
        let kc = k_coords(k0 + kq);
{$ endif $}
        let m = m0 + ml;
        var v = vec4<f32>(0.0);
        if (m < {{ sz.M }} && k0 + kq < K) {
            let p = {{ md("m", ohw) }};
            let ih = i32(({{ dv("p", u(OW)) }}) * {{ SH }}u + kc.y * {{ DH }}u) - {{ PT }};
            let iw = i32(({{ md("p", u(OW)) }}) * {{ SW }}u + kc.z * {{ DW }}u) - {{ PL }};
            if (ih >= 0 && iw >= 0 && ih < {{ IHi }} && iw < {{ IWi }}) {
                let c = g * {{ ICg }}u + kc.x;
                v = x_at4(({{ dv("m", ohw) }}) * {{ u(in_s[0]) }} + u32(ih) * {{ u(in_s[2]) }} + u32(iw) * {{ u(in_s[3]) }} + c, c);
            }
        }
        put_a4(o + kq * AQ, ml, v);
    }
}
{$ else $}
{{ super() }}
{$ endif $}
{$ endblock $}

{$ block kernels $}
{$ from "conv_sizes.wgsl" import ohw, IHi, IWi, fd, dv, md with context $}
{$ if path == "dw" $}
// Depthwise: output channel oc reads input channel oc / MULT only. A thread computes OWB
// horizontally adjacent outputs of one channel, so the input columns their windows share and
// the filter row are loaded once (for 3x3 stride 1: 27 loads for 4 outputs instead of 72).
// Consecutive threads take consecutive channels in NHWC (consecutive words) and consecutive
// column blocks in NCHW.
{$ if OW is integer $}
const OWQ = {{ (OW + OWB - 1) // OWB }}u;
{$ endif $}
{$ set owq = "OWQ" if OW is integer else u((OW + OWB - 1) // OWB) $}

{{ main_1d(total) }}
{$ if out_s[1] == 1 $}
    let oc = i % {{ OC }}u;
    let p = i / {{ OC }}u;
    let owq = {{ md("p", owq) }};
    let oh = {{ md("(" ~ dv("p", owq) ~ ")", u(OH)) }};
    let n = {{ dv("p", "(" ~ owq ~ " * " ~ u(OH) ~ ")") }};
{$ else $}
    let owq = {{ md("i", owq) }};
    let oh = {{ md("(" ~ dv("i", owq) ~ ")", u(OH)) }};
    let oc = ({{ dv("i", "(" ~ owq ~ " * " ~ u(OH) ~ ")") }}) % {{ OC }}u;
    let n = {{ dv("i", "(" ~ owq ~ " * " ~ u(OH * OC) ~ ")") }};
{$ endif $}
    let ow0 = owq * {{ OWB }}u;
    let ic = oc / {{ MULT }}u;
    let ih0 = i32(oh * {{ SH }}u) - {{ PT }};
    let iw0 = i32(ow0 * {{ SW }}u) - {{ PL }};
    let xb = n * {{ u(in_s[0]) }} + ic * {{ u(in_s[1]) }};
    let wb = oc * {{ f_s[0] }}u;
{$ for j in range(OWB) $}
    var acc{{ j }} = 0.0;
{$ endfor $}
{$ for kh in range(KH) $}
    {
        let ih = ih0 + {{ kh * DH }};
        if (ih >= 0 && ih < {{ IHi }}) {
            let row = xb + u32(ih) * {{ u(in_s[2]) }};
{$ for t in range(SPAN) $}
            var v{{ t }} = 0.0;
            if (iw0 + {{ t }} >= 0 && iw0 + {{ t }} < {{ IWi }}) { v{{ t }} = x_at(row + u32(iw0 + {{ t }}) * {{ u(in_s[3]) }}, ic); }
{$ endfor $}
{$ for kw in range(KW) $}
            let f{{ kw }} = f32(w[wb + {{ kh * f_s[2] + kw * f_s[3] }}u]);
{$ for j in range(OWB) $}
            acc{{ j }} = fma(v{{ j * SW + kw * DW }}, f{{ kw }}, acc{{ j }});
{$ endfor $}
{$ endfor $}
        }
    }
{$ endfor $}
    let ob = n * {{ u(out_s[0]) }} + oc * {{ u(out_s[1]) }} + oh * {{ u(out_s[2]) }} + ow0 * {{ u(out_s[3]) }};
{$ if has_bias $}
    let bv = f32(bias[oc]);
{$ else $}
    let bv = 0.0;
{$ endif $}
{$ for j in range(OWB) $}
{$ if j == 0 $}
    out[ob] = act({{ ST }}(acc0 + bv), ob);
{$ else $}
    if (ow0 + {{ j }}u < {{ u(OW) }}) { out[ob + {{ u(j * out_s[3]) }}] = act({{ ST }}(acc{{ j }} + bv), ob + {{ u(j * out_s[3]) }}); }
{$ endif $}
{$ endfor $}
}
{$ elif path == "direct" $}
// Direct convolution for few output channels per group (the GEMM tiles would be mostly padding):
// one thread per output pixel and block of OCB output channels. Items are ordered (group, channel
// block, pixel), so the threads of a workgroup share the channel block and the filter loads are
// the same address in every thread; each input value loaded feeds OCB accumulators.
{$ if M is integer $}
const P = {{ M }}u;             // output pixels n * OH * OW
{$ endif $}
{$ set pp = "P" if M is integer else u(M) $}
const OCBN = {{ ocb_n }}u;      // channel blocks per group

{{ main_1d(total) }}
    let pix = {{ md("i", pp) }};
    let gb = {{ dv("i", pp) }};
    let g = gb / OCBN;
    let o0 = (gb % OCBN) * {{ OCB }}u;
    let n = {{ dv("pix", ohw) }};
    let p = {{ md("pix", ohw) }};
    let oh = {{ dv("p", u(OW)) }};
    let ow = {{ md("p", u(OW)) }};
    let xg = n * {{ u(in_s[0]) }} + g * {{ u(ICg * in_s[1]) }};
    let wg = g * {{ f_g }}u;
{$ for j in range(OCB) $}
    var acc{{ j }} = 0.0;
{$ endfor $}
{$ for j in range(OCB) $}
{$ if check_oc $}
    let wo{{ j }} = wg + min(o0 + {{ j }}u, {{ OCg - 1 }}u) * {{ f_s[0] }}u;
{$ else $}
    let wo{{ j }} = wg + (o0 + {{ j }}u) * {{ f_s[0] }}u;
{$ endif $}
{$ endfor $}
{# the channel loop of one tap; wk: the tap's offset in the filter #}
{$ macro taps(wk, pad) $}
{{ pad }}let xb = xg + ih * {{ u(in_s[2]) }} + iw * {{ u(in_s[3]) }};
{{ pad }}for (var ic = 0u; ic < {{ ICg }}u; ic = ic + 1u) {
{{ pad }}    let xv = x_at(xb + ic * {{ u(in_s[1]) }}, g * {{ ICg }}u + ic);
{{ pad }}    let wk = ic * {{ f_s[1] }}u + {{ wk }};
{$ for j in range(OCB) $}
{{ pad }}    acc{{ j }} = fma(xv, f32(w[wo{{ j }} + wk]), acc{{ j }});
{$ endfor $}
{{ pad }}}
{$ endmacro $}
{$ if stride_taps $}
    // Transposed and undilated: output row oh reads kernel rows kh = oh + PT (mod SH) only
    // (ih * SH = oh + PT - kh), so the loops visit those taps instead of testing all KH x KW
    // (a stride-2 2x2 kernel: one in four); on GPUs the threads of a row no longer diverge
    // between taps.
    let th0 = oh + {{ PT }}u;
    let tw0 = ow + {{ PL }}u;
    for (var kh = th0 % {{ SH }}u; kh < {{ KH }}u && kh <= th0; kh = kh + {{ SH }}u) {
        let ih = (th0 - kh) / {{ SH }}u;
        if (ih >= {{ u(IH) }}) { continue; }
        for (var kw = tw0 % {{ SW }}u; kw < {{ KW }}u && kw <= tw0; kw = kw + {{ SW }}u) {
            let iw = (tw0 - kw) / {{ SW }}u;
            if (iw >= {{ u(IW) }}) { continue; }
{{ taps("kh * %du + kw * %du" % (f_s[2], f_s[3]), "            ") }}
        }
    }
{$ else $}
    // The window's taps in loops, each tested: one copy of the channel loop. Unrolled into a
    // tested block per tap, the copies cost face_landmark's 3x3 stride-3 head (32 channels)
    // 0.23 s of Mesa's NIR passes at every start and 1.8 s of LLVM on a fresh machine, and
    // PP-OCR's 2x2 transposed head 70 ms and 1.2 s.
{# kernel row (a = "h") or column ("w") k{a} of output o{a}: input i{a}, or the next tap #}
{$ macro tap(a, P, S, D, I, Ii, pad) $}
{$ if transposed $}
{{ pad }}let t{{ a }} = i32(o{{ a }}) + {{ P }} - i32(k{{ a }} * {{ D }}u);
{{ pad }}let i{{ a }} = u32(t{{ a }}) / {{ S }}u;
{{ pad }}if (t{{ a }} < 0 || i{{ a }} * {{ S }}u != u32(t{{ a }}) || i{{ a }} >= {{ u(I) }}) { continue; }{$ else $}
{{ pad }}let t{{ a }} = i32(o{{ a }} * {{ S }}u + k{{ a }} * {{ D }}u) - {{ P }};
{{ pad }}if (t{{ a }} < 0 || t{{ a }} >= {{ Ii }}) { continue; }
{{ pad }}let i{{ a }} = u32(t{{ a }});{$ endif $}{$ endmacro $}
    for (var kh = 0u; kh < {{ KH }}u; kh = kh + 1u) {
{{ tap("h", PT, SH, DH, IH, IHi, "        ") }}
        for (var kw = 0u; kw < {{ KW }}u; kw = kw + 1u) {
{{ tap("w", PL, SW, DW, IW, IWi, "            ") }}
{{ taps("kh * %du + kw * %du" % (f_s[2], f_s[3]), "            ") }}
        }
    }
{$ endif $}
    let ob = n * {{ u(out_s[0]) }} + p * {{ u(out_s[3]) }};
{$ for j in range(OCB) $}
    {
        let oc = g * {{ OCg }}u + o0 + {{ j }}u;
{$ if check_oc $}
        if (o0 + {{ j }}u < {{ OCg }}u) {
{$ else $}
        {
{$ endif $}
            let oi = ob + oc * {{ u(out_s[1]) }};
{$ if has_bias $}
            out[oi] = act({{ ST }}(acc{{ j }} + f32(bias[oc])), oi);
{$ else $}
            out[oi] = act({{ ST }}(acc{{ j }}), oi);
{$ endif $}
        }
    }
{$ endfor $}
}
{$ else $}
{{ super() }}
{$ endif $}
{$ endblock $}
