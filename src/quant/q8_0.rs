//! Q8_0: blocks of 32 weights as one f16 scale `d` and 32 signed 8-bit quants, `x = d * q`.
//!
//! Block layout (34 bytes, ggml's `block_q8_0`):
//! ```text
//! bytes 0..2    d   f16, little-endian
//! bytes 2..34   qs  32 x i8, weight j at byte 2 + j
//! ```

use super::{check_blocks, f32_to_f16, read_f16};
use crate::error::Result;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;
/// Byte offset of the f16 scale `d`.
pub const D_OFFSET: usize = 0;
/// Byte offset of the 32 signed quants.
pub const QS_OFFSET: usize = 2;

/// Dequantizes whole blocks into `out` (`out.len() == bytes.len() / 34 * 32`).
pub fn dequantize_into(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let nb = check_blocks("Q8_0", out.len(), QK)?;
    check_blocks("Q8_0 bytes", bytes.len(), BLOCK_BYTES)?;
    debug_assert_eq!(bytes.len(), nb * BLOCK_BYTES);
    for (b, y) in bytes.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = read_f16(b, D_OFFSET);
        for (j, o) in y.iter_mut().enumerate() {
            *o = b[QS_OFFSET + j] as i8 as f32 * d;
        }
    }
    Ok(())
}

/// The block scale of ggml's `quantize_row_q8_0_ref`: `amax / 127`.
pub fn block_scale(xs: &[f32]) -> f32 {
    xs.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0
}

/// The 8-bit code of `v` at inverse scale `id`: rounded to nearest with ties away from zero (C's `roundf`, Rust's
/// `f32::round`), clamped to i8.
pub fn code(v: f32, id: f32) -> i8 {
    ((v * id).round() as i32).clamp(-128, 127) as i8
}

/// Quantizes whole blocks the way ggml's `quantize_row_q8_0_ref` does: [`block_scale`], then [`code`].
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q8_0", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let d = block_scale(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (j, &v) in xb.iter().enumerate() {
            b[QS_OFFSET + j] = code(v, id) as u8;
        }
    }
    Ok(out)
}
