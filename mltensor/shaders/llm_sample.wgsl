// Next-token sampling over one row of logits (mltensor/llm/sampling.py), one workgroup of WG
// threads; only the chosen id is written (out[0], i32).
//   greedy (TEMP_INV == 0): the first index of the maximum, as numpy's argmax.
//   else: weights w_i = exp((l_i - max) * TEMP_INV); kept tokens: those whose logit is at least the
//   TOP_K-th largest (ties at that value are all kept) and, among those, the smallest set of the
//   largest weights whose mass reaches TOP_P of the kept mass; then token i is drawn with
//   probability w_i / (mass of the kept set) by inverse transform of u = rnd[0] in [0, 1): the
//   first kept index (in vocabulary order) at which the running mass exceeds u * mass.
// Thresholds are found by bisection on the bits of an order-preserving u32 key of the logits
// (key(a) < key(b) iff a < b), 32 counting / summing passes each; no sort, no atomics.
// Every barrier is reached by all threads: the loops around them have constant trip counts and
// the values read back from workgroup memory only select data, never control flow.
{{ bindings }}
{$ include "common.wgsl" $}

const V = {{ V }}u;
const WG = {{ WG }}u;
const CH = {{ CH }}u;  // logits a thread owns in the draw (contiguous: V <= WG * CH)

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> pick: array<u32, 2>;
var<workgroup> target_mass: array<f32, 1>;

fn key_of(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    // negative floats: flip every bit (larger magnitude, smaller key); positive: set the sign bit
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn reduce_u() {  // red_u[0] = sum of red_u (counts: below 2^32 as V is)
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        // lid is read through a private copy set by main
        if (tid < s) { red_u[tid] = red_u[tid] + red_u[tid + s]; }
    }
    workgroupBarrier();
}

fn reduce_f() {  // red_f[0] = sum of red_f
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (tid < s) { red_f[tid] = red_f[tid] + red_f[tid + s]; }
    }
    workgroupBarrier();
}

var<private> tid: u32;


{$ if top_p < 1.0 $}
// the workgroup's sum of the weights of the tokens whose key is >= th (every thread calls it:
// it reduces through workgroup memory, so it must be reached in uniform control flow)
fn kept_mass(th: u32, mx: f32, lid: u32) -> f32 {
    var m = 0.0;
    for (var i = lid; i < V; i = i + WG) {
        let x = logits[i];
        m = m + select(0.0, exp((x - mx) * {{ TEMP_INV }}), key_of(x) >= th);
    }
    red_f[lid] = m;
    reduce_f();
    return red_f[0];
}
{$ endif $}

@compute @workgroup_size({{ WG }})
fn main(@builtin(local_invocation_index) lid: u32) {
    tid = lid;
    // 1. maximum and its first index
    var best = 0.0;  // unread until best_i is set
    var best_i = V;
    for (var i = lid; i < V; i = i + WG) {
        let x = logits[i];
        if (best_i == V || x > best) { best = x; best_i = i; }
    }
    red_f[lid] = best;
    red_u[lid] = best_i;
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (lid < s) {
            let ob = red_f[lid + s];
            let oi = red_u[lid + s];
            let take = oi < V && (red_u[lid] == V || ob > red_f[lid] || (ob == red_f[lid] && oi < red_u[lid]));
            if (take) { red_f[lid] = ob; red_u[lid] = oi; }
        }
    }
    workgroupBarrier();
{$ if greedy $}
    if (lid == 0u) { out[0] = i32(red_u[0]); }
}
{$ else $}
    let mx = red_f[0];
    workgroupBarrier();

    // 2. top-k: the largest key t with at least TOP_K logits whose key is >= t (the key of the
    // TOP_K-th largest logit)
    var tk = 0u;
{$ if top_k > 0 $}
    for (var bit = 31; bit >= 0; bit = bit - 1) {
        let cand = tk | (1u << u32(bit));
        var c = 0u;
        for (var i = lid; i < V; i = i + WG) {
            c = c + select(0u, 1u, key_of(logits[i]) >= cand);
        }
        red_u[lid] = c;
        reduce_u();
        tk = select(tk, cand, red_u[0] >= {{ top_k }}u);
        workgroupBarrier();
    }
{$ endif $}

    // 3. top-p: the largest key t >= tk whose kept mass reaches TOP_P of the mass above tk
    var tp = tk;
{$ if top_p < 1.0 $}
    let need = kept_mass(tk, mx, lid) * {{ TOP_P }};
    workgroupBarrier();
    var t = 0u;
    for (var bit = 31; bit >= 0; bit = bit - 1) {
        let cand = t | (1u << u32(bit));
        let th = max(cand, tk);
        t = select(t, cand, kept_mass(th, mx, lid) >= need);
        workgroupBarrier();
    }
    tp = max(t, tk);
{$ endif $}

    // 4. draw: chunk sums of the kept weights, the chunk holding u * mass, then a scan inside it
    let lo = min(lid * CH, V);
    let hi = min(lo + CH, V);
    var cs = 0.0;
    for (var i = lo; i < hi; i = i + 1u) {
        let x = logits[i];
        cs = cs + select(0.0, exp((x - mx) * {{ TEMP_INV }}), key_of(x) >= tp);
    }
    red_f[lid] = cs;
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0.0;
        for (var j = 0u; j < WG; j = j + 1u) { total = total + red_f[j]; }
        let u = clamp(rnd[0], 0.0, 1.0);
        var goal = u * total;
        // the chunk whose running mass passes goal; rounding past the end: the last non-empty one
        var run = 0.0;
        var chunk = 0u;
        var found = false;
        var last = 0u;
        for (var j = 0u; j < WG; j = j + 1u) {
            if (red_f[j] > 0.0) { last = j; }
            if (!found && red_f[j] > 0.0 && run + red_f[j] > goal) { chunk = j; found = true; }
            if (!found) { run = run + red_f[j]; }
        }
        if (!found) { chunk = last; run = total - red_f[last]; }
        pick[0] = chunk;
        target_mass[0] = goal - run;
    }
    workgroupBarrier();
    if (lid == pick[0]) {
        let goal = target_mass[0];
        var acc = 0.0;
        var chosen = V;
        var last_kept = V;
        for (var i = lo; i < hi; i = i + 1u) {
            let x = logits[i];
            if (key_of(x) >= tp) {
                last_kept = i;
                acc = acc + exp((x - mx) * {{ TEMP_INV }});
                if (chosen == V && acc > goal) { chosen = i; }
            }
        }
        if (chosen == V) { chosen = last_kept; }  // rounding: the chunk's last kept token
        out[0] = i32(chosen);
    }
}
{$ endif $}
