//! ggml tensor types and block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, the k-quants Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_XS, F16, BF16): layouts, CPU dequantization (the reference the GPU kernels are tested against) and
//! round-to-nearest quantization (matching ggml's reference quantizers for Q4_0..Q8_0; simpler RTN ones for the
//! k-quants and the IQ4 codebook formats).
//!
//! A quantized row of `n` weights is `n / 32` blocks (k-quants: `n / 256` super-blocks) laid end to end; a block
//! holds its constants and the packed quants. Byte offsets inside a block are constants in each format's module.
//! The GPU kernels read 32-weight blocks only: `pack` repacks k-quant super-blocks into such blocks at load.

pub mod gptq;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod pack;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;

use crate::error::{Error, Result};

/// Weights per k-quant super-block.
pub const QK_K: usize = 256;

/// A ggml tensor type, by its id in ggml's `enum ggml_type` (ids 4, 5, 31..33 and 36..38 were removed upstream).
///
/// Every type ggml has defined is known here by name and layout (so a file can be opened and its sizes checked),
/// but only [`GgmlType::is_supported`] types can be dequantized or run.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, ggml id, name, elements per block, bytes per block).
const TYPES: [(GgmlType, u32, &str, usize, usize); 32] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", q4_0::QK, q4_0::BLOCK_BYTES),
    (GgmlType::Q4_1, 3, "Q4_1", q4_1::QK, q4_1::BLOCK_BYTES),
    (GgmlType::Q5_0, 6, "Q5_0", q5_0::QK, q5_0::BLOCK_BYTES),
    (GgmlType::Q5_1, 7, "Q5_1", q5_1::QK, q5_1::BLOCK_BYTES),
    (GgmlType::Q8_0, 8, "Q8_0", q8_0::QK, q8_0::BLOCK_BYTES),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, q2_k::BLOCK_BYTES),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, q3_k::BLOCK_BYTES),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, q4_k::BLOCK_BYTES),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, q5_k::BLOCK_BYTES),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, q6_k::BLOCK_BYTES),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", iq4_nl::QK, iq4_nl::BLOCK_BYTES),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, iq4_xs::BLOCK_BYTES),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has exactly one row in TYPES (checked by a unit test).
        TYPES.iter().find(|e| e.0 == self).expect("GgmlType missing from TYPES")
    }

    /// The type with ggml id `id`, or `None` for an id ggml never defined (or removed).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// ggml's numeric id (as stored in GGUF tensor infos).
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// ggml's name: `Q4_0`, `Q6_K`, `BF16`, ...
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Elements per block (1 for plain types, 32 or 256 for quantized ones).
    pub fn block_size(self) -> usize {
        self.entry().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.entry().4
    }

    /// Whether shaderlm can dequantize and run tensors of this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::IQ4_NL
                | GgmlType::IQ4_XS
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::Q2_K
                | GgmlType::Q3_K
        )
    }

    /// Names of the supported types, comma-separated (for error messages).
    pub fn supported_names() -> String {
        TYPES
            .iter()
            .filter(|e| e.0.is_supported())
            .map(|e| e.2)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether this is a block-quantized type (block size above 1).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of `n` consecutive elements; `None` when `n` is not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// IEEE half (f16) bits to f32.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half bits, rounding to nearest even (as ggml's `GGML_FP32_TO_FP16`).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bfloat16 bits to f32 (exact: bf16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 bits, rounding to nearest even; NaN stays a (quiet) NaN.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// Dequantize `bytes` holding elements of type `ty` to f32.
///
/// Errors when `ty` is not supported or `bytes` is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !bytes.len().is_multiple_of(ts) {
        return Err(Error::Invalid(format!(
            "{} data of {} bytes is not a whole number of {ts}-byte blocks",
            ty,
            bytes.len()
        )));
    }
    let n = bytes.len() / ts * bs;
    let mut out = vec![0f32; n];
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

/// Dequantize `bytes` of type `ty` into `out`, whose length must be the element count of `bytes`.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !bytes.len().is_multiple_of(ts) || bytes.len() / ts * bs != out.len() {
        return Err(Error::Invalid(format!(
            "{} data of {} bytes does not hold {} elements",
            ty,
            bytes.len(),
            out.len()
        )));
    }
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::Q4_0 => q4_0::dequantize_into(bytes, out)?,
        GgmlType::Q4_1 => q4_1::dequantize_into(bytes, out)?,
        GgmlType::Q5_0 => q5_0::dequantize_into(bytes, out)?,
        GgmlType::Q5_1 => q5_1::dequantize_into(bytes, out)?,
        GgmlType::Q8_0 => q8_0::dequantize_into(bytes, out)?,
        GgmlType::IQ4_NL => iq4_nl::dequantize_into(bytes, out)?,
        GgmlType::IQ4_XS => iq4_xs::dequantize_into(bytes, out)?,
        GgmlType::Q4_K => q4_k::dequantize_into(bytes, out)?,
        GgmlType::Q5_K => q5_k::dequantize_into(bytes, out)?,
        GgmlType::Q6_K => q6_k::dequantize_into(bytes, out)?,
        GgmlType::Q2_K => q2_k::dequantize_into(bytes, out)?,
        GgmlType::Q3_K => q3_k::dequantize_into(bytes, out)?,
        _ => return Err(Error::Invalid(format!("tensor type {ty} is not supported yet"))),
    }
    Ok(())
}

/// Quantize (or convert) f32 values to type `ty`; quantized types need a whole number of blocks (32 elements, or
/// 256 for k-quants).
pub fn quantize(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    match ty {
        GgmlType::F32 => Ok(x.iter().flat_map(|v| v.to_le_bytes()).collect()),
        GgmlType::F16 => Ok(x.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect()),
        GgmlType::BF16 => Ok(x.iter().flat_map(|&v| f32_to_bf16(v).to_le_bytes()).collect()),
        GgmlType::Q4_0 => q4_0::quantize(x),
        GgmlType::Q4_1 => q4_1::quantize(x),
        GgmlType::Q5_0 => q5_0::quantize(x),
        GgmlType::Q5_1 => q5_1::quantize(x),
        GgmlType::Q8_0 => q8_0::quantize(x),
        GgmlType::IQ4_NL => iq4_nl::quantize(x),
        GgmlType::IQ4_XS => iq4_xs::quantize(x),
        GgmlType::Q4_K => q4_k::quantize(x),
        GgmlType::Q5_K => q5_k::quantize(x),
        GgmlType::Q6_K => q6_k::quantize(x),
        GgmlType::Q2_K => q2_k::quantize(x),
        GgmlType::Q3_K => q3_k::quantize(x),
        _ => Err(Error::Invalid(format!("quantizing to {ty} is not supported yet"))),
    }
}

/// Checks that `n` values split into whole blocks of `qk`; shared by the block formats.
fn check_blocks(what: &str, n: usize, qk: usize) -> Result<usize> {
    if !n.is_multiple_of(qk) {
        return Err(Error::Invalid(format!(
            "{what}: {n} values are not a whole number of {qk}-value blocks"
        )));
    }
    Ok(n / qk)
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32.
#[inline]
fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_table_is_consistent() {
        for (i, e) in TYPES.iter().enumerate() {
            assert_eq!(GgmlType::from_id(e.1), Some(e.0));
            assert_eq!(e.0.id(), e.1);
            for f in &TYPES[i + 1..] {
                assert!(e.0 != f.0 && e.1 != f.1 && e.2 != f.2, "{} duplicated", e.2);
            }
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }
}
