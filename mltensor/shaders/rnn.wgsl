// The gate math of one GRU / LSTM step in one kernel (mltensor/ops/rnn.py), one thread per
// element (b, j) of the [batch, hidden] state. Gates are read in place: `gx` is the sequence's
// input projection ([steps * batch, G * H], this step's rows from gx_off on) and `rec` the
// recurrent gemm h x R^T + rb ([batch, G * H]), so no split or slice launches. Gate k sits at
// column pos_k * H + j in both (pos: its place in the operator's layout).
// Bindings are f32 or f16: the gate math is f32 (f32() widens each load) and stores go through
// ST (f16_of for f16).
{{ bindings }}
{$ include "common.wgsl" $}

fn act0(x: f32) -> f32 { return {{ act0 }}; }
fn act1(x: f32) -> f32 { return {{ act1 }}; }
{$ if mode == "lstm" $}
fn act2(x: f32) -> f32 { return {{ act2 }}; }
{$ endif $}

{{ main_1d(n) }}
    let b = i / {{ H }}u;
    let j = i - b * {{ H }}u;
    let row = b * {{ G * H }}u + j;
{$ if mode == "lstm" $}
    let cv = f32(c[i]);
    var gi = f32(gx[{{ u(gx_off) }} + row + {{ pos.i * H }}u]) + f32(rec[row + {{ pos.i * H }}u]);
    var gf = f32(gx[{{ u(gx_off) }} + row + {{ pos.f * H }}u]) + f32(rec[row + {{ pos.f * H }}u]);
    let gg = f32(gx[{{ u(gx_off) }} + row + {{ pos.g * H }}u]) + f32(rec[row + {{ pos.g * H }}u]);
    var go = f32(gx[{{ u(gx_off) }} + row + {{ pos.o * H }}u]) + f32(rec[row + {{ pos.o * H }}u]);
{$ if peep $}
    // peephole order i, o, f (the spec's emulation), all on the incoming cell state
    gi = gi + cv * f32(peep[j]);
    go = go + cv * f32(peep[{{ H }}u + j]);
    gf = gf + cv * f32(peep[{{ 2 * H }}u + j]);
{$ endif $}
    let c2 = act0(gf) * cv + act0(gi) * act1(gg);
    c_out[i] = {{ ST }}(c2);
    h_out[i] = {{ ST }}(act0(go) * act2(c2));
{$ else $}
    let hv = f32(h[i]);
    let z = act0(f32(gx[{{ u(gx_off) }} + row + {{ pos.z * H }}u]) + f32(rec[row + {{ pos.z * H }}u]));
    let r = act0(f32(gx[{{ u(gx_off) }} + row + {{ pos.r * H }}u]) + f32(rec[row + {{ pos.r * H }}u]));
    let n = act1(f32(gx[{{ u(gx_off) }} + row + {{ pos.n * H }}u]) + r * f32(rec[row + {{ pos.n * H }}u]));
    h_out[i] = {{ ST }}(z * hv + n * (1.0 - z));
{$ endif $}
}
