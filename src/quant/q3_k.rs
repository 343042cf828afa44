//! Q3_K: super-blocks of 256 weights in 16 sub-blocks of 16. Each sub-block `s` has a 6-bit scale code `sc[s]`
//! (0..64, signed by an offset of 32) times the super-block's f16 `d`: `x = d * (sc[s] - 32) * (q - 4)`, q in 0..=7
//! (3 bits: 2 in `qs`, the top one in `hmask`).
//!
//! Block layout (110 bytes, ggml's `block_q3_K`). Weight `w = 128 h + 32 j + l` (half h 0..2, bit pair j 0..4,
//! l 0..32) is sub-block `w / 16` and has:
//! ```text
//! bytes 0..32     hmask   bit 2 of q: bit 4 h + j of byte l
//! bytes 32..96    qs      bits 0..2 of q: bits 2j..2j+2 of byte 32 + 32 h + l
//! bytes 96..108   scales  16 codes of 6 bits (see `scale_code`)
//! bytes 108..110  d       f16, little-endian
//! ```
//!
//! For the GPU (`to_blocks32`, read by `pack`), each 32-weight block keeps its two 6-bit codes (the super-block's
//! `d` is stored once per 256 weights on the device), with the quants as two 2-bit words (as Q2_K's) and one
//! high-bit word in the order of `pack::hb_to_device`, which puts weight `16 t + 4 i + b`'s bit at `8 b + 4 t + i`:
//! a kernel moves the 4 bits that join 2-bit field `i` of word t with one shift and a mask. 14.25 device bytes per
//! 32 weights (1.04x the file's 13.75). The host form of one 32-weight block (20 bytes; `d` repeated in each of a
//! super-block's 8 blocks):
//! ```text
//! bytes 0..2    code  u16: 6-bit code of weights 0..16 (low byte), of weights 16..32 (high byte)
//! bytes 2..4    d     f16 (the super-block's)
//! bytes 4..8    0
//! bytes 8..16   q     two u32 words: word t, bits 8b + 2i..8b + 2i + 2 hold bits 0..2 of q of weight 16 t + 4 i + b
//! bytes 16..20  h     u32: bit 8b + 4t + i holds bit 2 of q of weight 16 t + 4 i + b
//! ```
//! The kernels form `d * (sc - 32)` in f32, exactly (an f16 times a 6-bit integer): ggml's values.

use super::q2_k::{block32_quant, blocks32_with, quant_words};
use super::{check_blocks, f32_to_f16, read_f16, QK_K};
use crate::error::Result;

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 110;
/// Byte offsets of the high bits, the low 2 bits, the 12 scale bytes and the f16 `d`.
pub const HMASK_OFFSET: usize = 0;
pub const QS_OFFSET: usize = 32;
pub const SCALES_OFFSET: usize = 96;
pub const D_OFFSET: usize = 108;

/// Bytes of one host 32-weight block (see the module doc), the offsets of its quant words and high-bit word.
pub const BLOCK32_BYTES: usize = 20;
pub const BLOCK32_Q: usize = 8;
pub const BLOCK32_H: usize = 16;

/// The 6-bit code (0..=63) of sub-block `s` (0..16) from the 12 scale bytes: its low 4 bits are the low nibble of
/// byte `s` (s < 8) or the high nibble of byte `s - 8`; its top 2 bits are bits `2 (s / 4)..2 (s / 4) + 2` of byte
/// `8 + s % 4`.
pub fn scale_code(scales: &[u8], s: usize) -> u8 {
    let low = if s < 8 { scales[s] & 15 } else { scales[s - 8] >> 4 };
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    low | (high << 4)
}

/// Packs 16 codes (each 0..=63) into the 12 bytes [`scale_code`] reads.
pub fn pack_scale_codes(codes: &[u8; 16]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for (s, &c) in codes.iter().enumerate() {
        if s < 8 {
            b[s] |= c & 15;
        } else {
            b[s - 8] |= (c & 15) << 4;
        }
        b[8 + s % 4] |= (c >> 4) << (2 * (s / 4));
    }
    b
}

/// The 3-bit quant (0..=7) of weight `w` (0..256) of super-block `b`.
fn quant(b: &[u8], w: usize) -> u8 {
    let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
    let low = (b[QS_OFFSET + 32 * h + l] >> (2 * j)) & 3;
    let high = (b[HMASK_OFFSET + l] >> (4 * h + j)) & 1;
    low | (high << 2)
}

