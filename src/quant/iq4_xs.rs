//! IQ4_XS: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale code `ls` times the
//! super-block's f16 `d`, the weights as IQ4_NL codebook indices: `x = d * (ls - 32) * KVALUES[q]`.
//!
//! Block layout (136 bytes, ggml's `block_iq4_xs`):
//! ```text
//! bytes 0..2     d         f16, little-endian
//! bytes 2..4     scales_h  u16, little-endian: bits 2 ib..2 ib + 2 are the high 2 bits of sub-block ib's ls
//! bytes 4..8     scales_l  byte ib / 2, nibble ib % 2 (low first): the low 4 bits of ls
//! bytes 8..136   qs        16 bytes per sub-block, in IQ4_NL's (Q4_0's) nibble order
//! ```
//!
//! For the GPU a super-block is repacked into 8 IQ4_NL blocks (`to_iq4_nl`, 18 bytes per 32 weights: 1.06x the
//! file's 17) with `d' = d * (ls - 32)`, exact in f32 and rounded once to f16 (relative error at most 2^-11, as the
//! k-quant repacks; beyond the f16 range is an error). The indices are unchanged.

use super::iq4_nl;
use super::q4_k::f16_constant;
use super::{check_blocks, f32_to_f16, read_f16, QK_K};
use crate::error::Result;

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 136;
pub const D_OFFSET: usize = 0;
pub const SCALES_H_OFFSET: usize = 2;
pub const SCALES_L_OFFSET: usize = 4;
pub const QS_OFFSET: usize = 8;

/// The 6-bit scale code `ls` (0..=63) of sub-block `ib` of super-block `b`.
pub fn scale_code(b: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([b[SCALES_H_OFFSET], b[SCALES_H_OFFSET + 1]]);
    let lo = (b[SCALES_L_OFFSET + ib / 2] >> (4 * (ib % 2))) & 0x0f;
    (lo as i32) | ((((h >> (2 * ib)) & 3) as i32) << 4)
}

/// Dequantizes whole super-blocks into `out` (`out.len() == bytes.len() / 136 * 256`), as ggml's
/// `dequantize_row_iq4_xs`: `(d * (ls - 32)) * KVALUES[q]` in f32.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("IQ4_XS", out.len(), QK_K)?;
    check_blocks("IQ4_XS bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, D_OFFSET);
        for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
            let qs = &b[QS_OFFSET + 16 * ib..QS_OFFSET + 16 * ib + 16];
            iq4_nl::dequantize_block(d * (scale_code(b, ib) - 32) as f32, qs, ys);
        }
    }
    Ok(())
}

/// Repacks whole super-blocks into IQ4_NL blocks (8 per super-block) as the module doc says.
pub fn to_iq4_nl(bytes: &[u8]) -> Result<Vec<u8>> {
    let nb = check_blocks("IQ4_XS bytes", bytes.len(), BLOCK_BYTES)?;
    let bb = iq4_nl::BLOCK_BYTES;
    let mut out = vec![0u8; nb * 8 * bb];
    for (b, o) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(8 * bb)) {
        let d = read_f16(b, D_OFFSET);
        for (ib, blk) in o.chunks_exact_mut(bb).enumerate() {
            blk[0..2].copy_from_slice(&f16_constant("IQ4_XS", d * (scale_code(b, ib) - 32) as f32)?);
            blk[2..18].copy_from_slice(&b[QS_OFFSET + 16 * ib..QS_OFFSET + 16 * ib + 16]);
        }
    }
    Ok(out)
}

/// Round-to-nearest quantization (simpler than ggml's `quantize_iq4_xs`, which searches each scale): per sub-block
/// the scale maps the value of largest magnitude (sign kept) to -127; the sub-block scales become codes
/// `ls - 32` in -32..=31 of the largest one (which maps to -32); each weight goes to the nearest codebook entry.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("IQ4_XS", x.len(), QK_K)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let absmax = |m: f32, &v: &f32| if v.abs() > m.abs() { v } else { m };
        let scales: Vec<f32> = xb
            .chunks_exact(32)
            .map(|s| s.iter().fold(0f32, absmax) / -127.0)
            .collect();
        let max = scales.iter().fold(0f32, absmax);
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(max / -32.0).to_le_bytes());
        let d = read_f16(b, D_OFFSET);
        let mut h = 0u16;
        for (ib, xs) in xb.chunks_exact(32).enumerate() {
            let ls = if d == 0.0 {
                32
            } else {
                ((scales[ib] / d).round_ties_even() as i32).clamp(-32, 31) + 32
            };
            b[SCALES_L_OFFSET + ib / 2] |= ((ls & 0x0f) as u8) << (4 * (ib % 2));
            h |= ((ls >> 4) as u16) << (2 * ib);
            let dl = d * (ls - 32) as f32;
            let id = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..16 {
                b[QS_OFFSET + 16 * ib + j] = iq4_nl::nearest(xs[j] * id) | (iq4_nl::nearest(xs[j + 16] * id) << 4);
            }
        }
        b[SCALES_H_OFFSET..SCALES_H_OFFSET + 2].copy_from_slice(&h.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantize_hand_block() {
        // d = 0.25; ls codes: sub-block 0: 0x2 | 2 << 4 = 34 (dl 0.5), sub-block 3: 0x0 | 0 << 4 = 0 (dl -8),
        // sub-block 7: 0xf | 3 << 4 = 63 (dl 7.75); the others 32 (dl 0). qs[16 ib + j] = j | (15 - j) << 4.
        let mut b = vec![0u8; BLOCK_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        let codes = [34u16, 32, 32, 0, 32, 32, 32, 63];
        let h = codes
            .iter()
            .enumerate()
            .fold(0u16, |h, (ib, c)| h | (c >> 4) << (2 * ib));
        b[2..4].copy_from_slice(&h.to_le_bytes());
        for (ib, c) in codes.iter().enumerate() {
            b[4 + ib / 2] |= ((c & 0x0f) as u8) << (4 * (ib % 2));
        }
        for ib in 0..8 {
            for j in 0..16 {
                b[8 + 16 * ib + j] = j as u8 | ((15 - j as u8) << 4);
            }
        }
        let mut y = vec![0f32; 256];
        dequantize_into(&b, &mut y).unwrap();
        assert_eq!((y[0], y[15], y[16]), (-63.5, 56.5, 56.5)); // 0.5 * -127, 0.5 * 113
        assert_eq!(y[32], 0.0);
        assert_eq!((y[96], y[104]), (1016.0, -8.0)); // -8 * -127, -8 * 1
        assert_eq!(y[255], -984.25); // 7.75 * KVALUES[0] (weight 16 + 15: high nibble 15 - 15)
        let r = to_iq4_nl(&b).unwrap();
        let mut got = vec![0f32; 256];
        iq4_nl::dequantize_into(&r, &mut got).unwrap();
        assert_eq!(got, y, "the constants here are exact in f16");
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let mut y = vec![0f32; 512];
        dequantize_into(&quantize(&x).unwrap(), &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // As IQ4_NL (half a codebook gap, 0.12) plus the 6-bit scale's rounding.
        assert!(max < 0.16, "max error {max}");
    }
}
