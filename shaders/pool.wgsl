// average_pool2d / l2_pool2d / max_pool2d.
//   "window": one thread per output element, the window loops baked (sizes, strides, dilations,
//             padding); elements outside the input are skipped, so the average divides by the
//             number of real elements (padding excluded, as ONNX count_include_pad=0 and TFLite).
//   "global": the window is the whole plane (global pooling of a large plane): one workgroup per
//             (n, c) output, 64 threads striding over the plane, tree reduction in workgroup memory.
// Tensor (n, c, h, w) lives at n*sn + c*sc + h*sh + w*sw whatever the layout.
// T is the accumulator type: the compute type, f32 for f16 values (loaded through LD = f32 and
// stored through ST = f16_of; both empty otherwise).
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

// Result of a window from its accumulator and the number of input elements it covered.
fn finish(acc: {{ T }}, count: u32) -> {{ T }} {
{$ if mode == "max" $}
    return select({{ lit(0, T) }}, acc, count > 0u);
{$ elif mode == "avg" $}
    return select(0.0, acc / f32(count), count > 0u);
{$ else $}
    return sqrt(acc);
{$ endif $}
}

{$ if path == "window" $}
{{ main_1d(total) }}
{$ if nhwc $}
    let c = i % {{ C }}u;
    let p = i / {{ C }}u;
    let ow = p % {{ OW }}u;
    let oh = (p / {{ OW }}u) % {{ OH }}u;
    let n = p / {{ OH * OW }}u;
{$ else $}
    let ow = i % {{ OW }}u;
    let oh = (i / {{ OW }}u) % {{ OH }}u;
    let c = (i / {{ OH * OW }}u) % {{ C }}u;
    let n = i / {{ C * OH * OW }}u;
{$ endif $}
    let base = n * {{ in_s[0] }}u + c * {{ in_s[1] }}u;
    let ih0 = i32(oh * {{ SH }}u) - {{ PT }};
    let iw0 = i32(ow * {{ SW }}u) - {{ PL }};
    var acc: {{ T }} = {{ init }};
    var count = 0u;
    for (var kh = 0u; kh < {{ KH }}u; kh = kh + 1u) {
        let ih = ih0 + i32(kh * {{ DH }}u);
        if (ih < 0 || ih >= {{ IH }}) { continue; }
        for (var kw = 0u; kw < {{ KW }}u; kw = kw + 1u) {
            let iw = iw0 + i32(kw * {{ DW }}u);
            if (iw < 0 || iw >= {{ IW }}) { continue; }
            let v = {{ LD }}(x[base + u32(ih) * {{ in_s[2] }}u + u32(iw) * {{ in_s[3] }}u]);
            {{ accumulate("acc", "v") }}
            count = count + 1u;
        }
    }
    out[i] = act({{ ST }}(finish(acc, count)), i);
}
{$ else $}
var<workgroup> part: array<{{ T }}, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    // One output per workgroup; with a 1x1 output plane its flat index is n * C + c in both layouts.
    let o = wid.y * nwg.x + wid.x;
    if (o >= {{ total }}u) { return; }
    let n = o / {{ C }}u;
    let c = o % {{ C }}u;
    let base = n * {{ in_s[0] }}u + c * {{ in_s[1] }}u;
    var acc: {{ T }} = {{ init }};
    for (var p = li; p < {{ IH * IW }}u; p = p + 64u) {
        let v = {{ LD }}(x[base + p * {{ in_s[3] }}u]);
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
        out[o] = act({{ ST }}(finish(part[0], {{ IH * IW }}u)), o);
    }
}
{$ endif $}
