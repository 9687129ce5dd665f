// Normalizations; see mltensor/ops/normalization.py.
// batch: one thread per element, y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c].
// norm_thread / norm_group: group o (one thread / one workgroup each) has K elements,
// element k at src[base(o) + off(k)] with scale/bias index pbase(o) + poff(k); mean and variance
// are two passes over the group (subtracting the mean first keeps the variance accurate).
// norm_stats / norm_apply (groups longer than normalization.SPLIT_K*): workgroup (o, c) takes
// chunk c of CHUNK elements of group o; stats writes the chunk's (mean, sum of squared deviations)
// to `part`, apply combines the group's S pairs (Chan et al.) and normalizes its chunk. One
// workgroup per group would loop past llvmpipe's cap (runtime/wgsl.py LOOP_BUDGET) for ~1.3M.
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
{$ if S is defined and "dims." not in S $}
const S: u32 = {{ S }};
{$ endif $}
{$ if CHUNK is defined and "dims." not in CHUNK $}
const CHUNK: u32 = {{ CHUNK }};
{$ endif $}
const WG: u32 = {{ WG }}u;
{$ macro sizes() $}
{$ for name, v in (("M", M), ("K", K), ("S", S), ("CHUNK", CHUNK)) if v is defined and "dims." in v $}
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

{$ macro apply(k_from, k_to, lane="lid", step="WG") $}
    // elements [k_from, k_to) of group o normalized (the residual sum kept too where it is a
    // value), each thread from k_from + lane in steps of `step` (one thread per group: 0u, 1u)
    for (var k = {{ k_from }} + {{ lane }}; k < {{ k_to }}; k += {{ step }}) {
        let i = b + off(k);
{$ if xout $}
        xs[i] = x_at(i);
{$ endif $}
        dst[i] = act({{ ST }}(affine({{ normed }}, pidx(o, k))), i);
    }
{$ endmacro $}

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
{{ apply("0u", "K", "0u", "1u") }}{$ endmacro $}
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
{$ if mode in ("norm_stats", "norm_apply") $}
    // split path: workgroup g takes chunk c of group o, elements [k0, k1)
    let g = wid.y * nwg.x + wid.x;
    if (g >= M * S) { return; }
    let o = g / S;
    let c = g % S;
    let b = base(o);
    let k0 = c * CHUNK;
    let k1 = min(k0 + CHUNK, K);
{$ if mode == "norm_stats" $}
    // (mean, sum of squared deviations from it) of the chunk; rms: (sum of squares, 0)
{$ if rms $}
    var v = 0.0;
    for (var k = k0 + lid; k < k1; k += WG) { let x = f32(x_at(b + off(k))); v += x * x; }
    let sq = tree_sum(lid, v);
    if (lid == 0u) { part[2u * g] = sq; part[2u * g + 1u] = 0.0; }
{$ else $}
    let n = f32(k1 - k0);
    var s = 0.0;
    for (var k = k0 + lid; k < k1; k += WG) { s += f32(x_at(b + off(k))); }
    let cm = tree_sum(lid, s) / n;
    var v = 0.0;
    for (var k = k0 + lid; k < k1; k += WG) { let d = f32(x_at(b + off(k))) - cm; v += d * d; }
    let m2 = tree_sum(lid, v);
    if (lid == 0u) { part[2u * g] = cm; part[2u * g + 1u] = m2; }
{$ endif $}
{$ else $}
    // the group's statistics from its S chunks' pairs (the same order in every chunk's workgroup)
    let p0 = o * S;
{$ if rms $}
    var v = 0.0;
    for (var j = lid; j < S; j += WG) { v += part[2u * (p0 + j)]; }
    let r = 1.0 / sqrt(tree_sum(lid, v) / f32(K) + eps());
{$ else $}
    // mean = sum(n_j m_j) / K; M2 = sum(M2_j + n_j (m_j - mean)^2) (Chan et al.)
    var s = 0.0;
    for (var j = lid; j < S; j += WG) { s += f32(min(CHUNK, K - j * CHUNK)) * part[2u * (p0 + j)]; }
    let mean = tree_sum(lid, s) / f32(K);
    var v = 0.0;
    for (var j = lid; j < S; j += WG) {
        let d = part[2u * (p0 + j)] - mean;
        v += part[2u * (p0 + j) + 1u] + f32(min(CHUNK, K - j * CHUNK)) * d * d;
    }
    let den = sqrt(tree_sum(lid, v) / f32(K) + eps());
{$ endif $}
{{ apply("k0", "k1") }}
{$ endif $}
}
{$ else $}
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
{{ apply("0u", "K") }}
}
{$ endif $}
{$ endif $}
