// average_pool2d / l2_pool2d / max_pool2d.
//   "window": one thread per output element, the window loops baked (sizes, strides, dilations,
//             padding); elements outside the input are skipped, so the average divides by the
//             number of real elements (padding excluded, as ONNX count_include_pad=0 and TFLite).
//   "global": the window is the whole plane (global pooling of a large plane): one workgroup per
//             (n, c) output, 64 threads striding over the plane, tree reduction in workgroup memory.
//   "global_part" + "global_final": the same for a plane larger than pool.GLOBAL_SPLIT: S workgroups
//             per output each pool a chunk into `part`, then one thread per output combines them.
//   "gate":   a global average pool (or none: the input is already one value per channel) and the
//             fully connected layers after it (compiler/passes.py fuse_gates, squeeze-and-excitation):
//             one workgroup per batch item pools every channel into workgroup memory, then each
//             layer computes its outputs from the previous layer's, one thread per output. HW
//             (the plane) may be a launch parameter (u(): dynamic/kernels.py SizeParams).
// Tensor (n, c, h, w) lives at n*sn + c*sc + h*sh + w*sw whatever the layout.
// T is the accumulator type: the compute type, f32 for f16 values (loaded through LD = f32 and
// stored through ST = f16_of; both empty otherwise).
{# Sizes may be dynamic (Syms, read at dispatch: mltensor/dynamic/): rendered with u() as u32,
   IH and IW compared as i32 through i32(); `coords` (dynamic kernels) splits the output index;
   `auto` (dynamic "global" kernels whose plane may be small) is 1 where a static build would take
   the window path: then each thread runs the window loop over the whole plane for one output. #}
{$ macro iconst(v) $}{$ if v is number $}{{ v }}{$ else $}i32({{ u(v) }}){$ endif $}{$ endmacro $}
{{ bindings }}
{$ include "common.wgsl" $}
{{ act }}

{$ macro accumulate(acc, v) $}
{$ if mode == "max" $}
{{ acc }} = {{ max_.format(a=acc, b=v) }};
{$ elif mode == "avg" $}
{{ acc }} = {{ acc }} + {{ v }};
{$ else $}
{{ acc }} = fma({{ v }}, {{ v }}, {{ acc }});
{$ endif $}
{$ endmacro $}

// Result of a window from its accumulator and the number of input elements it covered: a window
// of padding only gives `empty` (max: the data type's lowest value, as onnxruntime; else 0).
fn finish(acc: {{ T }}, count: u32) -> {{ T }} {
{$ if mode == "max" $}
    return select({{ empty }}, acc, count > 0u);
{$ elif mode == "avg" $}
    return select(0.0, acc / f32(count), count > 0u);
{$ else $}
    return sqrt(acc);
{$ endif $}
}

{$ if path == "window" $}
{{ main_1d(total) }}
{$ if coords is defined $}
{{ coords }}
{$ elif nhwc $}
    let c = i % {{ u(C) }};
    let p = i / {{ u(C) }};
    let ow = p % {{ u(OW) }};
    let oh = (p / {{ u(OW) }}) % {{ u(OH) }};
    let n = p / {{ u(OH * OW) }};
{$ else $}
    let ow = i % {{ u(OW) }};
    let oh = (i / {{ u(OW) }}) % {{ u(OH) }};
    let c = (i / {{ u(OH * OW) }}) % {{ u(C) }};
    let n = i / {{ u(C * OH * OW) }};
{$ endif $}
    let base = n * {{ u(in_s[0]) }} + c * {{ u(in_s[1]) }};
    let ih0 = i32(oh * {{ SH }}u) - {{ PT }};
    let iw0 = i32(ow * {{ SW }}u) - {{ PL }};
    var acc: {{ T }} = {{ init }};
    var count = 0u;
    for (var kh = 0u; kh < {{ u(KH) }}; kh = kh + 1u) {
        let ih = ih0 + i32(kh * {{ DH }}u);
        if (ih < 0 || ih >= {{ iconst(IH) }}) { continue; }
        for (var kw = 0u; kw < {{ u(KW) }}; kw = kw + 1u) {
            let iw = iw0 + i32(kw * {{ DW }}u);
            if (iw < 0 || iw >= {{ iconst(IW) }}) { continue; }
            let v = {{ LD }}(x[base + u32(ih) * {{ u(in_s[2]) }} + u32(iw) * {{ u(in_s[3]) }}]);
            {{ accumulate("acc", "v") }}
            count = count + 1u;
        }
    }
    out[i] = act({{ ST }}(finish(acc, count)), i);
}
{$ elif path == "global" $}
var<workgroup> part: array<{{ T }}, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    // One output per workgroup; with a 1x1 output plane its flat index is n * C + c in both layouts.
    let o = wid.y * nwg.x + wid.x;
{$ if auto is defined and auto $}
    if ({{ auto }} != 0u) {  // a small plane: the window kernel's loop, one output per thread
        let i = o * 64u + li;
        if (i >= {{ u(total) }}) { return; }
        let base = (i / {{ u(C) }}) * {{ u(in_s[0]) }} + (i % {{ u(C) }}) * {{ u(in_s[1]) }};
        var acc: {{ T }} = {{ init }};
        var count = 0u;
        for (var p = 0u; p < {{ u(IH * IW) }}; p = p + 1u) {
            let v = {{ LD }}(x[base + p * {{ u(in_s[3]) }}]);
            {{ accumulate("acc", "v") }}
            count = count + 1u;
        }
        out[i] = act({{ ST }}(finish(acc, count)), i);
        return;
    }
{$ endif $}
    if (o >= {{ u(total) }}) { return; }
    let n = o / {{ u(C) }};
    let c = o % {{ u(C) }};
    let base = n * {{ u(in_s[0]) }} + c * {{ u(in_s[1]) }};
    var acc: {{ T }} = {{ init }};
    for (var p = li; p < {{ u(IH * IW) }}; p = p + 64u) {
        let v = {{ LD }}(x[base + p * {{ u(in_s[3]) }}]);
        {{ accumulate("acc", "v") }}
    }
    part[li] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
{$ if mode == "max" $}
            part[li] = {{ max_.format(a="part[li]", b="part[li + s]") }};
{$ else $}
            part[li] = part[li] + part[li + s];
{$ endif $}
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[o] = act({{ ST }}(finish(part[0], {{ u(IH * IW) }})), o);
    }
}
{$ elif path == "global_part" $}
var<workgroup> part_: array<{{ T }}, 64>;

