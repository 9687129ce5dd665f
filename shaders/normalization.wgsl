// Normalizations; see mltensor/ops/normalization.py.
// batch: one thread per element, y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c].
// norm_thread / norm_group: group o (one thread / one workgroup each) has K elements,
// element k at src[base(o) + off(k)] with scale/bias index pbase(o) + poff(k); mean and variance
// are two passes over the group (subtracting the mean first keeps the variance accurate).
// rms (RMS normalization, _rms_normalization): no mean, one pass for the mean of the squares,
// y = x * (1 / sqrt(mean(x^2) + eps)) * scale, as the exported chain computes it.
// norm_*: the group's elements are read through x_at(i): src[i], or, where the normalization
// reads through the elementwise step producing its input (compiler/passes.py fuse_norm_sources:
// a residual or embedding sum), that step's expression at i (its inputs bound as s0, s1, ...);
// `xout`: that sum is also a graph value, written once (binding xs) in the last pass.
// Bindings are of the value's compute type (f32 or f16); loads widen to f32 (a no-op for f32),
// sums and the normalization are f32, stores round back with ST (f16_of for f16, else nothing).
{{ bindings }}
{$ include "common.wgsl" $}
{{ act }}

// (bitcast is not a WGSL const-expression in naga, hence a function)
fn eps() -> f32 { return {{ eps }}; }
{# Sizes (M, K, N) are WGSL u32 expressions: "12u" static (module constants), else over `dims.*`,
   read at dispatch (`let`s at the top of main). THR (dynamic group kernels only): a u32 expression,
   1 where a static kernel at these sizes would be norm_thread; it then takes that kernel's path,
   one group per thread, so each size gets the static kernel's arithmetic. #}
{$ if "dims." not in M $}
const M: u32 = {{ M }};
{$ endif $}
{$ if "dims." not in K $}
const K: u32 = {{ K }};
{$ endif $}
const WG: u32 = {{ WG }}u;
{$ macro sizes() $}
{$ for name, v in (("M", M), ("K", K)) if "dims." in v $}
    let {{ name }} = {{ v }};
{$ endfor $}
{$ endmacro $}

{{ xfn }}

fn base(o: u32) -> u32 { return {{ base }}; }
fn off(k: u32) -> u32 { return {{ off }}; }
fn pidx(o: u32, k: u32) -> u32 { return {{ pbase }} + {{ poff }}; }

// scale and shift of one normalized value, with parameter index p
fn affine(y: f32, p: u32) -> f32 {
    var r = y;
{$ if scale $}
    r = r * f32(p_scale[p]);
{$ endif $}
{$ if bias $}
    r = r + f32(p_bias[p]);
{$ endif $}
    return r;
}

{$ macro thread_body() $}
    let b = base(o);
{$ if rms $}
    var v = 0.0;
    for (var k = 0u; k < K; k++) { let x = f32(x_at(b + off(k))); v += x * x; }
    let r = 1.0 / sqrt(v / f32(K) + eps());
{$ else $}
    var s = 0.0;
    for (var k = 0u; k < K; k++) { s += f32(x_at(b + off(k))); }
    let mean = s / f32(K);
    var v = 0.0;
    for (var k = 0u; k < K; k++) { let d = f32(x_at(b + off(k))) - mean; v += d * d; }
    let den = sqrt(v / f32(K) + eps());
{$ endif $}
    for (var k = 0u; k < K; k++) {
        let i = b + off(k);
{$ if xout $}
        xs[i] = x_at(i);
{$ endif $}
        dst[i] = act({{ ST }}(affine({{ normed }}, pidx(o, k))), i);
    }
{$ endmacro $}
{$ if mode == "batch" $}
{{ main_1d(N) }}
    let c = {{ cidx }};
    dst[i] = act({{ ST }}(affine((f32(src[i]) - f32(p_mean[c])) / sqrt(f32(p_var[c]) + eps()), c)), i);
}
{$ elif mode == "norm_thread" $}
{{ main_1d(M if "dims." in M else "M", "o") }}
{$ if "dims." in M ~ K $}{{ sizes() }}{$ endif $}
{{ thread_body() }}}
{$ else $}
var<workgroup> sh: array<f32, WG>;

// Sum of every thread's v, returned to all threads (uniform control flow only: barriers).
fn tree_sum(lid: u32, v: f32) -> f32 {
    sh[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { sh[lid] = sh[lid] + sh[lid + s]; }
        workgroupBarrier();
    }
    let r = sh[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
{$ if "dims." in M ~ K $}{{ sizes() }}{$ endif $}
  {$ if THR $}
    if ({{ THR }} != 0u) {  // the thread kernel's path: one group per thread
        let o = (wid.y * nwg.x + wid.x) * WG + lid;
        if (o < M) {
{{ thread_body() }}
        }
        return;
    }
  {$ endif $}
    let o = wid.y * nwg.x + wid.x;
    if (o >= M) { return; }
    let b = base(o);
{$ if rms $}
    var v = 0.0;
    for (var k = lid; k < K; k += WG) { let x = f32(x_at(b + off(k))); v += x * x; }
    let r = 1.0 / sqrt(tree_sum(lid, v) / f32(K) + eps());
{$ else $}
    var s = 0.0;
    for (var k = lid; k < K; k += WG) { s += f32(x_at(b + off(k))); }
    let mean = tree_sum(lid, s) / f32(K);
    var v = 0.0;
    for (var k = lid; k < K; k += WG) { let d = f32(x_at(b + off(k))) - mean; v += d * d; }
    let den = sqrt(tree_sum(lid, v) / f32(K) + eps());
{$ endif $}
    for (var k = lid; k < K; k += WG) {
        let i = b + off(k);
{$ if xout $}
        xs[i] = x_at(i);
{$ endif $}
        dst[i] = act({{ ST }}(affine({{ normed }}, pidx(o, k))), i);
    }
}
{$ endif $}
