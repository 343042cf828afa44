//! Q5_1: blocks of 32 weights as an f16 scale `d`, an f16 minimum `m` and 32 unsigned 5-bit quants, `x = d * q + m`.
//!
//! Block layout (24 bytes, ggml's `block_q5_1`):
//! ```text
//! bytes 0..2    d   f16, little-endian
//! bytes 2..4    m   f16, little-endian
//! bytes 4..8    qh  u32, little-endian: bit j is the high bit (16) of weight j
//! bytes 8..24   qs  16 bytes; byte j holds the low 4 bits of weight j (low nibble) and of weight j + 16 (high)
//! ```
//! Q5_K super-blocks are repacked into these blocks for the GPU (`q5_k::to_q5_1`).

use super::q5_0::{pack5, quants5};
use super::{check_blocks, f32_to_f16, read_f16};
use crate::error::Result;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 24;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 minimum `m`.
pub const M_OFFSET: usize = 2;
/// Byte offset of the high-bit word.
pub const QH_OFFSET: usize = 4;
/// Byte offset of the 16 nibble-pair bytes.
pub const QS_OFFSET: usize = 8;

/// Dequantizes whole blocks into `out` (`out.len() == bytes.len() / 24 * 32`), as ggml's `dequantize_row_q5_1`.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q5_1", out.len(), QK)?;
    check_blocks("Q5_1 bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (read_f16(b, D_OFFSET), read_f16(b, M_OFFSET));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (o, q) in y.iter_mut().zip(quants5(qh, &b[QS_OFFSET..])) {
            *o = q as f32 * d + m;
        }
    }
    Ok(())
}

/// Quantizes whole blocks the way ggml's `quantize_row_q5_1_ref` does: `m` is the block minimum, `d` spreads
/// `[min, max]` over 0..=31, quants are rounded to nearest.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q5_1", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let min = xb.iter().fold(f32::MAX, |a, &v| a.min(v));
        let max = xb.iter().fold(-f32::MAX, |a, &v| a.max(v));
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[M_OFFSET..M_OFFSET + 2].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(xb) {
            *q = (((v - min) * id + 0.5) as i32).clamp(0, 31) as u8;
        }
        let qh = pack5(&q, &mut b[QS_OFFSET..]);
        b[QH_OFFSET..QH_OFFSET + 4].copy_from_slice(&qh.to_le_bytes());
    }
    Ok(out)
}
