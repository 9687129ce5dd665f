// Temporal smoothing of the segmentation mask: an exponential moving average kept on the GPU.
// Reads the imported mask tensor (MH x MW x MC float32, channel 0 is the person probability).
// ALPHA is 1 for the first frame (the average starts at the first mask, not at zero).
@group(0) @binding(0) var<storage, read> mask: array<f32>;
@group(0) @binding(1) var<storage, read_write> ema: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= {{ MH * MW }}u) { return; }
    let m = clamp(mask[i * {{ MC }}u], 0.0, 1.0);
    ema[i] = mix(ema[i], m, {{ ALPHA }});
}
