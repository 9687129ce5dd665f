// Background blur at reduced resolution: box-downsample the frame by F (SW x SH), then a separable
// Gaussian (sigma {{ SIGMA }} small pixels, {{ 2 * R + 1 }} taps). The composite upsamples it
// bilinearly, so the cost barely depends on the frame size.
@group(0) @binding(0) var<storage, read> frame: array<u32>;
@group(0) @binding(1) var<storage, read_write> small_a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> small_b: array<vec4<f32>>;

{$ include "video_common.wgsl" $}

const WEIGHTS = array<f32, {{ 2 * R + 1 }}>({{ weights }});

@compute @workgroup_size(8, 8)
fn down(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= {{ SW }}u || gid.y >= {{ SH }}u) { return; }
    var acc = vec3<f32>(0.0);
    var n = 0.0;
    for (var dy = 0u; dy < {{ F }}u; dy++) {
        for (var dx = 0u; dx < {{ F }}u; dx++) {
            let x = gid.x * {{ F }}u + dx;
            let y = gid.y * {{ F }}u + dy;
            if (x < {{ W }}u && y < {{ H }}u) {
                acc += frame_rgb(x, y);
                n += 1.0;
            }
        }
    }
    small_a[gid.y * {{ SW }}u + gid.x] = vec4<f32>(acc / max(n, 1.0), 1.0);
}

@compute @workgroup_size(8, 8)
fn blur_h(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= {{ SW }}u || gid.y >= {{ SH }}u) { return; }
    var acc = vec4<f32>(0.0);
    for (var k = 0; k < {{ 2 * R + 1 }}; k++) {
        let x = clamp(i32(gid.x) + k - {{ R }}, 0, {{ SW - 1 }});
        acc += WEIGHTS[k] * small_a[gid.y * {{ SW }}u + u32(x)];
    }
    small_b[gid.y * {{ SW }}u + gid.x] = acc;
}

@compute @workgroup_size(8, 8)
fn blur_v(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= {{ SW }}u || gid.y >= {{ SH }}u) { return; }
    var acc = vec4<f32>(0.0);
    for (var k = 0; k < {{ 2 * R + 1 }}; k++) {
        let y = clamp(i32(gid.y) + k - {{ R }}, 0, {{ SH - 1 }});
        acc += WEIGHTS[k] * small_b[u32(y) * {{ SW }}u + gid.x];
    }
    small_a[gid.y * {{ SW }}u + gid.x] = acc;
}
