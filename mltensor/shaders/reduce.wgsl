// Reductions (M outputs x K reduced elements each) and softmax; see mltensor/ops/reduce.py.
// Input element k of output o is src[base(o) + off(k)] (strides baked in by Python).
// mode: thread (one thread per output), group (one workgroup per output + shared-memory tree),
// partial/final (two levels for huge K), softmax_thread / softmax_group (one row per thread/group),
// partial + softmax_norm (softmax of long rows: each chunk's (max, sum of exp), then per chunk).
// T is the accumulation type: the compute type, but f32 for f16 values, which are loaded through
// LD (f32) and stored through ST (f16_of); both are empty for every other type.
{{ bindings }}
{$ include "common.wgsl" $}

{# Sizes M, K, S, CHUNK are WGSL u32 expressions: "12u" for a static size, a module constant as
   always; an expression over `dims.*` (dynamic/kernels.py) for a size known only at dispatch,
   then a `let` of the same name at the top of main (sizes()).
   Dynamic kernels only: THR, a u32 expression that is 1 where a static kernel at these sizes would
   be a "thread" kernel, adds that path to a group-shaped kernel (WG outputs per workgroup, one per
   thread, running the thread kernel's loop), so each size gets the static kernel's arithmetic;
   `direct` (a partial pass whose S may be 1) stores the result itself when S is 1 (then exactly
   the group kernel's), and the final pass has nothing to do (its M is 0 then). #}
{$ if "dims." not in M $}
const M: u32 = {{ M }};
{$ endif $}
{$ if "dims." not in K $}
const K: u32 = {{ K }};
{$ endif $}
const WG: u32 = {{ WG }}u;
{$ if "dims." not in S $}
const S: u32 = {{ S }};          // partial/final: partials per output
{$ endif $}
{$ if "dims." not in CHUNK $}
const CHUNK: u32 = {{ CHUNK }};  // partial: reduced elements per partial
{$ endif $}
{$ macro sizes() $}
{$ for name, v in (("M", M), ("K", K), ("S", S), ("CHUNK", CHUNK)) if "dims." in v $}
    let {{ name }} = {{ v }};
{$ endfor $}
{$ endmacro $}

fn base(o: u32) -> u32 { return {{ base }}; }
fn off(k: u32) -> u32 { return {{ off }}; }
fn pre(x: {{ T }}) -> {{ T }} { return {{ pre }}; }
fn comb(a: {{ T }}, b: {{ T }}) -> {{ T }} { return {{ comb }}; }
fn post(a: {{ T }}) -> {{ T }} { return {{ post }}; }

// exp(x - m) that is 0 for x = -inf even when m = -inf too (all-(-inf) rows stay finite).
// Bit tests, not `x == -inf`: WGSL lets compilers assume no infinities in float comparisons.
fn ex(x: f32, m: f32) -> f32 { return select(exp(x - m), 0.0, bitcast<u32>(x) == 0xff800000u); }

// log-sum-exp from the row max m and sum(exp(x - m)): +inf when m is +inf (inf - inf would be NaN).
fn lse(s: f32, m: f32) -> f32 { return select(log(s) + m, m, bitcast<u32>(m) == 0x7f800000u); }

{$ macro thread_body() $}
    let b = base(o);
  {$ if lse or mode.startswith("softmax") $}
    var m = {{ NEG_INF }};
    for (var k = 0u; k < K; k++) { m = max(m, {{ LD }}(src[b + off(k)])); }
    var s = 0.0;
    for (var k = 0u; k < K; k++) { s += ex({{ LD }}(src[b + off(k)]), m); }
    {$ if lse $}
    dst[o] = {{ ST }}(lse(s, m));
    {$ else $}
    for (var k = 0u; k < K; k++) { let i = b + off(k); dst[i] = {{ ST }}(ex({{ LD }}(src[i]), m) / s); }
    {$ endif $}
  {$ else $}
    var a = {{ init }};
    for (var k = 0u; k < K; k++) { a = comb(a, pre({{ LD }}(src[b + off(k)]))); }
    dst[o] = {{ ST }}(post(a));
  {$ endif $}
{$ endmacro $}
{$ if mode in ("group", "partial", "final", "softmax_group", "softmax_norm") $}
var<workgroup> sh: array<{{ T }}, WG>;

{$ macro tree(fname, expr) $}
// Combine every thread's v into one value returned to all threads. Call from uniform control
// flow only (barriers); the trailing barrier lets the next tree reuse `sh`.
fn {{ fname }}(lid: u32, v: {{ T }}) -> {{ T }} {
    sh[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { let a = sh[lid]; let b = sh[lid + s]; sh[lid] = {{ expr }}; }
        workgroupBarrier();
    }
    let r = sh[0];
    workgroupBarrier();
    return r;
}
{$ endmacro $}
{$ if lse or mode.startswith("softmax") $}
{{ tree("tree_max", "max(a, b)") }}
{{ tree("tree_sum", "a + b") }}
{$ if mode in ("final", "softmax_norm") $}

// A long row's n (max, sum of exp(x - max)) chunk pairs from part (row r's at 2 (r n + j))
// combined into the row's (max, sum of exp(x - max)), returned to all threads (uniform flow).
// (n: S, a constant or a size read at dispatch in main.)
fn combine_pairs(lid: u32, r: u32, n: u32) -> vec2<f32> {
    var m = {{ NEG_INF }};
    for (var j = lid; j < n; j += WG) { m = max(m, part[2u * (r * n + j)]); }
    m = tree_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < n; j += WG) {
        let i = 2u * (r * n + j);
        s += part[i + 1u] * ex(part[i], m);
    }
    return vec2<f32>(m, tree_sum(lid, s));
}
{$ endif $}
{$ else $}
{{ tree("tree", "comb(a, b)") }}
{$ endif $}
{$ endif $}

{$ if mode in ("thread", "softmax_thread") $}
{{ main_1d(M if "dims." in M else "M", "o") }}
{$ if "dims." in M ~ K ~ S ~ CHUNK $}{{ sizes() }}{$ endif $}
{{ thread_body() }}}
{$ else $}
@compute @workgroup_size({{ WG }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
{$ if "dims." in M ~ K ~ S ~ CHUNK $}{{ sizes() }}{$ endif $}
  {$ if THR $}
    if ({{ THR }} != 0u) {  // the thread kernel's path: one output per thread
        let o = g * WG + lid;
        if (o < M) {
{{ thread_body() }}
        }
        return;
    }
  {$ endif $}
  {$ if mode in ("partial", "softmax_norm") $}
    if (g >= M * S) { return; }
    let b = base(g / S);
    let k0 = (g % S) * CHUNK;
    let k1 = min(K, k0 + CHUNK);
  {$ else $}
    if (g >= M) { return; }
    let b = base(g);
  {$ endif $}
  {$ if mode == "final" $}
    // combine the S partials of output g
    {$ if lse $}
    let ms = combine_pairs(lid, g, S);
    if (lid == 0u) { dst[g] = {{ ST }}(lse(ms.y, ms.x)); }
    {$ else $}
    var a = {{ init }};
    for (var j = lid; j < S; j += WG) { a = comb(a, part[g * S + j]); }
    a = tree(lid, a);
    if (lid == 0u) { dst[g] = {{ ST }}(post(a)); }
    {$ endif $}
  {$ elif mode == "softmax_norm" $}
    // softmax of a long row, chunk g % S: the row's S (max, sum of exp(x - max)) pairs combined
    // (as the final pass of reduce_log_sum_exp does), then the chunk normalized
    let ms = combine_pairs(lid, g / S, S);
    for (var k = k0 + lid; k < k1; k += WG) { let i = b + off(k); dst[i] = {{ ST }}(ex({{ LD }}(src[i]), ms.x) / ms.y); }
  {$ else $}
    {$ if mode != "partial" $}
    let k0 = 0u;
    let k1 = K;
    {$ endif $}
    {$ if lse or mode == "softmax_group" $}
    var m = {{ NEG_INF }};
    for (var k = k0 + lid; k < k1; k += WG) { m = max(m, {{ LD }}(src[b + off(k)])); }
    m = tree_max(lid, m);
    var s = 0.0;
    for (var k = k0 + lid; k < k1; k += WG) { s += ex({{ LD }}(src[b + off(k)]), m); }
    s = tree_sum(lid, s);
      {$ if mode == "softmax_group" $}
    for (var k = lid; k < K; k += WG) { let i = b + off(k); dst[i] = {{ ST }}(ex({{ LD }}(src[i]), m) / s); }
      {$ elif mode == "partial" and direct $}
    if (lid == 0u) {
        if (S == 1u) { dst[g] = {{ ST }}(lse(s, m)); } else { part[2u * g] = m; part[2u * g + 1u] = s; }
    }
      {$ elif mode == "partial" $}
    if (lid == 0u) { part[2u * g] = m; part[2u * g + 1u] = s; }
      {$ else $}
    if (lid == 0u) { dst[g] = {{ ST }}(lse(s, m)); }
      {$ endif $}
    {$ else $}
    var a = {{ init }};
    for (var k = k0 + lid; k < k1; k += WG) { a = comb(a, pre({{ LD }}(src[b + off(k)]))); }
    a = tree(lid, a);
      {$ if mode == "partial" and direct $}
    if (lid == 0u) {
        if (S == 1u) { dst[g] = {{ ST }}(post(a)); } else { part[g] = a; }
    }
      {$ elif mode == "partial" $}
    if (lid == 0u) { part[g] = a; }
      {$ else $}
    if (lid == 0u) { dst[g] = {{ ST }}(post(a)); }
      {$ endif $}
    {$ endif $}
  {$ endif $}
}
{$ endif $}
