//! Q5_K: Q4_K with a fifth quant bit. Super-blocks of 256 weights in 8 sub-blocks of 32 with 6-bit scales and mins
//! (packed as in Q4_K): `x = d * sc[s] * q - dmin * m[s]`, q in 0..=31.
//!
//! Block layout (176 bytes, ggml's `block_q5_K`):
//! ```text
//! bytes 0..2     d       f16, little-endian
//! bytes 2..4     dmin    f16, little-endian
//! bytes 4..16    scales  8 scales and 8 mins of 6 bits (`q4_k::scale_min`)
//! bytes 16..48   qh      byte l: bit s is the high bit (16) of weight l of sub-block s
//! bytes 48..176  qs      low 4 bits, as Q4_K's qs: byte l of group c, low nibble sub-block 2c, high 2c + 1
//! ```
//!
//! For the GPU a super-block is repacked into 8 Q5_1 blocks of 32 (`to_q5_1`, 24 bytes each: 1.09x the file's 22
//! per 32 weights): `d = d * sc[s]`, `m = -dmin * m[s]`, the 5-bit quants unchanged. Both constants are exact in
//! f32 and rounded once to f16 (relative error at most 2^-11).

use super::q4_k::{f16_constant, scale_min, write_constants};
use super::{check_blocks, q5_0, q5_1, read_f16, QK_K};
use crate::error::Result;

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 176;
pub const D_OFFSET: usize = 0;
pub const DMIN_OFFSET: usize = 2;
pub const SCALES_OFFSET: usize = 4;
pub const QH_OFFSET: usize = 16;
pub const QS_OFFSET: usize = 48;

/// The 5-bit quant of weight `l` of sub-block `s` of super-block `b`.
fn quant(b: &[u8], s: usize, l: usize) -> u8 {
    let q = b[QS_OFFSET + 32 * (s / 2) + l];
    let low = if s.is_multiple_of(2) { q & 0x0f } else { q >> 4 };
    low | (((b[QH_OFFSET + l] >> s) & 1) << 4)
}

/// Dequantizes whole super-blocks into `out` (`out.len() == bytes.len() / 176 * 256`), as ggml's
/// `dequantize_row_q5_K`: `(d * sc) * q - dmin * m` in f32.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q5_K", out.len(), QK_K)?;
    check_blocks("Q5_K bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, D_OFFSET), read_f16(b, DMIN_OFFSET));
        for (s, ys) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min(&b[SCALES_OFFSET..SCALES_OFFSET + 12], s);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            for (l, o) in ys.iter_mut().enumerate() {
                *o = d1 * quant(b, s, l) as f32 - m1;
            }
        }
    }
    Ok(())
}

/// Repacks whole super-blocks into Q5_1 blocks (8 per super-block) as the module doc says.
pub fn to_q5_1(bytes: &[u8]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q5_K bytes", bytes.len(), BLOCK_BYTES)?;
    let bb = q5_1::BLOCK_BYTES;
    let mut out = vec![0u8; nb * 8 * bb];
    for (b, o) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(8 * bb)) {
        let (d, dmin) = (read_f16(b, D_OFFSET), read_f16(b, DMIN_OFFSET));
        for (s, blk) in o.chunks_exact_mut(bb).enumerate() {
            let (sc, m) = scale_min(&b[SCALES_OFFSET..SCALES_OFFSET + 12], s);
            blk[q5_1::D_OFFSET..q5_1::D_OFFSET + 2].copy_from_slice(&f16_constant("Q5_K", d * sc as f32)?);
            blk[q5_1::M_OFFSET..q5_1::M_OFFSET + 2].copy_from_slice(&f16_constant("Q5_K", 0.0 - dmin * m as f32)?);
            let q: [u8; 32] = std::array::from_fn(|l| quant(b, s, l));
            let qh = q5_0::pack5(&q, &mut blk[q5_1::QS_OFFSET..]);
            blk[q5_1::QH_OFFSET..q5_1::QH_OFFSET + 4].copy_from_slice(&qh.to_le_bytes());
        }
    }
    Ok(out)
}

/// Quantizes whole super-blocks round-to-nearest, as `q4_k::quantize` with 31 steps per sub-block.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q5_K", x.len(), QK_K)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let (ls, lm, d, dmin) = write_constants(xb, b, 31.0);
        for (s, xs) in xb.chunks_exact(32).enumerate() {
            let (step, off) = (d * ls[s] as f32, dmin * lm[s] as f32);
            for (l, &v) in xs.iter().enumerate() {
                let q = if step == 0.0 {
                    0
                } else {
                    (((v + off) / step).round_ties_even() as i32).clamp(0, 31) as u8
                };
                b[QS_OFFSET + 32 * (s / 2) + l] |= (q & 0x0f) << (4 * (s % 2));
                b[QH_OFFSET + l] |= (q >> 4) << s;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::f32_to_f16;

    /// The Q4_K hand block's constants (d = 0.5, dmin = 0.25, sc = [1, 2, 3, 4, 1, 3, 5, 23],
    /// m = [5, 6, 7, 8, 2, 4, 6, 56]), qs[i] = i, and qh[l] = 0xA5 (high bit set for sub-blocks 0, 2, 5, 7).
    fn hand_block() -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        b[4..16].copy_from_slice(&[1, 2, 3, 0x44, 5, 6, 7, 0xC8, 0x21, 0x43, 0x65, 0x87]);
        b[16..48].fill(0xA5);
        for (i, q) in b[48..].iter_mut().enumerate() {
            *q = i as u8;
        }
        b
    }

    #[test]
    fn dequantize_hand_block() {
        let mut y = vec![0f32; 256];
        dequantize_into(&hand_block(), &mut y).unwrap();
        assert_eq!(y[0], 6.75); // s0: qs[0] low 0 + 16 (qh bit 0) = 16: 0.5 * 1 * 16 - 0.25 * 5
        assert_eq!(y[32], -1.5); // s1: qs[0] high 0, qh bit 1 clear: -0.25 * 6
        assert_eq!(y[69], 29.75); // s2: qs[37] low 5 + 16 = 21: 0.5 * 3 * 21 - 0.25 * 7
        assert_eq!(y[170], 29.0); // s5: qs[74] = 0x4A high 4 + 16 = 20: 0.5 * 3 * 20 - 0.25 * 4
        assert_eq!(y[200], 18.5); // s6: qs[104] = 0x68 low 8, qh bit 6 clear: 0.5 * 5 * 8 - 0.25 * 6
        assert_eq!(y[255], 250.5); // s7: qs[127] high 7 + 16 = 23: 264.5 - 14
    }

    #[test]
    fn blocks32_repack_gives_the_same_values_here() {
        let b = hand_block();
        let mut want = vec![0f32; 256];
        dequantize_into(&b, &mut want).unwrap();
        let r = to_q5_1(&b).unwrap();
        let mut got = vec![0f32; 256];
        q5_1::dequantize_into(&r, &mut got).unwrap();
        assert_eq!(got, want);
        assert_eq!(r[4] & 1, 1, "weight 0 of sub-block 0 has its high bit");
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let b = quantize(&x).unwrap();
        let mut y = vec![0f32; 512];
        dequantize_into(&b, &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // Range 2.5 over 31 steps: half a step is 0.04, plus the 6-bit rounding of scale and min.
        assert!(max < 0.07, "max error {max}");
    }
}
