//! Q4_0: blocks of 32 weights as one f16 scale `d` and 32 unsigned 4-bit quants `q`, `x = d * (q - 8)`.
//!
//! Block layout (18 bytes, ggml's `block_q4_0`):
//! ```text
//! bytes 0..2    d   f16, little-endian
//! bytes 2..18   qs  16 bytes; byte j holds weight j in its low nibble and weight j + 16 in its high nibble
//! ```

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

/// Dequantizes whole blocks into `out` (`out.len() == bytes.len() / 18 * 32`).
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q4_0", out.len(), QK)?;
    check_blocks("Q4_0 bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = read_f16(b, D_OFFSET);
        for j in 0..QK / 2 {
            let q = b[QS_OFFSET + j];
            y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
    Ok(())
}

/// Quantizes whole blocks the way ggml's `quantize_row_q4_0_ref` does: the scale maps the value of largest
/// magnitude (sign kept) to -8, quants are rounded to nearest and clamped to 15.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q4_0", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        // (x*id + 8.5) lies in [0.5, 16.5] for finite input; truncation then rounds to nearest.
        let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        for j in 0..QK / 2 {
            b[QS_OFFSET + j] = q(xb[j]) | (q(xb[j + QK / 2]) << 4);
        }
    }
    Ok(out)
}
