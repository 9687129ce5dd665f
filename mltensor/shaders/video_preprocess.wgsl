// Frame (W x H rgb24) -> model input (MH x MW x 3 float32 in [0, 1], NHWC), bilinear resize with
// half-pixel centres (TFLite RESIZE_BILINEAR, half_pixel_centers=true). Writes the imported
// input tensor directly.
@group(0) @binding(0) var<storage, read> frame: array<u32>;
@group(0) @binding(1) var<storage, read_write> model_in: array<f32>;

{$ include "video_common.wgsl" $}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= {{ MW }}u || gid.y >= {{ MH }}u) { return; }
    let scale = vec2<f32>(f32({{ W }}) / f32({{ MW }}), f32({{ H }}) / f32({{ MH }}));
    let c = frame_bilinear((vec2<f32>(gid.xy) + 0.5) * scale);
    let o = (gid.y * {{ MW }}u + gid.x) * 3u;
    model_in[o] = c.x;
    model_in[o + 1u] = c.y;
    model_in[o + 2u] = c.z;
}