// Chunk c of the plane of output o (workgroup o * S + c): its elements [p0, p1) pooled into part.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= {{ u(total) }} * {{ u(S) }}) { return; }
    let o = g / {{ u(S) }};
    let p0 = (g % {{ u(S) }}) * {{ u(CHUNK) }};
    let p1 = min(p0 + {{ u(CHUNK) }}, {{ u(IH * IW) }});
    let base = (o / {{ u(C) }}) * {{ u(in_s[0]) }} + (o % {{ u(C) }}) * {{ u(in_s[1]) }};
    var acc: {{ T }} = {{ init }};
    for (var p = p0 + li; p < p1; p = p + 64u) {
        let v = {{ LD }}(x[base + p * {{ u(in_s[3]) }}]);
        {{ accumulate("acc", "v") }}
    }
    part_[li] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
{$ if mode == "max" $}
            part_[li] = {{ max_.format(a="part_[li]", b="part_[li + s]") }};
{$ else $}
            part_[li] = part_[li] + part_[li + s];
{$ endif $}
        }
        workgroupBarrier();
    }
    if (li == 0u) { part[g] = part_[0]; }
}
{$ elif path == "global_final" $}
// One thread per output: its S chunk results in order, then the pool's result.
{{ main_1d(total, "o") }}
    var acc: {{ T }} = {{ init }};
    for (var c = 0u; c < {{ u(S) }}; c = c + 1u) {
        let v = part[o * {{ u(S) }} + c];
{$ if mode == "l2" $}
        acc = acc + v;
{$ else $}
        {{ accumulate("acc", "v") }}
{$ endif $}
    }
    out[o] = act({{ ST }}(finish(acc, {{ u(IH * IW) }})), o);
}
{$ elif path == "gate" $}
// The pool's input at flat index i (read through the elementwise step producing it, if fused).
{{ src_fn }}

