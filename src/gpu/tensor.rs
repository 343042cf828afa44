//! Device tensors: element types, and buffers split by rows into parts that each fit one storage binding.

use super::Gpu;
use crate::error::{Error, Result};
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// Element type of a tensor as it lies in GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// IEEE half, two per `u32` word (read in shaders with `unpack2x16float`).
    F16,
    U32,
}

impl DType {
    /// Bytes of `n` elements (f16 rows are padded to whole words); saturates, so an absurd count fails the size
    /// checks that follow instead of wrapping.
    pub fn bytes(self, n: usize) -> u64 {
        match self {
            DType::F32 | DType::U32 => (n as u64).saturating_mul(4),
            DType::F16 => (n.div_ceil(2) as u64).saturating_mul(4),
        }
    }
}

/// Usage flags of every engine buffer: bindable as storage or uniform, copyable both ways.
pub const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::UNIFORM)
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// One row range of a tensor, in its own buffer.
#[derive(Clone, Debug)]
pub struct Part {
    pub buffer: Arc<wgpu::Buffer>,
    /// First row (index along dim 0) and row count.
    pub row0: usize,
    pub rows: usize,
    pub bytes: u64,
}

/// A tensor resident on the device: shape (row-major), dtype, and one or more row parts.
#[derive(Clone, Debug)]
pub struct GpuTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub parts: Vec<Part>,
}

/// Rows per part so that each part fits in `max_binding` bytes.
pub fn rows_per_part(name: &str, row_bytes: u64, rows: usize, max_binding: u64) -> Result<usize> {
    if row_bytes > max_binding {
        return Err(Error::BindingTooLarge {
            name: name.into(),
            bytes: row_bytes,
            limit: max_binding,
        });
    }
    Ok(((max_binding / row_bytes.max(1)) as usize).clamp(1, rows.max(1)))
}

impl GpuTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of one row (the product of every dim but the first).
    pub fn row_bytes(&self) -> u64 {
        self.dtype.bytes(self.shape.iter().skip(1).product())
    }

    /// Upload `data` (row-major bytes in `dtype`), split into parts of at most the device's binding limit.
    pub fn upload(gpu: &Gpu, name: &str, shape: &[usize], dtype: DType, data: &[u8]) -> Result<GpuTensor> {
        Self::create(gpu, name, shape, dtype, Some(data))
    }

    /// Row parts of `shape` that each fit one binding, filled from `data` or, without it, zero (wgpu zeroes new
    /// buffers: nothing is allocated on the host). Sizes are checked before anything is created.
    fn create(gpu: &Gpu, name: &str, shape: &[usize], dtype: DType, data: Option<&[u8]>) -> Result<GpuTensor> {
        let too_large = || Error::shape("upload", format!("{name}: shape {shape:?} {dtype:?} overflows a size"));
        let rows = shape.first().copied().unwrap_or(1);
        let cols = shape
            .iter()
            .skip(1)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(too_large)?;
        let row_bytes = dtype.bytes(cols);
        let total = row_bytes.checked_mul(rows as u64).ok_or_else(too_large)?;
        if let Some(data) = data {
            if data.len() as u64 != total {
                return Err(Error::shape(
                    "upload",
                    format!("{name}: {} bytes for shape {shape:?} {dtype:?}", data.len()),
                ));
            }
        }
        let per = rows_per_part(name, row_bytes, rows, gpu.caps.max_binding)?;
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < rows.max(1) {
            let n = per.min(rows - row0).max(usize::from(rows == 0));
            let (from, to) = (row0 as u64 * row_bytes, (row0 + n) as u64 * row_bytes);
            let size = to - from;
            let buffer = match data {
                Some(d) if size > 0 => gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(name),
                    contents: &d[from as usize..to as usize],
                    usage: USAGE,
                }),
                _ => gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(name),
                    size: size.next_multiple_of(4).max(4),
                    usage: USAGE,
                    mapped_at_creation: false,
                }),
            };
            parts.push(Part {
                buffer: Arc::new(buffer),
                row0,
                rows: n,
                bytes: size,
            });
            row0 += n.max(1);
        }
        Ok(GpuTensor {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
            parts,
        })
    }

    pub fn upload_f32(gpu: &Gpu, name: &str, shape: &[usize], data: &[f32]) -> Result<GpuTensor> {
        Self::upload(gpu, name, shape, DType::F32, bytemuck::cast_slice(data))
    }

    /// Upload f32 values stored as f16 (rows padded to whole words when the last dim is odd).
    pub fn upload_f16(gpu: &Gpu, name: &str, shape: &[usize], data: &[f32]) -> Result<GpuTensor> {
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let padded = cols.next_multiple_of(2);
        let mut h = Vec::with_capacity(data.len() / cols * padded);
        for row in data.chunks(cols) {
            h.extend(row.iter().map(|&x| half::f16::from_f32(x)));
            h.resize(h.len() + padded - cols, half::f16::ZERO);
        }
        Self::upload(gpu, name, shape, DType::F16, bytemuck::cast_slice(&h))
    }

    /// A zero-filled tensor (KV caches, state).
    pub fn zeros(gpu: &Gpu, name: &str, shape: &[usize], dtype: DType) -> Result<GpuTensor> {
        Self::create(gpu, name, shape, dtype, None)
    }

    /// Copy the whole tensor back (all parts, in order) as raw bytes. Slow path for tests and tools.
    pub fn download(&self, gpu: &Gpu) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for p in &self.parts {
            out.extend(read_buffer(gpu, &p.buffer, 0, p.bytes)?);
        }
        Ok(out)
    }

    /// The values as f32 (f32 or f16 tensors).
    pub fn download_f32(&self, gpu: &Gpu) -> Result<Vec<f32>> {
        values_f32(self.dtype, &self.shape, &self.download(gpu)?)
    }
}

/// The values of a tensor's bytes as f32: f32 as stored, f16 converted (rows padded to whole words: the padding is
/// dropped); u32 is an error.
pub fn values_f32(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Vec<f32>> {
    let cols = shape.last().copied().unwrap_or(1);
    match dtype {
        DType::F32 => Ok(bytemuck::pod_collect_to_vec(bytes)),
        DType::F16 => {
            let halves: Vec<half::f16> = bytemuck::pod_collect_to_vec(bytes);
            let padded = cols.next_multiple_of(2);
            Ok(halves
                .chunks(padded.max(1))
                .flat_map(|row| row[..cols.min(row.len())].iter().map(|h| h.to_f32()))
                .collect())
        }
        DType::U32 => Err(Error::Graph("a u32 tensor read as f32".into())),
    }
}

/// Read `bytes` at `offset` of a buffer through a staging copy (one submit and one wait).
pub fn read_buffer(gpu: &Gpu, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
    let size = bytes.next_multiple_of(4).max(4);
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, size.min(buffer.size() - offset));
    gpu.queue.submit([enc.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |_| {});
    gpu.wait("readback")?;
    let view = staging.get_mapped_range(..).map_err(|e| Error::Gpu {
        context: "readback".into(),
        message: e.to_string(),
    })?;
    Ok(view[..bytes as usize].to_vec())
}
