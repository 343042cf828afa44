// Dequantization in registers for the row-major layout (src/quant/pack.rs, Layout::Rows): one u32 quant word of
// one row at a time. Q4 word i of a 32-block: byte b holds weight 4i+b (low nibble) and 16+4i+b (high nibble);
// Q8 word i: byte b holds weight 4i+b as i8. Block constants are f16 pairs (block 2w in the low half of word w).

#include "lib/quant_half.wgsl"

// The low nibbles (weights 4i..4i+4) and high nibbles (weights 16+4i..16+4i+4) of a Q4 word.
fn q4_lo(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
}
fn q4_hi(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
}

// The 4 signed bytes of a Q8 word.
fn q8_bytes(q: u32) -> vec4<f32> {
    return vec4<f32>((bitcast<vec4<i32>>(vec4<u32>(q)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

#if F16
// f16 forms of the quants for the F16 kernels, all exact (small integers in f16's 11-bit significand) and at most
// 16 in magnitude: Q4 nibbles centred, q - 8 (the kernels fold the 8 into the min, or it is Q4_0's offset), and Q8
// bytes / 8 (the 8 folded into the scale). Centred quants keep the f16 sums free of a bias that the min would
// cancel afterwards (for Q4_1-style blocks the min is near -7.5 d), so their rounding stays that of the weights.
fn q4_lo_h(q: u32) -> vec4<f16> {
    return vec4<f16>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)) - 8.0h;
}
fn q4_hi_h(q: u32) -> vec4<f16> {
    return vec4<f16>((vec4<u32>(q) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u)) - 8.0h;
}
fn q8_bytes_h(q: u32) -> vec4<f16> {
    return vec4<f16>((bitcast<vec4<i32>>(vec4<u32>(q)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)) * 0.125h;
}

// An f16 partial sum of the rows kernels is one quant word's: 8 products of Q4 quants (|q - 8| <= 8) or 4 of Q8
// quants (|q / 8| <= 16) with x rounded to f16, so at most 64 max|x|; with every |x| < X16_MAX that stays below
// 2^15, half of f16's largest finite value. A word whose x has a value at or above it (activation outliers of
// hundreds occur) is summed in f32 instead, for that token.
const X16_MAX = 512.0;
#endif
