// f16 to f32 from the half's bits, exact on every adapter: zeros, subnormals and normals (infinities and NaNs,
// which weights and block constants never hold, come out finite, about 2^16). Stands in for unpack2x16float, which
// naga rejects unless its SHADER_FLOAT16_IN_FLOAT32 capability is on (absent on GLES).
//
// Subnormal halves are decoded without an f32 subnormal on the way: GPUs that flush f32 denormals to zero
// (NVIDIA's Vulkan driver does) would otherwise turn them into 0. A subnormal m * 2^-24 is computed as
// (1 + m/1024) * 2^-14 - 2^-14, both operands normal and the difference exact.

// Four halves, each in the top 16 bits of a word (bit 31 its sign).
fn half_top4(v: vec4<u32>) -> vec4<f32> {
    let mag = (v >> vec4<u32>(3u)) & vec4<u32>(0x0fffe000u);  // exponent and mantissa in f32's fields, bias 15
    let normal = bitcast<vec4<f32>>(mag + vec4<u32>(0x38000000u));  // re-biased: + 112 << 23
    let sub = bitcast<vec4<f32>>(mag + vec4<u32>(0x38800000u)) - vec4<f32>(6.103515625e-05);  // 2^-14
    let f = select(normal, sub, mag < vec4<u32>(0x00800000u));
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(f) | (v & vec4<u32>(0x80000000u)));
}
