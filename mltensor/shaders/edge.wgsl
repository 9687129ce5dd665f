// Graph edges: packed storage (float16, int8, uint8) <-> 32-bit compute form, and plain copies.
// unpack: one thread per element; pack: one thread per 32-bit word (no two threads share a word).
{{ bindings }}
{$ include "common.wgsl" $}

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid);
{$ if mode == "copy" $}
    if (i >= {{ u(n) }}) { return; }
    dst[i] = src[i];
{$ elif mode == "unpack" $}
    if (i >= {{ u(n) }}) { return; }
  {$ if dtype == "float16" $}
    dst[i] = f16_bits_to_f32(src[i / 2u] >> (16u * (i % 2u)));
  {$ elif dtype == "int8" $}
    dst[i] = (bitcast<i32>(src[i / 4u] << (24u - 8u * (i % 4u)))) >> 24u;
  {$ elif dtype == "uint8" $}
    dst[i] = (src[i / 4u] >> (8u * (i % 4u))) & 0xffu;
  {$ endif $}
{$ elif mode == "pack" $}
  {$ if dtype == "float16" $}
    if (i >= {{ u(words) }}) { return; }
    let lo = f32_to_f16_bits(src[2u * i]);
    var hi = 0u;
    if (2u * i + 1u < {{ u(n) }}) { hi = f32_to_f16_bits(src[2u * i + 1u]); }
    dst[i] = lo | (hi << 16u);
  {$ elif dtype in ("int8", "uint8") $}
    if (i >= {{ u(words) }}) { return; }
    var w = 0u;
    for (var k = 0u; k < 4u; k++) {
        let j = 4u * i + k;
        if (j < {{ u(n) }}) { w = w | ((bitcast<u32>(src[j]) & 0xffu) << (8u * k)); }
    }
    dst[i] = w;
  {$ endif $}
{$ endif $}
}
