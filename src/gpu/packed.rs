//! A block-quantized weight resident on the device: the row parts that [`crate::quant::pack`] lays out on the host,
//! uploaded as `u32` buffers, and the shader flags that tell a kernel how to read its format.

use super::tensor::{Part, USAGE};
use super::{DType, Gpu, GpuTensor, ShaderKey};
use crate::error::Result;
use crate::quant::pack::{pack, Format, HostPart, Layout};
use crate::quant::GgmlType;
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// A quantized `[n, k]` weight resident on the device in one of the layouts.
///
/// Each buffer is a flat `u32` tensor split into the same parts; a part's `row0` / `rows` count output rows (rows of
/// W), not elements of the flat tensor. Kernels issue one dispatch per part.
#[derive(Clone, Debug)]
pub struct PackedWeight {
    pub name: String,
    pub format: Format,
    pub layout: Layout,
    /// Output rows (N) and reduction length (K, a multiple of 32; of 256 for k-quants).
    pub n: usize,
    pub k: usize,
    /// Quant words (see the module doc for the two layouts).
    pub quants: GpuTensor,
    /// f16 pairs of per-block scales (and second constants, in the tiled layout of two-constant formats).
    pub scales: GpuTensor,
    /// f16 pairs of per-block second constants (mins, or Q6_K's second scales) in the rows layout of two-constant
    /// formats; the super-block factors of the super formats (both layouts); else none.
    pub mins: Option<GpuTensor>,
}

fn upload_words(gpu: &Gpu, name: &str, parts: &[(usize, usize, &[u32])]) -> GpuTensor {
    let mut out = Vec::new();
    let mut total = 0;
    for &(row0, rows, w) in parts {
        let bytes: &[u8] = bytemuck::cast_slice(w);
        let buffer = gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(name),
            contents: if bytes.is_empty() { &[0; 4] } else { bytes },
            usage: USAGE,
        });
        total += w.len();
        out.push(Part {
            buffer: Arc::new(buffer),
            row0,
            rows,
            bytes: bytes.len().max(4) as u64,
        });
    }
    GpuTensor {
        name: name.into(),
        shape: vec![total],
        dtype: DType::U32,
        parts: out,
    }
}

impl PackedWeight {
    /// Pack raw GGUF blocks of a `[n, k]` tensor in the layout the adapter wants, and upload them.
    pub fn upload(gpu: &Gpu, name: &str, ty: GgmlType, n: usize, k: usize, raw: &[u8]) -> Result<PackedWeight> {
        Self::upload_with(gpu, name, ty, Layout::for_caps(&gpu.caps), n, k, raw)
    }

    /// [`PackedWeight::upload`] in a chosen layout (tests and benches run both on one adapter).
    pub fn upload_with(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        layout: Layout,
        n: usize,
        k: usize,
        raw: &[u8],
    ) -> Result<PackedWeight> {
        let format = Format::new(ty)?;
        let max = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        let parts = pack(ty, layout, n, k, raw, max)?;
        let pick = |f: fn(&HostPart) -> &[u32]| parts.iter().map(|p| (p.row0, p.rows, f(p))).collect::<Vec<_>>();
        let quants = upload_words(gpu, &format!("{name}.quants"), &pick(|p| &p.quants));
        let scales = upload_words(gpu, &format!("{name}.scales"), &pick(|p| &p.scales));
        let mins = format
            .third_buffer(layout)
            .then(|| upload_words(gpu, &format!("{name}.mins"), &pick(|p| &p.mins)));
        gpu.check("PackedWeight::upload")?;
        Ok(PackedWeight {
            name: name.into(),
            format,
            layout,
            n,
            k,
            quants,
            scales,
            mins,
        })
    }

    /// (first output row, rows) of each part.
    pub fn parts(&self) -> Vec<(usize, usize)> {
        self.quants.parts.iter().map(|p| (p.row0, p.rows)).collect()
    }

    /// Its device buffers in binding order: quants, scales, and mins where the layout has them.
    pub fn buffers(&self) -> impl Iterator<Item = &GpuTensor> {
        [Some(&self.quants), Some(&self.scales), self.mins.as_ref()]
            .into_iter()
            .flatten()
    }

    /// Whether the row parts cover its `n` rows, none empty, and every buffer is split into those parts.
    pub fn parts_cover_rows(&self) -> bool {
        let parts = &self.quants.parts;
        let covered = parts.iter().map(|p| p.rows).sum::<usize>() == self.n && parts.iter().all(|p| p.rows > 0);
        covered && self.buffers().all(|t| t.parts.len() == parts.len())
    }

    /// Device bytes of all buffers (the traffic of one full read).
    pub fn bytes(&self) -> u64 {
        self.buffers().flat_map(|t| t.parts.iter().map(|p| p.bytes)).sum()
    }
}

impl Format {
    /// The shader flags of this format: `Q8`, `MIN`, `S16` (second scale), `PAIR` (two constants per block), `XSUM`
    /// (block sums of x), `XSUM2` (the sums of each half apart), `HB1` / `HB2` (one or two high-bit words per
    /// block), `NL` (codebook nibbles), `SUPER` with `Q2K` or `Q3K` (2-bit words, sub-block codes and super-block
    /// factors), `K4` (Q4_K: nibbles, codes and factors; also `MIN` and `PAIR`, the rows kernels' `wm` binding
    /// holding the factors), `FACT` (a factor buffer: SUPER or K4) with `FACT2` (two factors: Q2K, K4), and the
    /// definition `QC` (the offset `c` as an f32 literal).
    pub fn shader_flags(self, key: ShaderKey) -> ShaderKey {
        let sup = self.super_block();
        key.flag("Q8", self.q8())
            .flag("MIN", self.has_min())
            .flag("S16", self.split_scale())
            .flag("PAIR", self.pair() || self.ty == GgmlType::Q4_K)
            .flag("K4", self.ty == GgmlType::Q4_K)
            .flag("FACT", self.coded())
            .flag("FACT2", self.two_factors())
            .flag("XSUM", self.needs_x_sum())
            .flag("XSUM2", self.split_scale() || sup)
            .flag("HB1", self.high_bits() >= 1 && !sup)
            .flag("HB2", self.high_bits() == 2)
            .flag("NL", self.codebook())
            .flag("SUPER", sup)
            .flag("Q2K", self.ty == GgmlType::Q2_K)
            .flag("Q3K", self.ty == GgmlType::Q3_K)
            .def("QC", format!("{}.0", self.centre()))
    }
}
