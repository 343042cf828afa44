//! Q2_K: super-blocks of 256 weights in 16 sub-blocks of 16. Each sub-block `s` has a 4-bit scale code `sc[s]` and
//! a 4-bit min code `m[s]` (one byte: scale in the low nibble, min in the high one), scaled by the super-block's f16
//! `d` and `dmin`: `x = d * sc[s] * q - dmin * m[s]`, q in 0..=3.
//!
//! Block layout (84 bytes, ggml's `block_q2_K`). Weight `w = 128 h + 32 j + 16 t + l` (half h 0..2, bit pair j 0..4,
//! sub-block half t 0..2, l 0..16) is sub-block `w / 16` and has:
//! ```text
//! bytes 0..16    scales  byte s: sc[s] (low nibble), m[s] (high nibble)
//! bytes 16..80   qs      q of weight w: bits 2j..2j+2 of byte 16 + 32 h + 16 t + l
//! bytes 80..82   d       f16, little-endian
//! bytes 82..84   dmin    f16, little-endian
//! ```
//!
//! For the GPU (`to_blocks32`, read by `pack`), each 32-weight block keeps its two sub-block code bytes and the
//! super-block factors stored once per 256 weights on the device, with the quants as two 2-bit words (16 weights
//! each) in the order the kernels mask in place; 10.5 device bytes per 32 weights, as in the file. The host form
//! of one 32-weight block (16 bytes; `d` and `dmin` repeated in each of a super-block's 8 blocks):
//! ```text
//! bytes 0..2    code  u16: scale byte of weights 0..16 (low byte), of weights 16..32 (high byte)
//! bytes 2..4    d     f16 (the super-block's)
//! bytes 4..6    dmin  f16 (the super-block's)
//! bytes 6..8    0
//! bytes 8..16   q     two u32 words, little-endian: word t, bits 8b + 2i..8b + 2i + 2 hold q of weight 16 t + 4 i + b
//! ```
//! The kernels form `d * sc` and `dmin * m` in f32, exactly (an f16 times a 4-bit integer), so they compute with
//! ggml's values, not a rounding of them.

use super::{check_blocks, f32_to_f16, read_f16, QK_K};
use crate::error::{Error, Result};

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 84;
/// Byte offsets of the 16 scale bytes, the 64 quant bytes and the f16 factors.
pub const SCALES_OFFSET: usize = 0;
pub const QS_OFFSET: usize = 16;
pub const D_OFFSET: usize = 80;
pub const DMIN_OFFSET: usize = 82;

/// Bytes of one host 32-weight block (see the module doc) and the offset of its quant words.
pub const BLOCK32_BYTES: usize = 16;
pub const BLOCK32_Q: usize = 8;

/// The 2-bit quant of weight `w` (0..256) of super-block `b`.
fn quant(b: &[u8], w: usize) -> u8 {
    let (h, j, tl) = (w / 128, w % 128 / 32, w % 32);
    (b[QS_OFFSET + 32 * h + tl] >> (2 * j)) & 3
}

/// Dequantizes whole super-blocks into `out` (`out.len() == bytes.len() / 84 * 256`), as ggml's
/// `dequantize_row_q2_K`: `(d * sc) * q - dmin * m` in f32.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q2_K", out.len(), QK_K)?;
    check_blocks("Q2_K bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, D_OFFSET), read_f16(b, DMIN_OFFSET));
        for (w, o) in y.iter_mut().enumerate() {
            let code = b[SCALES_OFFSET + w / 16];
            let (dl, ml) = (d * (code & 15) as f32, dmin * (code >> 4) as f32);
            *o = dl * quant(b, w) as f32 - ml;
        }
    }
    Ok(())
}

