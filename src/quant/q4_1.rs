//! Q4_1: blocks of 32 weights as an f16 scale `d`, an f16 minimum `m` and 32 unsigned 4-bit quants, `x = d * q + m`.
//!
//! Block layout (20 bytes, ggml's `block_q4_1`):
//! ```text
//! bytes 0..2    d   f16, little-endian
//! bytes 2..4    m   f16, little-endian
//! bytes 4..20   qs  16 bytes; byte j holds weight j in its low nibble and weight j + 16 in its high nibble
//! ```

use super::{check_blocks, f32_to_f16, read_f16};
use crate::error::Result;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 20;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the f16 minimum `m`.
pub const M_OFFSET: usize = 2;
/// Byte offset of the 16 nibble-pair bytes.
pub const QS_OFFSET: usize = 4;

/// Dequantizes whole blocks into `out` (`out.len() == bytes.len() / 20 * 32`).
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q4_1", out.len(), QK)?;
    check_blocks("Q4_1 bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = read_f16(b, D_OFFSET);
        let m = read_f16(b, M_OFFSET);
        for j in 0..QK / 2 {
            let q = b[QS_OFFSET + j];
            y[j] = (q & 0x0f) as f32 * d + m;
            y[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
    Ok(())
}

/// Quantizes whole blocks the way ggml's `quantize_row_q4_1_ref` does: `m` is the block minimum, `d` spreads
/// `[min, max]` over 0..=15, quants are rounded to nearest.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q4_1", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[M_OFFSET..M_OFFSET + 2].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        // ((x - min)*id + 0.5) lies in [0.5, 15.5] for finite input; truncation then rounds to nearest.
        let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
        for j in 0..QK / 2 {
            b[QS_OFFSET + j] = q(xb[j]) | (q(xb[j + QK / 2]) << 4);
        }
    }
    Ok(out)
}