/// Dequantizes whole super-blocks into `out` (`out.len() == bytes.len() / 110 * 256`), as ggml's
/// `dequantize_row_q3_K`: `(d * (sc - 32)) * (q - 4)` in f32.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q3_K", out.len(), QK_K)?;
    check_blocks("Q3_K bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, D_OFFSET);
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        for (w, o) in y.iter_mut().enumerate() {
            let dl = d * (scale_code(scales, w / 16) as i32 - 32) as f32;
            *o = dl * (quant(b, w) as i32 - 4) as f32;
        }
    }
    Ok(())
}

/// Repacks whole super-blocks into the host 32-weight blocks of the module doc (8 per super-block).
pub fn to_blocks32(bytes: &[u8]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q3_K bytes", bytes.len(), BLOCK_BYTES)?;
    let mut out = vec![0u8; nb * 8 * BLOCK32_BYTES];
    for (b, o) in bytes
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(8 * BLOCK32_BYTES))
    {
        let scales = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        for (bi, blk) in o.chunks_exact_mut(BLOCK32_BYTES).enumerate() {
            blk[0] = scale_code(scales, 2 * bi);
            blk[1] = scale_code(scales, 2 * bi + 1);
            blk[2..4].copy_from_slice(&b[D_OFFSET..D_OFFSET + 2]);
            let q = |l: usize| quant(b, 32 * bi + l);
            for (t, w) in quant_words(|l| q(l) & 3).iter().enumerate() {
                blk[BLOCK32_Q + 4 * t..BLOCK32_Q + 4 * t + 4].copy_from_slice(&w.to_le_bytes());
            }
            let mut h = 0u32;
            for l in 0..32 {
                let (t, i, bb) = (l / 16, l % 16 / 4, l % 4);
                h |= ((q(l) >> 2) as u32) << (8 * bb + 4 * t + i);
            }
            blk[BLOCK32_H..BLOCK32_H + 4].copy_from_slice(&h.to_le_bytes());
        }
    }
    Ok(out)
}

/// Dequantizes host 32-weight blocks of the module doc's form (`out.len() == bytes.len() / 20 * 32`), with
/// `d * (sc - 32)` formed in f32 as the kernels form it (ggml's values): for the check mode's matmul reference.
pub fn dequantize_blocks32(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    for (blk, o) in blocks32_with("Q3_K", bytes, BLOCK32_BYTES, out)? {
        let d = read_f16(blk, 2);
        let h = u32::from_le_bytes([
            blk[BLOCK32_H],
            blk[BLOCK32_H + 1],
            blk[BLOCK32_H + 2],
            blk[BLOCK32_H + 3],
        ]);
        for (l, v) in o.iter_mut().enumerate() {
            let (t, i, b) = (l / 16, l % 16 / 4, l % 4);
            let q = block32_quant(blk, l) as u32 | ((h >> (8 * b + 4 * t + i)) & 1) << 2;
            *v = d * (blk[t] as i32 - 32) as f32 * (q as i32 - 4) as f32;
        }
    }
    Ok(())
}

