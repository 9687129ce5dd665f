// Shows the composited frame (W x H packed rgba8 storage buffer) in a window: a full-screen
// triangle whose fragments fetch the nearest frame pixel, letterboxed to keep the aspect ratio.
@group(0) @binding(0) var<storage, read> frame_out: array<u32>;
@group(0) @binding(1) var<uniform> view: vec4<f32>;  // canvas width, height, 0, 0

fn unpack_rgba(p: u32) -> vec3<f32> {
    return vec3<f32>(f32(p & 0xFFu), f32((p >> 8u) & 0xFFu), f32((p >> 16u) & 0xFFu)) * (1.0 / 255.0);
}

@vertex
fn vs_main(@builtin(vertex_index) i: u32) -> @builtin(position) vec4<f32> {
    let uv = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u));
    return vec4<f32>(uv * 2.0 - 1.0, 0.0, 1.0);
}

@fragment
fn fs_main(@builtin(position) pos: vec4<f32>) -> @location(0) vec4<f32> {
    let canvas = max(view.xy, vec2<f32>(1.0));
    let s = min(canvas.x / f32({{ W }}), canvas.y / f32({{ H }}));
    let off = (canvas - vec2<f32>(f32({{ W }}), f32({{ H }})) * s) * 0.5;
    let p = (pos.xy - off) / s;
    if (p.x < 0.0 || p.y < 0.0 || p.x >= f32({{ W }}) || p.y >= f32({{ H }})) {
        return vec4<f32>(0.0, 0.0, 0.0, 1.0);
    }
    let c = unpack_rgba(frame_out[u32(p.y) * {{ W }}u + u32(p.x)]);
    {$ if SRGB $}
    // An srgb canvas format encodes on store: hand it linear values (the exact sRGB curve).
    let lin = select(pow((c + 0.055) / 1.055, vec3<f32>(2.4)), c / 12.92, c <= vec3<f32>(0.04045));
    return vec4<f32>(lin, 1.0);
    {$ else $}
    return vec4<f32>(c, 1.0);
    {$ endif $}
}
