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