/// Quantizes whole super-blocks round-to-nearest (simpler than ggml's `quantize_row_q3_K_ref`): per sub-block of 16
/// the signed scale `v / -4` of its largest-magnitude value `v` (so that `v` maps to q - 4 = -4); the scales to 6
/// bits of their largest magnitude (`d = max |scale| / 32`, codes `round(scale / d) + 32` in 0..64); then each
/// weight to the nearest of the 8 levels the stored constants give.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q3_K", x.len(), QK_K)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let mut scales = [0f32; 16];
        for (s, xs) in xb.chunks_exact(16).enumerate() {
            let v = xs.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
            scales[s] = v / -4.0;
        }
        let max = scales.iter().fold(0f32, |a, &s| a.max(s.abs()));
        let d = f32_to_f16(max / 32.0);
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&d.to_le_bytes());
        let d = read_f16(b, D_OFFSET);
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let codes = scales.map(|s| ((s * inv).round_ties_even() as i32 + 32).clamp(0, 63) as u8);
        b[SCALES_OFFSET..SCALES_OFFSET + 12].copy_from_slice(&pack_scale_codes(&codes));
        for (w, &v) in xb.iter().enumerate() {
            let step = d * (codes[w / 16] as i32 - 32) as f32;
            let q = if step == 0.0 {
                4
            } else {
                ((v / step).round_ties_even() as i32 + 4).clamp(0, 7) as u8
            };
            let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
            b[QS_OFFSET + 32 * h + l] |= (q & 3) << (2 * j);
            b[HMASK_OFFSET + l] |= (q >> 2) << (4 * h + j);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes 3 s + 10 (s < 16: 10..55, so every top-bit pair occurs), d = 0.5, hmask byte l = l * 29, qs byte i =
    /// i * 53 (mod 256).
    fn hand_block() -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        for (l, h) in b[HMASK_OFFSET..HMASK_OFFSET + 32].iter_mut().enumerate() {
            *h = (l * 29 % 256) as u8;
        }
        for i in 0..64 {
            b[QS_OFFSET + i] = (i * 53 % 256) as u8;
        }
        let codes: [u8; 16] = std::array::from_fn(|s| 3 * s as u8 + 10);
        b[SCALES_OFFSET..SCALES_OFFSET + 12].copy_from_slice(&pack_scale_codes(&codes));
        b[108..110].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        b
    }

    #[test]
    fn scale_bytes_by_hand() {
        // Codes 10 (0b001010) for s 0 and 49 (0b110001) for s 13: byte 0 low nibble 10, byte 5 high nibble 1,
        // byte 8 bits 0..2 = 0, byte 9 bits 6..8 = 3.
        let b = hand_block();
        let sc = &b[SCALES_OFFSET..SCALES_OFFSET + 12];
        assert_eq!(sc[0] & 15, 10);
        assert_eq!(sc[5] >> 4, 1);
        assert_eq!(sc[8] & 3, 0);
        assert_eq!(sc[9] >> 6, 3);
        for s in 0..16 {
            assert_eq!(scale_code(sc, s), 3 * s as u8 + 10, "sub-block {s}");
        }
    }

    #[test]
    fn dequantize_hand_block() {
        let mut y = vec![0f32; 256];
        dequantize_into(&hand_block(), &mut y).unwrap();
        // w 0: s 0 (code 10: d * -22 = -11), qs[0] = 0 bits 0..2 = 0, hmask[0] = 0 bit 0 = 0: q 0 -> -11 * -4.
        assert_eq!(y[0], 44.0);
        // w 37: s 2 (code 16: -8), h 0, j 1, l 5: qs[5] = 265 % 256 = 9 = 0b1001, bits 2..4 = 2; hmask[5] = 145 =
        // 0b10010001, bit 1 = 0: q 2 -> -8 * -2.
        assert_eq!(y[37], 16.0);
        // w 200: s 12 (code 46: 7), h 1, j 2, l 8: qs[40] = 2120 % 256 = 72 = 0b01001000, bits 4..6 = 0;
        // hmask[8] = 232 = 0b11101000, bit 6 = 1: q 4 -> 0.
        assert_eq!(y[200], 0.0);
        // w 255: s 15 (code 55: 11.5), h 1, j 3, l 31: qs[63] = 3339 % 256 = 11 = 0b00001011, bits 6..8 = 0;
        // hmask[31] = 899 % 256 = 131 = 0b10000011, bit 7 = 1: q 4 -> 0. w 227 (l 3, j 3): qs[35] = 1855 % 256
        // = 63, bits 6..8 = 0; hmask[3] = 87 = 0b01010111, bit 7 = 0: q 0 -> s 14 (code 52: 10) times -4.
        assert_eq!(y[255], 0.0);
        assert_eq!(y[227], -40.0);
    }

    #[test]
    fn blocks32_keep_codes_and_quants() {
        let b = hand_block();
        let r = to_blocks32(&b).unwrap();
        assert_eq!(r.len(), 8 * BLOCK32_BYTES);
        let mut y = vec![0f32; 256];
        dequantize_into(&b, &mut y).unwrap();
        // Decoding the host blocks by their layout gives ggml's values for every weight.
        let mut got = vec![0f32; 256];
        dequantize_blocks32(&r, &mut got).unwrap();
        assert_eq!(got, y);
        assert!(dequantize_blocks32(&r[..7 * BLOCK32_BYTES], &mut got).is_err());
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let b = quantize(&x).unwrap();
        let mut y = vec![0f32; 512];
        dequantize_into(&b, &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // |x| <= 1.25, steps of 1.25 / 4 = 0.31: half a step (0.16) inside the levels, but the value of the other
        // sign than the largest one may need q - 4 = +4 and is clamped to +3: up to one step (0.31), plus the scale
        // code rounding (half of d = 1/64 of the largest scale, about 0.005 per step). A wrong bit order gives > 1.
        assert!(max < 0.35, "max error {max}");
    }
}