/// Repacks whole super-blocks into the host 32-weight blocks of the module doc (8 per super-block).
pub fn to_blocks32(bytes: &[u8]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q2_K bytes", bytes.len(), BLOCK_BYTES)?;
    let mut out = vec![0u8; nb * 8 * BLOCK32_BYTES];
    for (b, o) in bytes
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(8 * BLOCK32_BYTES))
    {
        for (blk_i, blk) in o.chunks_exact_mut(BLOCK32_BYTES).enumerate() {
            blk[0] = b[SCALES_OFFSET + 2 * blk_i];
            blk[1] = b[SCALES_OFFSET + 2 * blk_i + 1];
            blk[2..4].copy_from_slice(&b[D_OFFSET..D_OFFSET + 2]);
            blk[4..6].copy_from_slice(&b[DMIN_OFFSET..DMIN_OFFSET + 2]);
            let words = quant_words(|l| quant(b, 32 * blk_i + l));
            for (t, w) in words.iter().enumerate() {
                blk[BLOCK32_Q + 4 * t..BLOCK32_Q + 4 * t + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
    }
    Ok(out)
}

/// The two 2-bit device words of a 32-weight block whose weight `l` has quant `q(l)` (0..4): word t, bits
/// 8b + 2i..8b + 2i + 2 hold weight 16 t + 4 i + b. Shared with Q3_K.
pub(super) fn quant_words(q: impl Fn(usize) -> u8) -> [u32; 2] {
    let mut w = [0u32; 2];
    for l in 0..32 {
        let (t, i, b) = (l / 16, l % 16 / 4, l % 4);
        w[t] |= ((q(l) & 3) as u32) << (8 * b + 2 * i);
    }
    w
}

/// The 2-bit field of weight `l` (0..32) in a host 32-weight block's quant words (the inverse of [`quant_words`]).
/// Shared with Q3_K.
pub(super) fn block32_quant(blk: &[u8], l: usize) -> u8 {
    let (t, i, b) = (l / 16, l % 16 / 4, l % 4);
    (blk[BLOCK32_Q + 4 * t + b] >> (2 * i)) & 3
}

/// The host 32-weight blocks of `ty` (`block_bytes` each) paired with their 32 outputs, once the counts agree.
/// Shared with Q3_K.
pub(super) fn blocks32_with<'a>(
    ty: &str,
    bytes: &'a [u8],
    block_bytes: usize,
    out: &'a mut [f32],
) -> Result<impl Iterator<Item = (&'a [u8], &'a mut [f32])>> {
    let nb = check_blocks(&format!("{ty} host blocks"), bytes.len(), block_bytes)?;
    if check_blocks(&format!("{ty} host weights"), out.len(), 32)? != nb {
        return Err(Error::Invalid(format!(
            "{nb} {ty} host blocks for {} weights",
            out.len()
        )));
    }
    Ok(bytes.chunks_exact(block_bytes).zip(out.chunks_exact_mut(32)))
}

/// Dequantizes host 32-weight blocks of the module doc's form (`out.len() == bytes.len() / 16 * 32`), with the
/// factors formed in f32 as the kernels form them (ggml's values): for the check mode's matmul reference.
pub fn dequantize_blocks32(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    for (blk, o) in blocks32_with("Q2_K", bytes, BLOCK32_BYTES, out)? {
        let (d, dmin) = (read_f16(blk, 2), read_f16(blk, 4));
        for (l, v) in o.iter_mut().enumerate() {
            let code = blk[l / 16];
            *v = d * (code & 15) as f32 * block32_quant(blk, l) as f32 - dmin * (code >> 4) as f32;
        }
    }
    Ok(())
}

/// Quantizes whole super-blocks round-to-nearest (simpler than ggml's `quantize_row_q2_K_ref`, which searches for
/// better scales): per sub-block of 16, the range `[min(lo, 0), hi]` over 3 steps; scales and mins to 4 bits of
/// their largest (`d = max scale / 15`, `dmin = max min / 15`); then each weight to the nearest of the 4 levels the
/// stored constants give.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q2_K", x.len(), QK_K)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        for (s, xs) in xb.chunks_exact(16).enumerate() {
            let lo = xs.iter().fold(0f32, |a, &v| a.min(v));
            let hi = xs.iter().fold(lo, |a, &v| a.max(v));
            scales[s] = (hi - lo) / 3.0;
            mins[s] = -lo;
        }
        let four_bit = |v: &[f32; 16]| {
            let max = v.iter().fold(0f32, |a, &b| a.max(b));
            let inv = if max > 0.0 { 15.0 / max } else { 0.0 };
            (
                v.map(|s| ((inv * s).round_ties_even() as i32).clamp(0, 15) as u8),
                f32_to_f16(max / 15.0),
            )
        };
        let (ls, d) = four_bit(&scales);
        let (lm, dmin) = four_bit(&mins);
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&d.to_le_bytes());
        b[DMIN_OFFSET..DMIN_OFFSET + 2].copy_from_slice(&dmin.to_le_bytes());
        for s in 0..16 {
            b[SCALES_OFFSET + s] = ls[s] | (lm[s] << 4);
        }
        let (d, dmin) = (read_f16(b, D_OFFSET), read_f16(b, DMIN_OFFSET));
        for (w, &v) in xb.iter().enumerate() {
            let s = w / 16;
            let (step, off) = (d * ls[s] as f32, dmin * lm[s] as f32);
            let q = if step == 0.0 {
                0
            } else {
                (((v + off) / step).round_ties_even() as i32).clamp(0, 3) as u8
            };
            let (h, j, tl) = (w / 128, w % 128 / 32, w % 32);
            b[QS_OFFSET + 32 * h + tl] |= q << (2 * j);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made super-block: d = 0.5, dmin = 0.25, scale byte s = (s + 1) | (15 - s) << 4, qs[i] = i * 37 mod 256.
    fn hand_block() -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        for (s, c) in b[SCALES_OFFSET..SCALES_OFFSET + 16].iter_mut().enumerate() {
            *c = (s as u8 + 1) | ((15 - s as u8) << 4);
        }
        for i in 0..64 {
            b[QS_OFFSET + i] = (i * 37 % 256) as u8;
        }
        b[80..82].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        b[82..84].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        b
    }

    #[test]
    fn dequantize_hand_block() {
        let mut y = vec![0f32; 256];
        dequantize_into(&hand_block(), &mut y).unwrap();
        // weight w: sub-block w / 16 (sc = s + 1, m = 15 - s), qs byte 32 h + (w % 32), bits 2 ((w % 128) / 32).
        // w 0: s 0, qs[0] = 0 -> -0.25 * 15.
        assert_eq!(y[0], -3.75);
        // w 17: s 1 (sc 2, m 14), qs[17] = 629 % 256 = 117 = 0b01110101, bits 0..2 = 1: 0.5 * 2 * 1 - 3.5.
        assert_eq!(y[17], -2.5);
        // w 50: s 3 (sc 4, m 12), qs[18] = 666 % 256 = 154 = 0b10011010, bits 2..4 = 2: 0.5 * 4 * 2 - 3.
        assert_eq!(y[50], 1.0);
        // w 200: s 12 (sc 13, m 3), h 1, j 2, qs[32 + 8] = 1480 % 256 = 200 = 0b11001000, bits 4..6 = 0: -0.75.
        assert_eq!(y[200], -0.75);
        // w 255: s 15, scale byte 16 = 0x10 (sc 0, m 1): -0.25 whatever q is.
        assert_eq!(y[255], -0.25);
        // w 239: s 14 (sc 15, m 1), h 1, j 3, qs[32 + 15] = 1739 % 256 = 203 = 0b11001011, bits 6..8 = 3: 22.25.
        assert_eq!(y[239], 22.25);
    }

    #[test]
    fn blocks32_keep_codes_factors_and_quants() {
        let b = hand_block();
        let r = to_blocks32(&b).unwrap();
        assert_eq!(r.len(), 8 * BLOCK32_BYTES);
        // Block 5 (weights 160..192: h 1, j 1): codes of sub-blocks 10, 11; q word 1 field (i, b) = weight
        // 176 + 4 i + b from qs[32 + 16 + 4 i + b] bits 2..4.
        let blk = &r[5 * BLOCK32_BYTES..6 * BLOCK32_BYTES];
        assert_eq!(blk[0..2], [b[10], b[11]]);
        assert_eq!(blk[2..6], b[80..84]);
        let w1 = u32::from_le_bytes(blk[12..16].try_into().unwrap());
        for (i, bb) in [(0, 0), (2, 3), (3, 1)] {
            let want = (b[QS_OFFSET + 48 + 4 * i + bb] >> 2) & 3;
            assert_eq!((w1 >> (8 * bb + 2 * i)) & 3, want as u32, "field {i} {bb}");
        }
        // The host blocks decode to ggml's values, weight for weight.
        let (mut want, mut got) = (vec![0f32; 256], vec![0f32; 256]);
        dequantize_into(&b, &mut want).unwrap();
        dequantize_blocks32(&r, &mut got).unwrap();
        assert_eq!(got, want);
        assert!(dequantize_blocks32(&r, &mut got[..224]).is_err());
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let b = quantize(&x).unwrap();
        let mut y = vec![0f32; 512];
        dequantize_into(&b, &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // Range 2.5 over 3 steps: half a step is 0.42, plus the 4-bit rounding of scale and min (up to half a
        // code, 1/30 of the largest, times 3 steps and the min).
        assert!(max < 0.7, "max error {max}");
    }
}
