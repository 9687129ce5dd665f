// Full-resolution composite: person from the frame, background from the blurred frame ("blur") or
// a background image ("replace"), weighted by the smoothed mask (bilinear upsample, then a
// smoothstep that makes the mask's confident parts exactly 0 or 1, so the person keeps its
// original pixel values). Output: W x H packed rgba8, the frame that is shown or encoded.
@group(0) @binding(0) var<storage, read> frame: array<u32>;
@group(0) @binding(1) var<storage, read> ema: array<f32>;
{$ if EFFECT == "blur" $}
@group(0) @binding(2) var<storage, read> back: array<vec4<f32>>;
{$ else $}
@group(0) @binding(2) var<storage, read> back: array<u32>;
{$ endif $}
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

{$ include "video_common.wgsl" $}

fn ema_at(x: u32, y: u32) -> f32 {
    return ema[y * {{ MW }}u + x];
}

// Bilinear sample of the MH x MW mask at frame pixel p (half-pixel centres), edge-clamped.
fn mask_at(p: vec2<f32>) -> f32 {
    let scale = vec2<f32>(f32({{ MW }}) / f32({{ W }}), f32({{ MH }}) / f32({{ H }}));
    let q = clamp((p + 0.5) * scale - 0.5, vec2<f32>(0.0), vec2<f32>(f32({{ MW - 1 }}), f32({{ MH - 1 }})));
    let i0 = vec2<u32>(floor(q));
    let i1 = min(i0 + 1u, vec2<u32>({{ MW - 1 }}u, {{ MH - 1 }}u));
    let f = q - floor(q);
    let a = mix(ema_at(i0.x, i0.y), ema_at(i1.x, i0.y), f.x);
    let b = mix(ema_at(i0.x, i1.y), ema_at(i1.x, i1.y), f.x);
    return mix(a, b, f.y);
}

{$ if EFFECT == "blur" $}
fn back_small(x: u32, y: u32) -> vec3<f32> {
    return back[y * {{ SW }}u + x].xyz;
}

// Bilinear upsample of the blurred SW x SH image (each small pixel covers F x F frame pixels).
fn background(p: vec2<f32>) -> vec3<f32> {
    let q = clamp((p + 0.5) / f32({{ F }}) - 0.5, vec2<f32>(0.0), vec2<f32>(f32({{ SW - 1 }}), f32({{ SH - 1 }})));
    let i0 = vec2<u32>(floor(q));
    let i1 = min(i0 + 1u, vec2<u32>({{ SW - 1 }}u, {{ SH - 1 }}u));
    let f = q - floor(q);
    let a = mix(back_small(i0.x, i0.y), back_small(i1.x, i0.y), f.x);
    let b = mix(back_small(i0.x, i1.y), back_small(i1.x, i1.y), f.x);
    return mix(a, b, f.y);
}
{$ else $}
fn background(p: vec2<f32>) -> vec3<f32> {
    let i = vec2<u32>(p);
    return unpack_rgba(back[i.y * {{ W }}u + i.x]);
}
{$ endif $}

fn composite(x: u32, y: u32, orig: vec3<f32>) -> u32 {
    let p = vec2<f32>(f32(x), f32(y));
    let m = smoothstep({{ LO }}, {{ HI }}, mask_at(p));
    return pack_rgba(mix(background(p), orig, m));
}

fn rgb_of(b0: u32, b1: u32, b2: u32) -> vec3<f32> {
    return vec3<f32>(f32(b0 & 0xFFu), f32(b1 & 0xFFu), f32(b2 & 0xFFu)) * (1.0 / 255.0);
}

{$ if QUAD $}
// Four horizontally adjacent pixels per thread: their 12 rgb24 bytes are 3 aligned words.
@compute @workgroup_size(16, 4)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= {{ W // 4 }}u || gid.y >= {{ H }}u) { return; }
    let x = gid.x * 4u;
    let y = gid.y;
    let w = (y * {{ W }}u + x) * 3u / 4u;
    let w0 = frame[w];
    let w1 = frame[w + 1u];
    let w2 = frame[w + 2u];
    let o = y * {{ W }}u + x;
    out[o] = composite(x, y, rgb_of(w0, w0 >> 8u, w0 >> 16u));
    out[o + 1u] = composite(x + 1u, y, rgb_of(w0 >> 24u, w1, w1 >> 8u));
    out[o + 2u] = composite(x + 2u, y, rgb_of(w1 >> 16u, w1 >> 24u, w2));
    out[o + 3u] = composite(x + 3u, y, rgb_of(w2 >> 8u, w2 >> 16u, w2 >> 24u));
}
{$ else $}
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= {{ W }}u || gid.y >= {{ H }}u) { return; }
    out[gid.y * {{ W }}u + gid.x] = composite(gid.x, gid.y, frame_rgb(gid.x, gid.y));
}
{$ endif $}
