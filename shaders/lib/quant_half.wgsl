// f16 block constants (scales, mins) stored two per u32 word, decoded from their bits: exact for zeros, normals
// and subnormals (the f32 product by 2^112 is exact), without unpack2x16float, which naga gates behind the
// SHADER_FLOAT16_IN_FLOAT32 capability. Infinities and NaNs (never valid block constants) decode to finite values.
// The 15 magnitude bits of a half, shifted to f32's position, are an f32 of value h * 2^-112.

const HALF_TO_F32 = 5.192296858534828e33;  // 2^112

// (low half, high half) of each word of `w`, in the order (w.x lo, w.x hi, w.y lo, w.y hi).
fn halves4(w: vec2<u32>) -> vec4<f32> {
    let lo = ((w & vec2<u32>(0x7fffu)) << vec2<u32>(13u)) | ((w & vec2<u32>(0x8000u)) << vec2<u32>(16u));
    let hi = ((w >> vec2<u32>(3u)) & vec2<u32>(0x0fffe000u)) | (w & vec2<u32>(0x80000000u));
    return vec4<f32>(bitcast<f32>(lo.x), bitcast<f32>(hi.x), bitcast<f32>(lo.y), bitcast<f32>(hi.y)) * HALF_TO_F32;
}

// One half of a word: the high one when `high`.
fn half_of(w: u32, high: bool) -> f32 {
    let h = select(w & 0xffffu, w >> 16u, high);
    return bitcast<f32>(((h & 0x7fffu) << 13u) | ((h & 0x8000u) << 16u)) * HALF_TO_F32;
}