var<workgroup> part: array<f32, 256>;
var<workgroup> va: array<f32, {{ CMAX }}>;
var<workgroup> vb: array<f32, {{ CMAX }}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = wid.x;
{$ if pool $}
    // Lanes along the contiguous axis (channels for NHWC, pixels for NCHW), rows along the other;
    // each pass pools L (NHWC) or R (NCHW) channels, then a tree over rows / lanes sums them.
    let lane = li % {{ L }}u;
    let row = li / {{ L }}u;
{$ if nhwc $}
    for (var cb = 0u; cb < {{ C }}u; cb = cb + {{ L }}u) {
        let c = cb + lane;
        var acc = 0.0;
        if (c < {{ C }}u) {
            for (var p = row; p < {{ u(HW) }}; p = p + {{ R }}u) {
                acc = acc + src(n * {{ u(HW * C) }} + p * {{ C }}u + c);
            }
        }
        part[li] = acc;
        workgroupBarrier();
        for (var s = {{ R // 2 }}u; s > 0u; s = s >> 1u) {
            if (row < s) { part[li] = part[li] + part[li + s * {{ L }}u]; }
            workgroupBarrier();
        }
        if (row == 0u && c < {{ C }}u) { va[c] = pooled(part[lane]); }
        workgroupBarrier();
    }
{$ else $}
    for (var cb = 0u; cb < {{ C }}u; cb = cb + {{ R }}u) {
        let c = cb + row;
        var acc = 0.0;
        if (c < {{ C }}u) {
            for (var p = lane; p < {{ u(HW) }}; p = p + {{ L }}u) {
                acc = acc + src(n * {{ u(HW * C) }} + c * {{ u(HW) }} + p);
            }
        }
        part[li] = acc;
        workgroupBarrier();
        for (var s = {{ L // 2 }}u; s > 0u; s = s >> 1u) {
            if (lane < s) { part[li] = part[li] + part[li + s]; }
            workgroupBarrier();
        }
        if (lane == 0u && c < {{ C }}u) { va[c] = pooled(part[li]); }
        workgroupBarrier();
    }
{$ endif $}
{$ else $}
    for (var c = li; c < {{ C }}u; c = c + 256u) { va[c] = src(n * {{ C }}u + c); }
    workgroupBarrier();
{$ endif $}
{$ for f in layers $}
    // (the trip count through arrayLength, >= I, so that Mesa's NIR cannot unroll the loop: a
    // 6x24 gate took 14 ms of pipeline creation unrolled, 3 ms as a loop, at every start)
    let kn{{ loop.index0 }} = min({{ f.I }}u, arrayLength(&{{ f.w }}));
    for (var o = li; o < {{ f.O }}u; o = o + 256u) {
        var acc = {{ "f32(" + f.b + "[o])" if f.b else "0.0" }};
        for (var k = 0u; k < kn{{ loop.index0 }}; k = k + 1u) {
            acc = fma(f32({{ f.w }}[o * {{ f.os }}u + k * {{ f.is_ }}u]), {{ f.vin }}[k], acc);
        }
{{ f.acts }}
{$ if loop.last $}
        out[n * {{ f.O }}u + o] = {{ f.cur }};
{$ else $}
        {{ f.vout }}[o] = f32({{ f.cur }});
{$ endif $}
    }
{$ if not loop.last $}
    workgroupBarrier();
{$ endif $}
{$ endfor $}
}
{$ endif $}
