//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32. Each sub-block `s` has a 6-bit scale `sc[s]` and a 6-bit
//! min `m[s]`, themselves scaled by the super-block's f16 `d` and `dmin`: `x = d * sc[s] * q - dmin * m[s]`, q in
//! 0..=15.
//!
//! Block layout (144 bytes, ggml's `block_q4_K`):
//! ```text
//! bytes 0..2     d       f16, little-endian
//! bytes 2..4     dmin    f16, little-endian
//! bytes 4..16    scales  8 scales and 8 mins of 6 bits (see `scale_min`)
//! bytes 16..144  qs      128 bytes in 4 groups of 32: byte l of group c holds weight l of sub-block 2c in its low
//!                        nibble and weight l of sub-block 2c + 1 in its high nibble
//! ```
//!
//! For the GPU, a super-block is repacked into 8 blocks of 32 weights ([`to_blocks32`]): the sub-block's two 6-bit
//! codes, the super-block's `d` and `dmin` (stored once per 256 weights on the device, see `quant::pack`), and the
//! nibbles in Q4_1's order; the kernels form `d * sc` and `dmin * m` in f32, exactly ggml's values.

use super::{check_blocks, f32_to_f16, read_f16, QK_K};
use crate::error::{Error, Result};

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 144;
/// Byte offset of the f16 super-block scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 super-block min scale `dmin`.
pub const DMIN_OFFSET: usize = 2;
/// Byte offset of the 12 bytes of packed 6-bit scales and mins.
pub const SCALES_OFFSET: usize = 4;
/// Byte offset of the 128 nibble bytes.
pub const QS_OFFSET: usize = 16;

/// The 6-bit (scale, min) of sub-block `s` (0..8) from the 12 packed bytes (ggml's `get_scale_min_k4`):
/// ```text
/// bytes 0..4   low 6 bits: sc[0..4]; top 2 bits: bits 4..6 of sc[4..8]
/// bytes 4..8   low 6 bits: m[0..4];  top 2 bits: bits 4..6 of m[4..8]
/// bytes 8..12  low nibble: bits 0..4 of sc[4..8]; high nibble: bits 0..4 of m[4..8]
/// ```
pub fn scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        (
            (scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4),
            (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4),
        )
    }
}

/// Packs 8 scales and 8 mins (each 0..=63) into the 12-byte form [`scale_min`] reads.
pub fn pack_scales_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for s in 0..4 {
        b[s] = (sc[s] & 63) | ((sc[s + 4] >> 4) << 6);
        b[s + 4] = (m[s] & 63) | ((m[s + 4] >> 4) << 6);
        b[s + 8] = (sc[s + 4] & 0x0f) | ((m[s + 4] & 0x0f) << 4);
    }
    b
}

/// Dequantizes whole super-blocks into `out` (`out.len() == bytes.len() / 144 * 256`), as ggml's
/// `dequantize_row_q4_K`: `(d * sc) * q - dmin * m` in f32.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q4_K", out.len(), QK_K)?;
    check_blocks("Q4_K bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, D_OFFSET), read_f16(b, DMIN_OFFSET));
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        for (s, ys) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min(scales, s);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            let group = &b[QS_OFFSET + 32 * (s / 2)..QS_OFFSET + 32 * (s / 2) + 32];
            for (o, &q) in ys.iter_mut().zip(group) {
                let nib = if s.is_multiple_of(2) { q & 0x0f } else { q >> 4 };
                *o = d1 * nib as f32 - m1;
            }
        }
    }
    Ok(())
}

/// The f16 bits of a sub-block constant, or an error when it does not fit an f16 (never the case for a real model:
/// `d` and `dmin` are f16 and the factors are at most 63, so this needs |d| > 1039).
pub(super) fn f16_constant(ty: &str, v: f32) -> Result<[u8; 2]> {
    let h = half::f16::from_f32(v);
    if !h.is_finite() {
        return Err(Error::Invalid(format!(
            "{ty} sub-block constant {v} is not finite in f16: the block cannot be repacked for the GPU"
        )));
    }
    Ok(f32_to_f16(v).to_le_bytes())
}

/// Bytes of one 32-weight host block of [`to_blocks32`]: the 16-bit code (`sc | m << 8`), the super-block's f16 `d`
/// and `dmin` (repeated in each of its 8 blocks), 2 bytes of padding, then the 16 nibble bytes in Q4_1's order.
pub const BLOCK32_BYTES: usize = 24;
/// Byte offset of the nibbles in a host block.
pub const BLOCK32_Q: usize = 8;

