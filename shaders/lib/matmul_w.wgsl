// Weight access shared by the matmul shaders. The including shader declares `w` (binding 1) as
//   VEC && WH:   array<vec4<u32>>  [rows, K/8]        eight f16 halves per vector (K % 8 == 0)
//   VEC && !WH:  array<vec4<f32>>  [rows, K/4]        (K % 4 == 0)
//   !VEC && WH:  array<u32>        [rows, ceil(K/2)]  two halves per word, rows padded to whole words
//   !VEC && !WH: array<f32>        [rows, K]
// Halves are in k order: the low half of a word is the even k.

#include "lib/half.wgsl"

// Two words of packed halves as 4 f32: (a lo, a hi, b lo, b hi).
fn unpack4(a: u32, b: u32) -> vec4<f32> {
    return half_top4(vec4<u32>(a << 16u, a, b << 16u, b));
}

// k..k+3 of eight packed halves (the x and y words).
fn half_lo(q: vec4<u32>) -> vec4<f32> {
    return unpack4(q.x, q.y);
}

// k+4..k+7 of eight packed halves (the z and w words).
fn half_hi(q: vec4<u32>) -> vec4<f32> {
    return unpack4(q.z, q.w);
}

#if VEC
#else
// Weight k of the row whose first element (f32) or word (f16) is at `base`: the unaligned-row path.
fn w_at(base: u32, k: u32) -> f32 {
#if WH
    let word = w[base + k / 2u];
    return unpack4(word, word)[k & 1u];
#else
    return w[base + k];
#endif
}
#endif
