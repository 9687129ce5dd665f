// Scans along one axis: arg_min / arg_max and cumulative_sum (see mltensor/ops/scan.py).
// A line is all elements that share the coordinates outside the axis: `len` elements `inner`
// apart, line i starting at (i / inner) * stride + i % inner. arg_* writes one element per line,
// in line order. cumsum of f16 values accumulates in f32: loads through LD (f32), stores through
// ST (f16_of).
// The "chunks" plan (no barriers):
//   arg, cumsum: one thread per line walks it (chunks false), or one thread per (line, chunk of
//     CT elements), chunk-major; arg with `part` writes each chunk's first best to pv/pk (the
//     output directly when the line has one chunk), cumsum with `part` starts from the chunk's
//     offset in sums;
//   sums: each chunk's sum -> sums;
//   arg_lines / sum_lines: one thread per line over its NCT chunk results, in order: the best,
//     or the chunk sums turned into exclusive offsets in place.
// The "tiles" plans: a workgroup of 256 threads takes LW adjacent lines (lanes) x R = 256 / LW
// rows; a thread takes E consecutive elements of its line, so a workgroup covers a chunk of
// CA = R * E elements of each of its lines; a line has NC chunks.
//   arg_chunk: each chunk's best (value, index) -> pv/pk, or the output when NC is 1;
//   arg_final: one workgroup per line combines its NC chunk results;
//   sum_chunk: each chunk's sum -> sums;
//   sum_scan: one workgroup per line turns its NC chunk sums into exclusive offsets, in place;
//   scan_chunk: each chunk scanned in workgroup memory from its offset (none when NC is 1).
// Loops stay far below llvmpipe's 65535 iterations an invocation (past them it silently ends
// every loop), and workgroup memory is written before it is read (lavapipe does not zero it).
{{ bindings }}
{$ include "common.wgsl" $}