/// Repacks whole super-blocks into the 32-weight host blocks the packer reads (8 per super-block, see
/// [`BLOCK32_BYTES`]): the kernels form `d * sc` and `dmin * m` in f32 from the codes and factors, exactly ggml's
/// values. The nibbles are reordered to Q4_1's order (byte j: weight j low, j + 16 high).
pub fn to_blocks32(bytes: &[u8]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q4_K bytes", bytes.len(), BLOCK_BYTES)?;
    let mut out = vec![0u8; nb * 8 * BLOCK32_BYTES];
    for (b, o) in bytes
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(8 * BLOCK32_BYTES))
    {
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        for (s, blk) in o.chunks_exact_mut(BLOCK32_BYTES).enumerate() {
            let (sc, m) = scale_min(scales, s);
            blk[0] = sc;
            blk[1] = m;
            blk[2..6].copy_from_slice(&b[D_OFFSET..D_OFFSET + 4]);
            let group = &b[QS_OFFSET + 32 * (s / 2)..QS_OFFSET + 32 * (s / 2) + 32];
            for j in 0..16 {
                let (lo, hi) = if s.is_multiple_of(2) {
                    (group[j] & 0x0f, group[j + 16] & 0x0f)
                } else {
                    (group[j] >> 4, group[j + 16] >> 4)
                };
                blk[BLOCK32_Q + j] = lo | (hi << 4);
            }
        }
    }
    Ok(out)
}

/// Per sub-block of 32: RTN over `[min(lo, 0), hi]` with `levels` steps. Returns (scales, mins) as floats, the
/// mins positive (`x ~ scale * q - min`), as ggml's k-quant reference quantizers arrange them.
pub(super) fn sub_block_ranges(x: &[f32], levels: f32) -> ([f32; 8], [f32; 8]) {
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    for (s, xs) in x.chunks_exact(32).enumerate() {
        let lo = xs.iter().fold(0f32, |a, &v| a.min(v));
        let hi = xs.iter().fold(lo, |a, &v| a.max(v));
        scales[s] = (hi - lo) / levels;
        mins[s] = -lo;
    }
    (scales, mins)
}

/// 6-bit codes of `v` relative to their maximum, and the f16 super-block factor (`max / 63`).
/// Writes a super-block's `d`, `dmin` and 6-bit scale and min codes for round-to-nearest over `levels` steps per
/// sub-block (Q4_K and Q5_K share the header layout); returns the codes and the stored `d`, `dmin` as f32.
pub(super) fn write_constants(xb: &[f32], b: &mut [u8], levels: f32) -> ([u8; 8], [u8; 8], f32, f32) {
    let (scales, mins) = sub_block_ranges(xb, levels);
    let (ls, d) = six_bit(&scales);
    let (lm, dmin) = six_bit(&mins);
    b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&d.to_le_bytes());
    b[DMIN_OFFSET..DMIN_OFFSET + 2].copy_from_slice(&dmin.to_le_bytes());
    b[SCALES_OFFSET..SCALES_OFFSET + 12].copy_from_slice(&pack_scales_mins(&ls, &lm));
    let (d, dmin) = (read_f16(b, D_OFFSET), read_f16(b, DMIN_OFFSET));
    (ls, lm, d, dmin)
}

pub(super) fn six_bit(v: &[f32; 8]) -> ([u8; 8], u16) {
    let max = v.iter().fold(0f32, |a, &b| a.max(b));
    let inv = if max > 0.0 { 63.0 / max } else { 0.0 };
    let codes = v.map(|s| ((inv * s).round_ties_even() as i32).clamp(0, 63) as u8);
    (codes, f32_to_f16(max / 63.0))
}

/// Quantizes whole super-blocks round-to-nearest (a simpler cousin of ggml's `quantize_row_q4_K_ref`, which searches
/// for better scales): per sub-block, the range `[min(lo, 0), hi]` over 15 steps; scales and mins to 6 bits of the
/// largest; then each weight to the nearest of the 16 levels the stored constants give.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q4_K", x.len(), QK_K)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let (ls, lm, d, dmin) = write_constants(xb, b, 15.0);
        let mut q = [0u8; QK_K];
        for (s, xs) in xb.chunks_exact(32).enumerate() {
            let (step, off) = (d * ls[s] as f32, dmin * lm[s] as f32);
            if step == 0.0 {
                continue;
            }
            for (l, &v) in xs.iter().enumerate() {
                q[32 * s + l] = (((v + off) / step).round_ties_even() as i32).clamp(0, 15) as u8;
            }
        }
        for c in 0..4 {
            for l in 0..32 {
                b[QS_OFFSET + 32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
            }
        }
    }
    Ok(out)
}

