// Dequantization in registers for the row-major layout (src/quant/pack.rs, Layout::Rows): one u32 quant word of
// one row at a time. Nibble word i of a 32-block: byte b holds weight 4i+b (low nibble) and 16+4i+b (high nibble);
// with HB1 (HB2) one (two) high-bit words follow a block's 4 nibble words, bit 8b+i holding bit 4 (5) of weight
// 4i+b's quant and bit 8b+4+i that of weight 16+4i+b; NL: the nibbles index the IQ4_NL codebook. Q8 word i: byte
// b holds weight 4i+b as i8. Block constants are f16 pairs (block 2w in the low half of word w); SUPER (Q2_K, Q3_K):
// 2-bit words, 16-bit sub-block codes in place of the f16 scales, super-block factors in a third buffer.

#include "lib/quant_half.wgsl"
#include "lib/quant_nl.wgsl"

#include "lib/quant_words.wgsl"

// The integer quants of nibble word i (q) with its block's high-bit words (h: bit 4 with HB1, h2: bit 5 with HB2;
// ignored without them): weights 4i..4i+4 (lo) and 16+4i..16+4i+4 (hi).
fn qi_lo(q: u32, h: u32, h2: u32, i: u32) -> vec4<u32> {
    var v = (vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
#if HB1
    v |= ((vec4<u32>(h) >> vec4<u32>(i, 8u + i, 16u + i, 24u + i)) & vec4<u32>(1u)) << vec4<u32>(4u);
#endif
#if HB2
    v |= ((vec4<u32>(h2) >> vec4<u32>(i, 8u + i, 16u + i, 24u + i)) & vec4<u32>(1u)) << vec4<u32>(5u);
#endif
    return v;
}
fn qi_hi(q: u32, h: u32, h2: u32, i: u32) -> vec4<u32> {
    var v = (vec4<u32>(q) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u);
#if HB1
    v |= ((vec4<u32>(h) >> vec4<u32>(4u + i, 12u + i, 20u + i, 28u + i)) & vec4<u32>(1u)) << vec4<u32>(4u);
#endif
#if HB2
    v |= ((vec4<u32>(h2) >> vec4<u32>(4u + i, 12u + i, 20u + i, 28u + i)) & vec4<u32>(1u)) << vec4<u32>(5u);
#endif
    return v;
}

// The quant values as f32: the integers, or with NL the codebook values.
fn q_lo(q: u32, h: u32, h2: u32, i: u32) -> vec4<f32> {
#if NL
    return nl4(vec4<f32>(qi_lo(q, h, h2, i)));
#else
    return vec4<f32>(qi_lo(q, h, h2, i));
#endif
}
fn q_hi(q: u32, h: u32, h2: u32, i: u32) -> vec4<f32> {
#if NL
    return nl4(vec4<f32>(qi_hi(q, h, h2, i)));
#else
    return vec4<f32>(qi_hi(q, h, h2, i));
#endif
}

#if SUPER
// The 4 quants of field i of 2-bit word q (SUPER: weights 16t+4i..16t+4i+4 of a block, field i of byte b at bits
// 8b+2i), Q3K with their bit 2 from the block's high-bit word h (bit 8b+4t+i).
fn q2_field(q: u32, h: u32, t: u32, i: u32) -> vec4<f32> {
    let f = 2u * i;
    var v = (vec4<u32>(q) >> vec4<u32>(f, f + 8u, f + 16u, f + 24u)) & vec4<u32>(3u);
#if Q3K
    let s = 4u * t + i;
    v |= ((vec4<u32>(h) >> vec4<u32>(s, s + 8u, s + 16u, s + 24u)) & vec4<u32>(1u)) << vec4<u32>(2u);
#endif
    return vec4<f32>(v);
}
#endif

#if K4
// Q4_K's constants (d * sc, -dmin * m) in f32, exact (an f16 times an integer below 64), from the scale word cw
// holding the block's 16-bit code (sc | m << 8) in its low (high = false) or high half and the super-block factor
// word f (d | dmin << 16, f16).
fn k4_consts(cw: u32, high: bool, f: u32) -> vec2<f32> {
    let c = select(cw & 0xffffu, cw >> 16u, high);
    let df = unpack2x16float(f);
    return vec2<f32>(df.x * f32(c & 0xffu), -(df.y * f32(c >> 8u)));
}
#endif

// The 4 signed bytes of a Q8 word.
fn q8_bytes(q: u32) -> vec4<f32> {
    return vec4<f32>((bitcast<vec4<i32>>(vec4<u32>(q)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

#if F16
// f16 forms of the quants for the F16 kernels, all exact and at most 8 in magnitude: (q - QH_C) / QH_S, i.e. 4-bit
// nibbles q - 8, 5-bit (q - 16) / 2, 6-bit (q - 32) / 4, codebook values / 16 (the kernels multiply the scale by
// QH_S and fold QH_C into the min, or it is the format's offset), and Q8 bytes / 8 (the 8 folded into the scale).
// Centred quants keep the f16 sums free of a bias that the min would cancel afterwards (for Q4_1-style blocks the
// min is near -7.5 d), so their rounding stays that of the weights.
#if NL
const QH_C = 0.0;
const QH_S = 16.0;
#else
#if HB2
const QH_C = 32.0;
const QH_S = 4.0;
#else
#if HB1
const QH_C = 16.0;
const QH_S = 2.0;
#else
const QH_C = 8.0;
const QH_S = 1.0;
#endif
#endif
#endif
fn q_lo_h(q: u32, h: u32, h2: u32, i: u32) -> vec4<f16> {
    return (vec4<f16>(q_lo(q, h, h2, i)) - f16(QH_C)) * f16(1.0 / QH_S);
}
fn q_hi_h(q: u32, h: u32, h2: u32, i: u32) -> vec4<f16> {
    return (vec4<f16>(q_hi(q, h, h2, i)) - f16(QH_C)) * f16(1.0 / QH_S);
}
fn q8_bytes_h(q: u32) -> vec4<f16> {
    return vec4<f16>((bitcast<vec4<i32>>(vec4<u32>(q)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)) * 0.125h;
}

// An f16 partial sum of the rows kernels is one quant word's: 8 products of quants of magnitude at most 8 (Q8: 4 of
// |q / 8| <= 16) with x rounded to f16, so at most 64 max|x|; with every |x| < X16_MAX that stays below 2^15, half
// of f16's largest finite value. A word whose x has a value at or above it (activation outliers of hundreds occur)
// is summed in f32 instead, for that token.
const X16_MAX = 512.0;
#endif
