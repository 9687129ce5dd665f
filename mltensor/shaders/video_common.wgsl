// Helpers shared by the video example's kernels (mltensor/apps/selfie_segmentation.py).
// Frames arrive as packed rgb24 bytes (one upload per frame, no host-side repacking), read here as
// array<u32>; pixel (x, y) is bytes 3*(y*W+x) .. +2.

fn frame_byte(i: u32) -> u32 {
    return (frame[i >> 2u] >> ((i & 3u) * 8u)) & 0xFFu;
}

fn frame_rgb(x: u32, y: u32) -> vec3<f32> {
    let b = (y * {{ W }}u + x) * 3u;
    return vec3<f32>(f32(frame_byte(b)), f32(frame_byte(b + 1u)), f32(frame_byte(b + 2u))) * (1.0 / 255.0);
}

// Bilinear sample of the frame at continuous pixel coordinates (pixel centres at +0.5),
// clamped to the edge.
fn frame_bilinear(p: vec2<f32>) -> vec3<f32> {
    let q = clamp(p - 0.5, vec2<f32>(0.0), vec2<f32>(f32({{ W }}u - 1u), f32({{ H }}u - 1u)));
    let i0 = vec2<u32>(floor(q));
    let i1 = min(i0 + 1u, vec2<u32>({{ W }}u - 1u, {{ H }}u - 1u));
    let f = q - floor(q);
    let a = mix(frame_rgb(i0.x, i0.y), frame_rgb(i1.x, i0.y), f.x);
    let b = mix(frame_rgb(i0.x, i1.y), frame_rgb(i1.x, i1.y), f.x);
    return mix(a, b, f.y);
}

fn pack_rgba(c: vec3<f32>) -> u32 {
    let v = vec3<u32>(clamp(c, vec3<f32>(0.0), vec3<f32>(1.0)) * 255.0 + 0.5);
    return v.x | (v.y << 8u) | (v.z << 16u) | (255u << 24u);
}

fn unpack_rgba(p: u32) -> vec3<f32> {
    return vec3<f32>(f32(p & 0xFFu), f32((p >> 8u) & 0xFFu), f32((p >> 16u) & 0xFFu)) * (1.0 / 255.0);
}
