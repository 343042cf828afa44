//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16, each with a signed 8-bit scale `sc[s]` times the
//! super-block's f16 `d`: `x = d * sc[s] * (q - 32)`, q in 0..=63 (6 bits: 4 in `ql`, 2 in `qh`).
//!
//! Block layout (210 bytes, ggml's `block_q6_K`). Weight `w = 128 h + 32 g + l` (half h 0..2, group g 0..4,
//! l 0..32) has:
//! ```text
//! bytes 0..128    ql      low 4 bits: byte 64 h + 32 (g % 2) + l, low nibble for g < 2, high nibble for g >= 2
//! bytes 128..192  qh      high 2 bits: byte 128 + 32 h + l, bits 2g..2g+2
//! bytes 192..208  scales  16 x i8, sub-block s = w / 16
//! bytes 208..210  d       f16, little-endian
//! ```
//!
//! For the GPU a super-block is repacked into 8 blocks of 32 with two scales (one per half of 16; `to_blocks32`):
//! 4-bit nibbles in Q4_0's order plus two high-bit planes, 28 bytes per 32 weights (1.07x the file's 26.25):
//! ```text
//! bytes 0..2    d_lo  f16: d * sc for weights 0..16 of the block
//! bytes 2..4    d_hi  f16: d * sc for weights 16..32
//! bytes 4..20   qs    byte j: bits 0..4 of q of weight j (low nibble) and of weight j + 16 (high nibble)
//! bytes 20..24  qh0   u32, little-endian: bit j is bit 4 of q of weight j
//! bytes 24..28  qh1   u32, little-endian: bit j is bit 5 of q of weight j
//! ```
//! x = d_half * (q - 32). `d * sc` is exact in f32 and rounded once to f16 (relative error at most 2^-11; beyond the
//! f16 range is an error).

use super::q4_k::f16_constant;
use super::{check_blocks, f32_to_f16, read_f16, QK_K};
use crate::error::Result;

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 210;
/// Byte offsets of the low 4 bits, the high 2 bits, the 16 scales and the f16 `d`.
pub const QL_OFFSET: usize = 0;
pub const QH_OFFSET: usize = 128;
pub const SCALES_OFFSET: usize = 192;
pub const D_OFFSET: usize = 208;

/// Bytes of one repacked 32-weight block, and its offsets.
pub const BLOCK32_BYTES: usize = 28;
pub const BLOCK32_D_LO: usize = 0;
pub const BLOCK32_D_HI: usize = 2;
pub const BLOCK32_QS: usize = 4;
pub const BLOCK32_QH: usize = 20;

/// The 6-bit quant (0..=63) of weight `w` of super-block `b`.
fn quant(b: &[u8], w: usize) -> u8 {
    let (h, g, l) = (w / 128, w % 128 / 32, w % 32);
    let ql = b[QL_OFFSET + 64 * h + 32 * (g % 2) + l];
    let low = if g < 2 { ql & 0x0f } else { ql >> 4 };
    let high = (b[QH_OFFSET + 32 * h + l] >> (2 * g)) & 3;
    low | (high << 4)
}

/// Dequantizes whole super-blocks into `out` (`out.len() == bytes.len() / 210 * 256`), as ggml's
/// `dequantize_row_q6_K`: `(d * sc) * (q - 32)` in f32.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q6_K", out.len(), QK_K)?;
    check_blocks("Q6_K bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, D_OFFSET);
        for (w, o) in y.iter_mut().enumerate() {
            let sc = b[SCALES_OFFSET + w / 16] as i8;
            *o = d * sc as f32 * (quant(b, w) as i32 - 32) as f32;
        }
    }
    Ok(())
}

/// Repacks whole super-blocks into the 28-byte two-scale blocks of the module doc (8 per super-block).
pub fn to_blocks32(bytes: &[u8]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q6_K bytes", bytes.len(), BLOCK_BYTES)?;
    let mut out = vec![0u8; nb * 8 * BLOCK32_BYTES];
    for (b, o) in bytes
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(8 * BLOCK32_BYTES))
    {
        let d = read_f16(b, D_OFFSET);
        for (s, blk) in o.chunks_exact_mut(BLOCK32_BYTES).enumerate() {
            for (half, at) in [(0, BLOCK32_D_LO), (1, BLOCK32_D_HI)] {
                let sc = b[SCALES_OFFSET + 2 * s + half] as i8;
                blk[at..at + 2].copy_from_slice(&f16_constant("Q6_K", d * sc as f32)?);
            }
            let (mut qh0, mut qh1) = (0u32, 0u32);
            for l in 0..32 {
                let q = quant(b, 32 * s + l);
                blk[BLOCK32_QS + l % 16] |= (q & 0x0f) << (4 * (l / 16));
                qh0 |= (((q >> 4) & 1) as u32) << l;
                qh1 |= ((q >> 5) as u32) << l;
            }
            blk[BLOCK32_QH..BLOCK32_QH + 4].copy_from_slice(&qh0.to_le_bytes());
            blk[BLOCK32_QH + 4..BLOCK32_QH + 8].copy_from_slice(&qh1.to_le_bytes());
        }
    }
    Ok(out)
}

/// Dequantizes repacked 28-byte blocks (`out.len() == bytes.len() / 28 * 32`): what the GPU kernels compute.
pub fn dequantize_blocks32(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q6_K blocks", out.len(), 32)?;
    check_blocks("Q6_K block bytes", bytes.len(), BLOCK32_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK32_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK32_BYTES).zip(out.chunks_exact_mut(32)) {
        let (lo, hi) = (read_f16(b, BLOCK32_D_LO), read_f16(b, BLOCK32_D_HI));
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let (qh0, qh1) = (word(BLOCK32_QH), word(BLOCK32_QH + 4));
        for (j, o) in y.iter_mut().enumerate() {
            let nib = (b[BLOCK32_QS + j % 16] >> (4 * (j / 16))) & 0x0f;
            let q = nib as u32 | ((qh0 >> j) & 1) << 4 | ((qh1 >> j) & 1) << 5;
            *o = if j < 16 { lo } else { hi } * (q as i32 - 32) as f32;
        }
    }
    Ok(())
}

