//! IQ4_NL: blocks of 32 weights as one f16 scale `d` and 32 4-bit indices into a fixed non-linear codebook,
//! `x = d * KVALUES[q]`.
//!
//! Block layout (18 bytes, ggml's `block_iq4_nl`; the nibble order of Q4_0):
//! ```text
//! bytes 0..2    d   f16, little-endian
//! bytes 2..18   qs  16 bytes; byte j holds the index of weight j in its low nibble and of weight j + 16 in its high
//! ```
//! The kernels compute the codebook as a polynomial ([`nl_poly`], exact at every index after rounding to the
//! nearest integer) instead of a table lookup: on lavapipe a per-lane table index is a scalar loop.

use super::{check_blocks, f32_to_f16, read_f16};
use crate::error::Result;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the 16 nibble-pair bytes.
pub const QS_OFFSET: usize = 2;

/// ggml's `kvalues_iq4nl`: the codebook (shared with IQ4_XS).
pub const KVALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Coefficients c0..c4 of the quartic that the kernels round to the codebook (`NL_C*` in
/// shaders/lib/quant_nl.wgsl): `KVALUES[q] = round(c0 + q (c1 + q (c2 + q (c3 + q c4))))`, its error at most 0.433
/// at every q (the minimax quartic over the 16 indices, by Lawson's algorithm) (a unit test checks the f32 evaluation, with margin for another evaluation order).
pub const NL_POLY: [f32; 5] = [-126.56701, 24.17383, -1.371_927, 0.031_086_44, 0.001_586_042_8];

/// The polynomial of [`NL_POLY`] at `q`, in f32 (Horner with fused multiply-adds, as the kernels may compute it).
pub fn nl_poly(q: f32) -> f32 {
    let c = NL_POLY;
    q.mul_add(q.mul_add(q.mul_add(q.mul_add(c[4], c[3]), c[2]), c[1]), c[0])
}

/// Dequantizes whole blocks into `out` (`out.len() == bytes.len() / 18 * 32`), as ggml's `dequantize_row_iq4_nl`.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("IQ4_NL", out.len(), QK)?;
    check_blocks("IQ4_NL bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(read_f16(b, D_OFFSET), &b[QS_OFFSET..QS_OFFSET + 16], y);
    }
    Ok(())
}

/// The 32 weights of nibble bytes `qs` with scale `d` (IQ4_NL blocks and IQ4_XS sub-blocks).
pub fn dequantize_block(d: f32, qs: &[u8], y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * KVALUES[(qs[j] & 0x0f) as usize] as f32;
        y[j + 16] = d * KVALUES[(qs[j] >> 4) as usize] as f32;
    }
}

/// The codebook index nearest to `v` (ties to the lower index).
pub fn nearest(v: f32) -> u8 {
    let mut best = 0;
    for (i, &k) in KVALUES.iter().enumerate() {
        if (v - k as f32).abs() < (v - KVALUES[best] as f32).abs() {
            best = i;
        }
    }
    best as u8
}

/// Round-to-nearest quantization (simpler than ggml's `quantize_iq4_nl`, which searches the scale): the scale maps
/// the value of largest magnitude (sign kept) to -127, each weight goes to the nearest codebook entry of x / d.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("IQ4_NL", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let max = xb.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(max / -127.0).to_le_bytes());
        let d = read_f16(b, D_OFFSET);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for j in 0..16 {
            b[QS_OFFSET + j] = nearest(xb[j] * id) | (nearest(xb[j + 16] * id) << 4);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_polynomial_rounds_to_the_codebook_with_margin() {
        for (q, &k) in KVALUES.iter().enumerate() {
            let p = nl_poly(q as f32);
            let unfused = NL_POLY.iter().rev().fold(0f32, |a, &c| a * q as f32 + c);
            for v in [p, unfused] {
                assert_eq!(v.round(), k as f32, "q {q}: {v}");
                assert!((v - k as f32).abs() < 0.44, "q {q}: {v} too close to a rounding edge");
            }
        }
    }

    #[test]
    fn dequantize_hand_block() {
        // d = 0.5, qs[j] = j | (15 - j) << 4: weight j is KVALUES[j], weight j + 16 is KVALUES[15 - j].
        let mut b = vec![0u8; BLOCK_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        for j in 0..16 {
            b[2 + j] = j as u8 | ((15 - j as u8) << 4);
        }
        let mut y = vec![0f32; 32];
        dequantize_into(&b, &mut y).unwrap();
        assert_eq!((y[0], y[7], y[8], y[15]), (-63.5, -5.0, 0.5, 56.5));
        assert_eq!((y[16], y[31]), (56.5, -63.5));
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let mut y = vec![0f32; 64];
        dequantize_into(&quantize(&x).unwrap(), &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // |x| <= 1.25, d = 1.25 / 127 (the largest magnitude is negative here): half the widest gap (24 d) is 0.12,
        // but values past the top entry (113 d, where -d * 127 would be 127) clamp to it: (127 - 113) d = 0.138.
        assert!(max < 0.14, "max error {max}");
    }
}
