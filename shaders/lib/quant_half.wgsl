// f16 block constants (scales, mins) stored two per u32 word, decoded exactly from their bits (lib/half.wgsl).

#include "lib/half.wgsl"

// (low half, high half) of each word of `w`, in the order (w.x lo, w.x hi, w.y lo, w.y hi).
fn halves4(w: vec2<u32>) -> vec4<f32> {
    return half_top4(vec4<u32>(w.x << 16u, w.x, w.y << 16u, w.y));
}

// One half of a word: the high one when `high`.
fn half_of(w: u32, high: bool) -> f32 {
    return half_top4(vec4<u32>(select(w << 16u, w, high)))[0];
}