{# lines, len, inner, stride (= len * inner) and last (= len - 1): WGSL u32 expressions, "12u" for
   static sizes, else read at dispatch (dims.*); CT, NCT and LW (lanes: a power of two <= 32)
   likewise. #}
{$ if mode in ("arg", "cumsum", "arg_lines", "sum_lines", "sums") $}
{$ if mode in ("arg_lines", "sum_lines") $}
{# one thread per line over its NCT chunk results, in order #}
{{ main_1d(lines) }}
    let NCT = {{ NCT }};
    let at0 = i * NCT;
  {$ if mode == "arg_lines" $}
    var best = pv[at0];
    var best_k = pk[at0];
    for (var c = 1u; c < NCT; c++) {
        let v = pv[at0 + c];
        // chunk results in index order, each its chunk's first best: the serial rule again
    {$ if VT == "f32" $}
        if (!is_nan_f32(best) && (is_nan_f32(v) || {{ better }})) { best = v; best_k = pk[at0 + c]; }
    {$ else $}
        if ({{ better }}) { best = v; best_k = pk[at0 + c]; }
    {$ endif $}
    }
    out[i] = {{ result }};
  {$ else $}
    var acc = {{ zero }};
    for (var c = 0u; c < NCT; c++) {
        let v = sums[at0 + c];
        sums[at0 + c] = acc;
        acc = {{ add }};
    }
  {$ endif $}
}
{$ else $}
{# one thread per line (chunks false), or per (line, chunk of CT elements), chunk-major: i =
   c * lines + line, so that neighbouring threads read neighbouring lines #}
{$ if chunks $}
{{ main_1d(lines ~ " * " ~ NCT) }}
    let CT = {{ CT }};
    let NCT = {{ NCT }};
    let line = i % {{ lines }};
    let c = i / {{ lines }};
    let j0 = c * CT;
    let j1 = min(j0 + CT, {{ len }});
{$ else $}
{{ main_1d(lines) }}
    let line = i;
    let j0 = 0u;
    let j1 = {{ len }};
{$ endif $}
    let base = (line / {{ inner }}) * {{ stride }} + line % {{ inner }};
{$ if mode == "arg" $}
    var best = x[base + j0 * {{ inner }}];
    var best_k = j0;
    for (var k = j0 + 1u; k < j1; k++) {
        let v = x[base + k * {{ inner }}];
  {$ if wtype in ("f32", "f16") $}
        // numpy semantics: the first NaN wins, otherwise strict compare keeps the first of ties
        // (f32() of an f16 keeps NaN; of an f32 it is the value itself)
        let v_nan = is_nan_f32(f32(v));
        let b_nan = is_nan_f32(f32(best));
        if (!b_nan && (v_nan || {{ better }})) { best = v; best_k = k; }
  {$ else $}
        if ({{ better }}) { best = v; best_k = k; }
  {$ endif $}
    }
  {$ if part $}
    if (NCT == 1u) {
        out[line] = {{ result }};
    } else {
        pv[line * NCT + c] = {{ VLD }}(best);
        pk[line * NCT + c] = best_k;
    }
  {$ else $}
    out[line] = {{ result }};
  {$ endif $}
{$ else $}
  {# cumsum (from the chunk's offset in sums when `part`), or sums: each chunk's sum #}
    var acc = {{ zero }};
  {$ if part $}
    if (NCT > 1u) { acc = sums[line * NCT + c]; }
  {$ endif $}
    for (var j = j0; j < j1; j++) {
  {$ if reversed $}
        let at = base + ({{ last }} - j) * {{ inner }};
  {$ else $}
        let at = base + j * {{ inner }};
  {$ endif $}
        let v = {{ LD }}(x[at]);
  {$ if mode == "sums" $}
        acc = {{ add }};
  {$ elif exclusive $}
        out[at] = {{ ST }}(acc);
        acc = {{ add }};
  {$ else $}
        acc = {{ add }};
        out[at] = {{ ST }}(acc);
  {$ endif $}
    }
  {$ if mode == "sums" $}
    sums[line * NCT + c] = acc;
  {$ endif $}
{$ endif $}
}
{$ endif $}
{$ else $}
const WG: u32 = 256u;
const EMAX: u32 = {{ EMAX }}u;  // elements a thread takes (fewer when a line has one chunk)
{$ if mode.startswith("arg") $}
const NONE: u32 = 0xffffffffu;  // no element (a thread past its line's end)
var<workgroup> sv: array<{{ VT }}, 256>;
var<workgroup> sk: array<u32, 256>;

fn better(v: {{ VT }}, best: {{ VT }}) -> bool { return {{ better }}; }

// Whether (av, ak) wins over (cv, ck), k the index along the axis: numpy's rule whatever the
// order of the comparisons: the first NaN wins, otherwise the better value, of equal values the
// first index (the serial kernel's result, for every grouping).
fn beats(av: {{ VT }}, ak: u32, cv: {{ VT }}, ck: u32) -> bool {
    if (ak == NONE) { return false; }
    if (ck == NONE) { return true; }
  {$ if VT == "f32" $}
    let an = is_nan_f32(av);
    let cn = is_nan_f32(cv);
    if (an || cn) { return an && (!cn || ak < ck); }
  {$ endif $}
    if (better(av, cv)) { return true; }
    if (better(cv, av)) { return false; }
    return ak < ck;
}

// The best of every thread's (v, k) within each lane (lid = row * lw + lane, r rows), valid in
// row 0. Uniform control flow only (barriers).
fn best_rows(lid: u32, lw: u32, r: u32, v: {{ VT }}, k: u32) {
    sv[lid] = v;
    sk[lid] = k;
    workgroupBarrier();
    for (var s = r >> 1u; s > 0u; s = s >> 1u) {
        if (lid < s * lw) {
            let o = lid + s * lw;
            let ov = sv[o];
            let ok = sk[o];
            if (beats(ov, ok, sv[lid], sk[lid])) { sv[lid] = ov; sk[lid] = ok; }
        }
        workgroupBarrier();
    }
}
{$ else $}
var<workgroup> sv: array<{{ T }}, 256>;

fn add(a: {{ T }}, b: {{ T }}) -> {{ T }} { return {{ add }}; }

// Exclusive prefix sum, along the rows of each lane (lid = row * lw + lane, r rows), of every
// thread's v. Uniform control flow only (barriers).
fn scan_rows(lid: u32, lw: u32, r: u32, v: {{ T }}) -> {{ T }} {
    sv[lid] = v;
    workgroupBarrier();
    for (var d = 1u; d < r; d = d << 1u) {  // Hillis-Steele: log2(r) steps
        var s = sv[lid];
        if (lid >= d * lw) { s = add(sv[lid - d * lw], s); }
        workgroupBarrier();
        sv[lid] = s;
        workgroupBarrier();
    }
    var e = {{ zero }};
    if (lid >= lw) { e = sv[lid - lw]; }
    workgroupBarrier();
    return e;
}

// The sum of every thread's v within each lane, valid in row 0. Uniform control flow only.
fn sum_rows(lid: u32, lw: u32, r: u32, v: {{ T }}) -> {{ T }} {
    sv[lid] = v;
    workgroupBarrier();
    for (var s = r >> 1u; s > 0u; s = s >> 1u) {
        if (lid < s * lw) { sv[lid] = add(sv[lid], sv[lid + s * lw]); }
        workgroupBarrier();
    }
    return sv[lid];
}
{$ endif $}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let N = {{ len }};
    let LINES = {{ lines }};
    let INNER = {{ inner }};
    let STRIDE = {{ stride }};
    let LW = {{ LW }};
    let R = WG / LW;
    let E = min(EMAX, (N + R - 1u) / R);
    let CA = R * E;
    let NC = (N + CA - 1u) / CA;
{$ if mode in ("arg_final", "sum_scan") $}
    // one workgroup per line; thread lid takes its P consecutive chunk results
    if (g >= LINES) { return; }
    let P = (NC + WG - 1u) / WG;
    let c0 = min(lid * P, NC);
    let c1 = min(c0 + P, NC);
    let at0 = g * NC;
  {$ if mode == "arg_final" $}
    var bv = {{ vzero }};
    var bk = NONE;
    for (var c = c0; c < c1; c++) {
        let v = pv[at0 + c];
        let k = pk[at0 + c];
        if (beats(v, k, bv, bk)) { bv = v; bk = k; }
    }
    best_rows(lid, 1u, WG, bv, bk);
    if (lid == 0u) {
        let best_k = sk[0];
        out[g] = {{ result }};
    }
  {$ else $}
    var tot = {{ zero }};
    for (var c = c0; c < c1; c++) { tot = add(tot, sums[at0 + c]); }
    var acc = scan_rows(lid, 1u, WG, tot);
    for (var c = c0; c < c1; c++) {
        let s = sums[at0 + c];
        sums[at0 + c] = acc;
        acc = add(acc, s);
    }
  {$ endif $}
{$ else $}
    // workgroup (line group, chunk c); thread (lane, row): line `line`, elements j0 .. j0 + E - 1
    // of the chunk in scan order (reversed: from the line's end)
    let G = (LINES + LW - 1u) / LW;
    if (g >= G * NC) { return; }
    let lane = lid % LW;
    let row = lid / LW;
    let c = g % NC;
    let line = (g / NC) * LW + lane;
    let ok = line < LINES;
    let base = (line / INNER) * STRIDE + line % INNER;
    let j0 = c * CA + row * E;
    let j1 = select(j0, min(j0 + E, N), ok && j0 < N);  // threads past the end take nothing
  {$ if mode == "arg_chunk" $}
    var bv = {{ vzero }};  // (any value: bk NONE loses to every element)
    var bk = NONE;
    for (var j = j0; j < j1; j++) {
        let v = {{ VLD }}(x[base + j * INNER]);
        if (beats(v, j, bv, bk)) { bv = v; bk = j; }
    }
    best_rows(lid, LW, R, bv, bk);
    if (row == 0u && ok) {
    {$ if direct and part $}
        if (NC == 1u) {
            let best_k = sk[lid];
            out[line] = {{ result }};
        } else {
            pv[line * NC + c] = sv[lid];
            pk[line * NC + c] = sk[lid];
        }
    {$ elif direct $}
        let best_k = sk[lid];
        out[line] = {{ result }};
    {$ else $}
        pv[line * NC + c] = sv[lid];
        pk[line * NC + c] = sk[lid];
    {$ endif $}
    }
  {$ else $}
    {$ if reversed $}
    let top = N - 1u;  // scan position j is element top - j of the line
    {$ endif $}
    var tot = {{ zero }};
    for (var j = j0; j < j1; j++) {
    {$ if reversed $}
        tot = add(tot, {{ LD }}(x[base + (top - j) * INNER]));
    {$ else $}
        tot = add(tot, {{ LD }}(x[base + j * INNER]));
    {$ endif $}
    }
    {$ if mode == "sum_chunk" $}
    let s = sum_rows(lid, LW, R, tot);
    if (row == 0u && ok) { sums[line * NC + c] = s; }
    {$ else $}
    var acc = scan_rows(lid, LW, R, tot);
      {$ if part $}
    if (NC > 1u && ok) { acc = add(sums[line * NC + c], acc); }
      {$ endif $}
    for (var j = j0; j < j1; j++) {
      {$ if reversed $}
        let at = base + (top - j) * INNER;
      {$ else $}
        let at = base + j * INNER;
      {$ endif $}
        let v = {{ LD }}(x[at]);
      {$ if exclusive $}
        out[at] = {{ ST }}(acc);
        acc = add(acc, v);
      {$ else $}
        acc = add(acc, v);
        out[at] = {{ ST }}(acc);
      {$ endif $}
    }
    {$ endif $}
  {$ endif $}
{$ endif $}
}
{$ endif $}
