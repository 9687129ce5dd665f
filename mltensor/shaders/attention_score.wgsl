{# The score of a (query row, key) pair, the online softmax's exp and the keys a tile of rows
   sees, shared by attention.wgsl and attention_cpu.wgsl (included: the parameters scale,
   softcap, has_bias, has_cond, causal and window, and the constant BQ, are the including
   kernel's). #}
fn is_neg_inf(x: f32) -> bool { return bitcast<u32>(x) == 0xff800000u; }
fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }
// exp(x - m), 0 for x = -inf (also when m = -inf): reduce.wgsl's softmax `ex`
fn ex(x: f32, m: f32) -> f32 { return select(exp(x - m), 0.0, is_neg_inf(x)); }

// The score of row qi, key kj from their dot product: scale, bias, where, causal limit.
// (bb, cb: the bias's and condition's matrix offsets; sq, sk: SQ and SK.)
fn score(dot: f32, qi: u32, kj: u32, bb: u32, cb: u32, sq: u32, sk: u32) -> f32 {
    var x = dot{{ scale }};
{$ if softcap $}
    // soft-capping (Gemma 2): cap * tanh(x / cap), the argument clamped where tanh is +-1 in f32
    x = {{ softcap }} * tanh(clamp(x * {{ inv_softcap }}, -15.0, 15.0));
{$ endif $}
{$ if has_bias $}
    x = x + {{ LD }}(bias[bb + {{ bias_at }}]);
{$ endif $}
{$ if has_cond $}
    x = select({{ where_value }}, x, (cond[cb + {{ cond_at }}] != 0u) == {{ where_keeps }});
{$ endif $}
{$ if causal $}
    if (kj + sq > qi + sk) { x = neg_inf(); }  // key kj is visible from row qi when kj <= qi + SK - SQ
{$ endif $}
{$ if window $}
    // sliding window: row qi (position qi + SK - SQ) sees only the WINDOW keys up to its own
    if (kj + {{ window }}u + sq <= qi + sk) { x = neg_inf(); }
{$ endif $}
    return x;
}

// The keys [first, end) some row of the BQ rows from q0 may see (all in u32, no negative values):
// none past the causal limit of the tile's last row, none before the window of its first.
fn keys_end(q0: u32, sq: u32, sk: u32) -> u32 {
{$ if causal $}
    let lim = min(q0 + BQ, sq) + sk;  // (last row + 1) + SK
    return select(0u, min(sk, lim - sq), lim > sq);
{$ else $}
    return sk;
{$ endif $}
}

fn keys_first(q0: u32, sq: u32, sk: u32) -> u32 {
{$ if window $}
    return max(q0 + sk + 1u, sq + {{ window }}u) - sq - {{ window }}u;
{$ else $}
    return 0u;
{$ endif $}
}