/// Dequantizes host blocks of [`to_blocks32`]'s form (`d * sc * q - dmin * m`, the factors formed in f32 as the
/// kernels form them): the weights the GPU computes with, for the check mode's matmul reference.
pub fn dequantize_blocks32(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q4_K host blocks", bytes.len(), BLOCK32_BYTES)?;
    if out.len() != nb * 32 {
        return Err(Error::Invalid(format!(
            "{nb} Q4_K host blocks hold {} weights, not {}",
            nb * 32,
            out.len()
        )));
    }
    for (blk, o) in bytes.chunks_exact(BLOCK32_BYTES).zip(out.chunks_exact_mut(32)) {
        let scale = read_f16(blk, 2) * blk[0] as f32;
        let min = read_f16(blk, 4) * blk[1] as f32;
        for j in 0..16 {
            let q = blk[BLOCK32_Q + j];
            o[j] = scale * (q & 0x0f) as f32 - min;
            o[j + 16] = scale * (q >> 4) as f32 - min;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made super-block: d = 0.5, dmin = 0.25, qs[i] = i, and scale bytes giving
    /// sc = [1, 2, 3, 4, 1, 3, 5, 23], m = [5, 6, 7, 8, 2, 4, 6, 56] (sc[7] and m[7] use the top bits of bytes 3, 7).
    pub(crate) fn hand_block() -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        b[4..16].copy_from_slice(&[1, 2, 3, 0x44, 5, 6, 7, 0xC8, 0x21, 0x43, 0x65, 0x87]);
        for (i, q) in b[QS_OFFSET..].iter_mut().enumerate() {
            *q = i as u8;
        }
        b
    }

    #[test]
    fn scale_bytes_decode_by_hand() {
        let b = hand_block();
        let got: Vec<(u8, u8)> = (0..8).map(|s| scale_min(&b[4..16], s)).collect();
        assert_eq!(got, [(1, 5), (2, 6), (3, 7), (4, 8), (1, 2), (3, 4), (5, 6), (23, 56)]);
        let (sc, m): (Vec<u8>, Vec<u8>) = got.into_iter().unzip();
        assert_eq!(
            pack_scales_mins(&sc.try_into().unwrap(), &m.try_into().unwrap()),
            b[4..16]
        );
    }

    #[test]
    fn dequantize_hand_block() {
        let mut y = vec![0f32; 256];
        dequantize_into(&hand_block(), &mut y).unwrap();
        // weight: sub-block, byte, nibble -> 0.5 * sc * q - 0.25 * m
        assert_eq!(y[0], -1.25); // s0, qs[0] low 0: -0.25 * 5
        assert_eq!(y[31], 6.25); // s0, qs[31] low 15: 0.5 * 1 * 15 - 1.25
        assert_eq!(y[32], -1.5); // s1, qs[0] high 0: -0.25 * 6
        assert_eq!(y[63], -0.5); // s1, qs[31] high 1: 0.5 * 2 * 1 - 1.5
        assert_eq!(y[69], 5.75); // s2, qs[37] low 5: 0.5 * 3 * 5 - 0.25 * 7
        assert_eq!(y[138], 4.5); // s4, qs[74] = 0x4A low 10: 0.5 * 1 * 10 - 0.25 * 2
        assert_eq!(y[170], 5.0); // s5, qs[74] high 4: 0.5 * 3 * 4 - 0.25 * 4
        assert_eq!(y[224], 55.0); // s7, qs[96] = 0x60 high 6: 0.5 * 23 * 6 - 0.25 * 56
        assert_eq!(y[255], 66.5); // s7, qs[127] = 0x7F high 7: 0.5 * 23 * 7 - 14
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let b = quantize(&x).unwrap();
        let mut y = vec![0f32; 512];
        dequantize_into(&b, &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // Range 2.5 over 15 steps: half a step is 0.083, plus the 6-bit rounding of scale and min.
        assert!(max < 0.12, "max error {max}");
    }
}
