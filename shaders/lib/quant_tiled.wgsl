// Dequantization in registers for the chunk-tiled layout (src/quant/pack.rs, Layout::Tiled): a vec4<u32> holds
// the same quant word of 4 consecutive output rows, so every helper works on 4 outputs at once.
// Q4 word i of a 32-block: byte b holds weight 4i+b (low nibble) and weight 16+4i+b (high nibble).
// Q8 word i of a 32-block: byte b holds weight 4i+b as i8.
//
// Quants are masked in place, not shifted down: the nibble at bits 4j..4j+3 converts to q * 16^j exactly (4
// significant bits), so x is pre-scaled by 16^-j instead (an exact power-of-two scaling), once per block and shared
// by all rows. Q8 bytes are moved to the top byte (sign in place) and convert to q * 2^24.

#include "lib/quant_half.wgsl"

// Scales of x for the 4 low-nibble k (xa, bits 0, 8, 16, 24) and the 4 high-nibble k (xb, bits 4, 12, 20, 28; the
// top nibble is shifted down instead of masked, so it keeps scale 1).
const Q4_XA_SCALE = vec4<f32>(1.0, 0.00390625, 1.52587890625e-05, 5.9604644775390625e-08);
const Q4_XB_SCALE = vec4<f32>(0.0625, 0.000244140625, 9.5367431640625e-07, 1.0);
const Q8_X_SCALE = 5.9604644775390625e-08;  // 2^-24

// sum_b q[b] * xa[b] + q[b+16] * xb[b] over one Q4 word of 4 rows, with xa = x[4i..4i+4] * Q4_XA_SCALE and
// xb = x[16+4i..16+4i+4] * Q4_XB_SCALE. Two partial chains halve the FMA dependency chain.
fn q4_word(q: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    var lo = vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xfu))) * xa.x;
    var hi = vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf0u))) * xb.x;
    lo += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf00u))) * xa.y;
    hi += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf000u))) * xb.y;
    lo += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf0000u))) * xa.z;
    hi += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf00000u))) * xb.z;
    lo += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf000000u))) * xa.w;
    hi += vec4<f32>(bitcast<vec4<i32>>(q >> vec4<u32>(28u))) * xb.w;
    return lo + hi;
}

// sum_b q[b] * x[b] over one Q8 word of 4 rows (signed bytes), with x = x[4i..4i+4] * Q8_X_SCALE.
fn q8_word(q: vec4<u32>, xa: vec4<f32>) -> vec4<f32> {
    let top = vec4<u32>(0xff000000u);
    let a = vec4<f32>(bitcast<vec4<i32>>(q << vec4<u32>(24u))) * xa.x
        + vec4<f32>(bitcast<vec4<i32>>((q << vec4<u32>(16u)) & top)) * xa.y;
    let b = vec4<f32>(bitcast<vec4<i32>>((q << vec4<u32>(8u)) & top)) * xa.z
        + vec4<f32>(bitcast<vec4<i32>>(q & top)) * xa.w;
    return a + b;
}
