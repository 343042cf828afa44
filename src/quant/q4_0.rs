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

/// The block scale of ggml's `quantize_row_q4_0_ref`: the value of largest magnitude (sign kept) maps to -8.
pub fn block_scale(xs: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xs {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max / -8.0
}

/// The 4-bit code of `v` at inverse scale `id`: rounded to nearest, clamped to 15 (`(v * id + 8.5)` lies in
/// [0.5, 16.5] for finite input; truncation then rounds to nearest).
pub fn code(v: f32, id: f32) -> u8 {
    ((v * id + 8.5) as i32).clamp(0, 15) as u8
}

/// Quantizes whole blocks the way ggml's `quantize_row_q4_0_ref` does: [`block_scale`], then [`code`].
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    let nb = check_blocks("Q4_0", x.len(), QK)?;
    let mut out = vec![0u8; nb * BLOCK_BYTES];
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let d = block_scale(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[D_OFFSET..D_OFFSET + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK / 2 {
            b[QS_OFFSET + j] = code(xb[j], id) | (code(xb[j + QK / 2], id) << 4);
        }
    }
    Ok(out)
}
