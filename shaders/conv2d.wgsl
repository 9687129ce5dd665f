{# conv2d / conv_transpose2d. Extends the GEMM of matmul.wgsl: #}
{# - implicit GEMM ("tiled"/"gemv"): per group g, A = im2col(input) (rows m = output pixels     #}
{#   n*OH*OW, columns k = (kh, kw, ic) or (ic, kh, kw)), B = filter (k x output channel of g).   #}
{#   im2col is never materialized: load_a computes the input coordinate of (m, k) on the fly.    #}
{# - "dw": depthwise (one input channel per group), one thread per output element.              #}
{# Layouts are handled by baked strides: tensor (n, c, h, w) lives at n*sn + c*sc + h*sh + w*sw, #}
{# filter (o, i, kh, kw) at o*fo + i*fi + kh*fh + kw*fw, whatever the layout string.            #}
{$ extends "matmul.wgsl" $}

{$ block loaders $}
const OHW = {{ OH * OW }}u;

fn in_at(n: u32, c: u32, h: u32, w: u32) -> f32 {
    return x[n * {{ in_s[0] }}u + c * {{ in_s[1] }}u + h * {{ in_s[2] }}u + w * {{ in_s[3] }}u];
}

{$ if pointwise $}
// 1x1, stride 1, no padding: A is the input itself (pixels x channels).
fn load_a(g: u32, m: u32, k: u32) -> f32 {
    if (m >= M || k >= K) { return 0.0; }
{$ if in_s[1] == 1 and groups == 1 $}
    return x[m * {{ IC }}u + k];
{$ else $}
    let n = m / OHW;
    let p = m % OHW;
    return x[n * {{ in_s[0] }}u + (g * {{ ICg }}u + k) * {{ in_s[1] }}u + p * {{ in_s[3] }}u];
{$ endif $}
}
{$ else $}
fn load_a(g: u32, m: u32, k: u32) -> f32 {
    if (m >= M || k >= K) { return 0.0; }
    let n = m / OHW;
    let p = m % OHW;
    let oh = p / {{ OW }}u;
    let ow = p % {{ OW }}u;
{$ if ic_inner $}
    let ic = k % {{ ICg }}u;
    let kw = (k / {{ ICg }}u) % {{ KW }}u;
    let kh = k / {{ ICg * KW }}u;
{$ else $}
    let kw = k % {{ KW }}u;
    let kh = (k / {{ KW }}u) % {{ KH }}u;
    let ic = k / {{ KH * KW }}u;
{$ endif $}
{$ if transposed $}
    // output row oh gathers input row ih where oh = ih * SH - PT + kh * DH
    let th = i32(oh) + {{ PT }} - i32(kh * {{ DH }}u);
    let tw = i32(ow) + {{ PL }} - i32(kw * {{ DW }}u);
    if (th < 0 || tw < 0) { return 0.0; }
    let ih = u32(th) / {{ SH }}u;
    let iw = u32(tw) / {{ SW }}u;
    if (ih * {{ SH }}u != u32(th) || iw * {{ SW }}u != u32(tw) || ih >= {{ IH }}u || iw >= {{ IW }}u) {
        return 0.0;
    }
{$ else $}
    let th = i32(oh * {{ SH }}u + kh * {{ DH }}u) - {{ PT }};
    let tw = i32(ow * {{ SW }}u + kw * {{ DW }}u) - {{ PL }};
    if (th < 0 || tw < 0 || th >= {{ IH }} || tw >= {{ IW }}) { return 0.0; }
    let ih = u32(th);
    let iw = u32(tw);
{$ endif $}
    return in_at(n, g * {{ ICg }}u + ic, ih, iw);
}
{$ endif $}

fn load_b(g: u32, k: u32, o: u32) -> f32 {
    if (k >= K || o >= N) { return 0.0; }
{$ if pointwise $}
    let ic = k;
    let kh = 0u;
    let kw = 0u;
{$ elif ic_inner $}
    let ic = k % {{ ICg }}u;
    let kw = (k / {{ ICg }}u) % {{ KW }}u;
    let kh = k / {{ ICg * KW }}u;
{$ else $}
    let kw = k % {{ KW }}u;
    let kh = (k / {{ KW }}u) % {{ KH }}u;
    let ic = k / {{ KH * KW }}u;
{$ endif $}
    // f_g: offset of group g's filter slice (along o for conv2d, along i for the transpose)
    return w[g * {{ f_g }}u + o * {{ f_s[0] }}u + ic * {{ f_s[1] }}u + kh * {{ f_s[2] }}u + kw * {{ f_s[3] }}u];
}

fn store(g: u32, m: u32, o: u32, acc: f32) {
    if (m >= M || o >= N) { return; }
    let n = m / OHW;
    let p = m % OHW;
    let oc = g * {{ OCg }}u + o;
{$ if has_bias $}
    let v = acc + bias[oc];
{$ else $}
    let v = acc;
{$ endif $}
    out[n * {{ out_s[0] }}u + oc * {{ out_s[1] }}u + p * {{ out_s[3] }}u] = act(v);
}
{$ endblock $}

{$ block kernels $}
{$ if path == "dw" $}
// Depthwise: output channel oc reads input channel oc / MULT only. One thread per output,
// index decomposed in the output's own layout so consecutive threads write consecutive words.
@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_id(wid, nwg, li);
    if (i >= {{ total }}u) { return; }
{$ if out_s[1] == 1 $}
    let oc = i % {{ OC }}u;
    let p = i / {{ OC }}u;
    let ow = p % {{ OW }}u;
    let oh = (p / {{ OW }}u) % {{ OH }}u;
    let n = p / OHW;
{$ else $}
    let ow = i % {{ OW }}u;
    let oh = (i / {{ OW }}u) % {{ OH }}u;
    let oc = (i / OHW) % {{ OC }}u;
    let n = i / {{ OC * OH * OW }}u;
{$ endif $}
    let ic = oc / {{ MULT }}u;
    let ih0 = i32(oh * {{ SH }}u) - {{ PT }};
    let iw0 = i32(ow * {{ SW }}u) - {{ PL }};
    let xb = n * {{ in_s[0] }}u + ic * {{ in_s[1] }}u;
    let wb = oc * {{ f_s[0] }}u;
    var acc = 0.0;
    for (var kh = 0u; kh < {{ KH }}u; kh = kh + 1u) {
        let ih = ih0 + i32(kh * {{ DH }}u);
        if (ih < 0 || ih >= {{ IH }}) { continue; }
        for (var kw = 0u; kw < {{ KW }}u; kw = kw + 1u) {
            let iw = iw0 + i32(kw * {{ DW }}u);
            if (iw < 0 || iw >= {{ IW }}) { continue; }
            acc = fma(x[xb + u32(ih) * {{ in_s[2] }}u + u32(iw) * {{ in_s[3] }}u],
                      w[wb + kh * {{ f_s[2] }}u + kw * {{ f_s[3] }}u], acc);
        }
    }
{$ if has_bias $}
    acc = acc + bias[oc];
{$ endif $}
    out[i] = act(acc);
}
{$ else $}
{{ super() }}
{$ endif $}
{$ endblock $}
