//! Q5_0: blocks of 32 weights as one f16 scale `d` and 32 unsigned 5-bit quants `q`, `x = d * (q - 16)`.
//!
//! Block layout (22 bytes, ggml's `block_q5_0`):
//! ```text
//! bytes 0..2    d   f16, little-endian
//! bytes 2..6    qh  u32, little-endian: bit j is the high bit (16) of weight j
//! bytes 6..22   qs  16 bytes; byte j holds the low 4 bits of weight j (low nibble) and of weight j + 16 (high)
//! ```

use super::{check_blocks, f32_to_f16, read_f16};
use crate::error::Result;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 22;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the high-bit word.
pub const QH_OFFSET: usize = 2;
/// Byte offset of the 16 nibble-pair bytes.
pub const QS_OFFSET: usize = 6;

/// The 5-bit quants (0..=31) of one block whose high-bit word is `qh` and nibble bytes `qs` (Q5_0 and Q5_1).
pub fn quants5(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Packs 32 quants (0..=31) into the high-bit word and nibble bytes `qs` (16 bytes).
pub fn pack5(q: &[u8; 32], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        qh |= (((q[j] >> 4) & 1) as u32) << j | (((q[j + 16] >> 4) & 1) as u32) << (j + 16);
    }
    qh
}

/// Dequantizes whole blocks into `out` (`out.len() == bytes.len() / 22 * 32`), as ggml's `dequantize_row_q5_0`.
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q5_0", out.len(), QK)?;
    check_blocks("Q5_0 bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = read_f16(b, D_OFFSET);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (o, q) in y.iter_mut().zip(quants5(qh, &b[QS_OFFSET..])) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
    Ok(())
}

/// Quantizes whole blocks the way ggml's `quantize_row_q5_0_ref` does: the scale maps the value of largest
/// magnitude (sign kept) to -16, quants are rounded to nearest and clamped to 31.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q5_0", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let max = xb.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(xb) {
            // (x*id + 16.5) lies in [0.5, 32.5] for finite input; truncation then rounds to nearest.
            *q = ((v * id + 16.5) as i32).clamp(0, 31) as u8;
        }
        let qh = pack5(&q, &mut b[QS_OFFSET..]);
        b[QH_OFFSET..QH_OFFSET + 4].copy_from_slice(&qh.to_le_bytes());
    }
    Ok(out)
}
