//! Quantized token embedding: gather and dequantize rows of a [`PackedWeight`] (any packable type, either layout)
//! into f32, one dispatch per row part. It reads the same packed copy as `matmul_q`, so a tied token embedding and
//! LM head keep one copy on the device.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use crate::gpu::packed::PackedWeight;
use crate::quant::pack::{kernel_formats, Format, Layout, QK};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbeddingQParams {
    m: u32,
    k: u32,
    row0: u32,
    rows: u32,
    n: u32,
    last: u32,
    groups: u32,
}

#[derive(Debug)]
pub struct EmbeddingQ {
    m: usize,
    k: usize,
    n: usize,
    format: Format,
    layout: Layout,
    /// (first row, row count) of each part.
    parts: Vec<(usize, usize)>,
}

fn key(format: Format, layout: Layout) -> ShaderKey {
    format
        .shader_flags(ShaderKey::new("embedding_q"))
        .flag("TILED", layout == Layout::Tiled)
}

impl EmbeddingQ {
    /// Weight buffers bound (quants, scales, and second constants in the rows layout of two-constant formats).
    fn weight_bindings(&self) -> usize {
        2 + usize::from(self.format.third_buffer(self.layout))
    }
}

impl Kernel for EmbeddingQ {
    fn name(&self) -> &'static str {
        "embedding_q"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let nw = self.weight_bindings();
        (0..self.parts.len())
            .map(|p| {
                let mut bindings = vec![Bind::Tensor(0)];
                bindings.extend((1..=nw).map(|s| Bind::Part(s, p)));
                bindings.push(Bind::Tensor(nw + 1));
                Dispatch {
                    shader: key(self.format, self.layout),
                    bindings,
                    workgroups: grid(self.m, 1, caps.max_workgroups_per_dim),
                }
            })
            .collect()
    }
    fn params(&self, i: usize, _: &StepVars) -> Params {
        let (row0, rows) = self.parts[i];
        Params::of(&EmbeddingQParams {
            m: self.m as u32,
            k: self.k as u32,
            row0: row0 as u32,
            rows: rows as u32,
            n: self.n as u32,
            last: u32::from(i + 1 == self.parts.len()),
            groups: (self.k / QK) as u32,
        })
    }
    /// Ids, one packed row per id (quants and block constants), the f32 rows written.
    fn cost(&self) -> Cost {
        let (m, k) = (self.m as u64, self.k as u64);
        let blocks = k / QK as u64;
        let row = (blocks as f64 * self.format.device_bytes()).ceil() as u64;
        Cost {
            bytes_read: 4 * m + m * row,
            bytes_written: 4 * m * k,
            flops: m
                * k
                * if self.format.has_min() || self.format.super_block() {
                    2
                } else {
                    1
                },
        }
    }
    /// Node tensors: ids, the packed buffers (row parts), rows; the table as the CPU dequantization of those words.
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        let nw = self.weight_bindings();
        expect(|| {
            let table = super::matmul_q::dequantize_io(self.format, self.layout, self.n, self.k, &self.parts, &io[1..=nw])?;
            Ok(vec![Expected::at(1 + nw, reference(&io[0].u32(), &table, self.k))])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        1e-12
    }
}

impl Graph {
    /// Rows `ids` [m] (u32) of the quantized `[n, k]` weight `w`, dequantized to f32 `[m, k]`. Ids >= n give zero
    /// rows; callers should reject them before (the shader only guarantees it never reads out of bounds).
    pub fn embedding_q(&mut self, ids: TensorId, w: &PackedWeight) -> Result<TensorId> {
        let id_shape = self.shape(ids).to_vec();
        let &[m] = &id_shape[..] else {
            return Err(Error::shape("embedding_q", format!("ids {id_shape:?}: want [m]")));
        };
        if m == 0 || self.dtype(ids) != DType::U32 || !w.k.is_multiple_of(QK) || w.n > u32::MAX as usize {
            return Err(Error::shape(
                "embedding_q",
                format!(
                    "ids {id_shape:?} {:?}, {} [{}, {}]: want u32 ids",
                    self.dtype(ids),
                    w.name,
                    w.n,
                    w.k
                ),
            ));
        }
        if m * w.k > u32::MAX as usize {
            return Err(Error::shape("embedding_q", format!("[{m}, {}] output too large", w.k)));
        }
        let parts = w.parts();
        if !w.parts_cover_rows() {
            return Err(Error::shape(
                "embedding_q",
                format!("{}: row parts do not cover its rows", w.name),
            ));
        }
        let kernel = EmbeddingQ {
            m,
            k: w.k,
            n: w.n,
            format: w.format,
            layout: w.layout,
            parts,
        };
        if w.buffers().count() != kernel.weight_bindings() {
            return Err(Error::shape(
                "embedding_q",
                format!("{}: buffers do not match its layout", w.name),
            ));
        }
        let mut inputs = vec![ids];
        for t in w.buffers() {
            inputs.push(self.external(t));
        }
        Ok(self.add_node(kernel, &inputs, &[("embedding_q", &[m, w.k], DType::F32)])?[0])
    }
}

/// CPU reference: `table` the CPU dequantization of the packed weight, [n, k]; ids >= n give zero rows.
pub fn reference(ids: &[u32], table: &[f32], k: usize) -> Vec<f32> {
    let n = table.len() / k;
    ids.iter()
        .flat_map(|&id| match (id as usize) < n {
            true => table[id as usize * k..(id as usize + 1) * k].to_vec(),
            false => vec![0.0; k],
        })
        .collect()
}

/// Format x layout (formats with the same kernel blocks share variants: `kernel_formats`).
pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for format in kernel_formats() {
        for layout in [Layout::Tiled, Layout::Rows] {
            v.push(key(format, layout));
        }
    }
    v
}