/// Quantizes whole super-blocks round-to-nearest (a simpler cousin of ggml's `quantize_row_q6_K_ref`, which refines
/// each sub-block scale): per sub-block of 16 the scale maps the value of largest magnitude (sign kept) to -32; the
/// scales become i8 codes of the largest one (which maps to -128); then each weight goes to the nearest level of
/// the stored constants, clamped to -32..=31.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q6_K", x.len(), QK_K)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let mut scales = [0f32; 16];
        for (s, xs) in xb.chunks_exact(16).enumerate() {
            let max = xs.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            scales[s] = max / -32.0;
        }
        let max = scales.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        if max.abs() < 1e-15 {
            continue; // an all-zero block (d = 0)
        }
        let iscale = -128.0 / max;
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(1.0 / iscale).to_le_bytes());
        let d = read_f16(b, D_OFFSET);
        let mut q = [32u8; QK_K];
        for (s, xs) in xb.chunks_exact(16).enumerate() {
            let sc = ((iscale * scales[s]).round_ties_even() as i32).clamp(-128, 127) as i8;
            b[SCALES_OFFSET + s] = sc as u8;
            let step = d * sc as f32;
            if step == 0.0 {
                continue;
            }
            for (l, &v) in xs.iter().enumerate() {
                q[16 * s + l] = (((v / step).round_ties_even() as i32).clamp(-32, 31) + 32) as u8;
            }
        }
        for h in 0..2 {
            for l in 0..32 {
                let g = |i: usize| q[128 * h + 32 * i + l];
                b[QL_OFFSET + 64 * h + l] = (g(0) & 0x0f) | ((g(2) & 0x0f) << 4);
                b[QL_OFFSET + 64 * h + 32 + l] = (g(1) & 0x0f) | ((g(3) & 0x0f) << 4);
                b[QH_OFFSET + 32 * h + l] = (g(0) >> 4) | ((g(1) >> 4) << 2) | ((g(2) >> 4) << 4) | ((g(3) >> 4) << 6);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// d = 0.25, ql[i] = i, qh[i] = 0xE4 (high bits 0, 1, 2, 3 for groups 0..4), scales s - 8 but sc[15] = -128.
    fn hand_block() -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        for (i, q) in b[..128].iter_mut().enumerate() {
            *q = i as u8;
        }
        b[128..192].fill(0xE4);
        for s in 0..16 {
            b[192 + s] = (s as i8 - 8) as u8;
        }
        b[207] = 0x80; // -128
        b[208..210].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        b
    }

    #[test]
    fn dequantize_hand_block() {
        let mut y = vec![0f32; 256];
        dequantize_into(&hand_block(), &mut y).unwrap();
        // weight: half, group, l -> ql byte and nibble, qh bits, q - 32, scale
        assert_eq!(y[0], 64.0); // h0 g0 l0: ql[0] low 0, qh 0 -> -32; sc[0] = -8: 0.25 * -8 * -32
        assert_eq!(y[33], 22.5); // h0 g1 l1: ql[33] = 0x21 low 1, qh 1 -> 17 - 32 = -15; sc[2] = -6
        assert_eq!(y[70], 0.0); // h0 g2 l6: ql[6] high 0, qh 2 -> 32 - 32 = 0
        assert_eq!(y[100], -9.0); // h0 g3 l4: ql[36] = 0x24 high 2, qh 3 -> 50 - 32 = 18; sc[6] = -2
        assert_eq!(y[150], -6.5); // h1 g0 l22: ql[86] = 0x56 low 6, qh 0 -> -26; sc[9] = 1
        assert_eq!(y[255], -736.0); // h1 g3 l31: ql[127] high 7, qh 3 -> 55 - 32 = 23; sc[15] = -128
    }

    #[test]
    fn blocks32_repack_gives_the_same_values_here() {
        let b = hand_block();
        let mut want = vec![0f32; 256];
        dequantize_into(&b, &mut want).unwrap();
        let r = to_blocks32(&b).unwrap();
        assert_eq!(r.len(), 8 * 28);
        let mut got = vec![0f32; 256];
        dequantize_blocks32(&r, &mut got).unwrap();
        assert_eq!(got, want);
        // Block 7 (weights 224..256): scales sc[14] = 6 and sc[15] = -128 times d; weight 255 is q - 32 = 23.
        assert_eq!(
            &r[7 * 28..7 * 28 + 4],
            [f32_to_f16(1.5).to_le_bytes(), f32_to_f16(-32.0).to_le_bytes()].concat()
        );
        // q = 55 = 0b110111: nibble 7 (byte 15's high nibble), bit 4 set, bit 5 set (bit 31 of both planes).
        let blk = &r[7 * 28..8 * 28];
        assert_eq!(blk[4 + 15] >> 4, 7);
        assert_eq!((blk[23] >> 7, blk[27] >> 7), (1, 1));
    }

    #[test]
    fn quantize_round_trip_is_close() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        let b = quantize(&x).unwrap();
        let mut y = vec![0f32; 512];
        dequantize_into(&b, &mut y).unwrap();
        let max = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // |x| <= 1.275 over 32 steps: a step is 0.04 (a whole one where +32 clamps to 31), plus 8-bit scale rounding.
        assert!(max < 0.05, "max error {max}");
        assert!(quantize(&[0.0; 256]).unwrap().iter().all(|&v| v == 0));
    }
}
