//! Weights from any file format, as the model uses them on the device: `Linear` over any weight format,
//! vectors (norms, biases), and the embedding table (shared with a tied LM head).

use crate::error::{Error, Result};
use crate::gpu::{DType, Gpu, GpuTensor};
use crate::graph::{Graph, TensorId};
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::{to_f32, SafetensorsModel, StDtype};
use crate::quant::pack::PackedWeight;
use crate::quant::GgmlType;

/// A tensor as a file stores it.
pub enum HostData<'a> {
    F32(Vec<f32>),
    /// Little-endian IEEE halves.
    F16(&'a [u8]),
    /// ggml blocks (Q4_0, Q4_1, Q8_0, ...), rows of `shape[1]` weights.
    Quant(GgmlType, &'a [u8]),
}

pub struct HostTensor<'a> {
    pub name: String,
    /// Row-major: `[rows, cols]` for matrices, `[n]` for vectors.
    pub shape: Vec<usize>,
    pub data: HostData<'a>,
}

impl HostTensor<'_> {
    /// Values as f32 (dequantized on the CPU for quantized data): for vectors and CPU references.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        Ok(match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::F16(b) => to_f32(StDtype::F16, b).unwrap_or_default(),
            HostData::Quant(t, b) => crate::quant::dequantize(*t, b)?,
        })
    }
}

/// Where weights come from: a GGUF file or a safetensors model. Names are the caller's (see `llama::Names`).
pub trait WeightSource {
    fn describe(&self) -> String;
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>>;
    fn require(&self, name: &str) -> Result<HostTensor<'_>> {
        self.tensor(name)?
            .ok_or_else(|| Error::Invalid(format!("{}: missing tensor {name}", self.describe())))
    }
}

impl WeightSource for GgufFile {
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some(info) = GgufFile::tensor(self, name) else {
            return Ok(None);
        };
        self.check_supported(info)?;
        let bytes = self.tensor_data(info)?;
        let data = match info.ggml_type {
            GgmlType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(bytes)),
            GgmlType::F16 => HostData::F16(bytes),
            GgmlType::BF16 => HostData::F32(to_f32(StDtype::BF16, bytes).unwrap_or_default()),
            t => HostData::Quant(t, bytes),
        };
        Ok(Some(HostTensor {
            name: name.into(),
            shape: info.shape(),
            data,
        }))
    }
}

impl WeightSource for SafetensorsModel {
    fn describe(&self) -> String {
        "safetensors model".into()
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some((dtype, shape, bytes, path)) = self.get(name) else {
            return Ok(None);
        };
        let data = match dtype {
            StDtype::F16 => HostData::F16(bytes),
            StDtype::F32 | StDtype::BF16 => HostData::F32(to_f32(dtype, bytes).unwrap_or_default()),
            StDtype::I32 => {
                return Err(Error::File {
                    path: path.into(),
                    message: format!("{name}: an integer tensor where floats were expected"),
                })
            }
        };
        Ok(Some(HostTensor {
            name: name.into(),
            shape: shape.to_vec(),
            data,
        }))
    }
}

/// A `[n, k]` weight matrix in whatever format it came in, on the device.
pub enum Linear {
    /// f32 or f16 rows.
    Dense(GpuTensor),
    /// ggml blocks repacked for the adapter, dequantized inside the kernels.
    Quant(Box<PackedWeight>),
}

impl Linear {
    pub fn load(gpu: &Gpu, t: &HostTensor<'_>) -> Result<Linear> {
        if t.shape.len() != 2 {
            return Err(Error::shape(
                "linear",
                format!("{}: {:?} is not a matrix", t.name, t.shape),
            ));
        }
        let (n, k) = (t.shape[0], t.shape[1]);
        match &t.data {
            HostData::F32(v) if v.len() == n * k => {
                Ok(Linear::Dense(GpuTensor::upload_f32(gpu, &t.name, &t.shape, v)?))
            }
            HostData::F16(b) if b.len() == 2 * n * k && k % 2 == 0 => {
                Ok(Linear::Dense(GpuTensor::upload(gpu, &t.name, &t.shape, DType::F16, b)?))
            }
            HostData::F16(_) => Ok(Linear::Dense(GpuTensor::upload_f16(
                gpu,
                &t.name,
                &t.shape,
                &t.to_f32()?,
            )?)),
            HostData::Quant(ty, raw) => Ok(Linear::Quant(Box::new(PackedWeight::upload(
                gpu, &t.name, *ty, n, k, raw,
            )?))),
            _ => Err(Error::shape(
                "linear",
                format!("{}: data does not match {:?}", t.name, t.shape),
            )),
        }
    }

    /// Matrices of one width and storage type stacked by rows into one (gate and up: one matmul instead of two,
    /// the output holding each part's columns side by side). `None` when the parts differ in type or width.
    pub fn load_stacked(gpu: &Gpu, name: &str, parts: &[HostTensor<'_>]) -> Result<Option<Linear>> {
        let Some(first) = parts.first() else { return Ok(None) };
        let k = first.shape.get(1).copied().unwrap_or(0);
        if parts.iter().any(|t| t.shape.len() != 2 || t.shape[1] != k) {
            return Ok(None);
        }
        let n: usize = parts.iter().map(|t| t.shape[0]).sum();
        let shape = [n, k];
        let mut bytes = Vec::new();
        let mut floats = Vec::new();
        for t in parts {
            match (&first.data, &t.data) {
                (HostData::F32(_), HostData::F32(v)) => floats.extend_from_slice(v),
                (HostData::F16(_), HostData::F16(b)) if k % 2 == 0 => bytes.extend_from_slice(b),
                (HostData::Quant(a, _), HostData::Quant(b, raw)) if a == b => bytes.extend_from_slice(raw),
                _ => return Ok(None),
            }
        }
        Ok(Some(match &first.data {
            HostData::F32(_) => Linear::Dense(GpuTensor::upload_f32(gpu, name, &shape, &floats)?),
            HostData::F16(_) => Linear::Dense(GpuTensor::upload(gpu, name, &shape, DType::F16, &bytes)?),
            HostData::Quant(ty, _) => Linear::Quant(Box::new(PackedWeight::upload(gpu, name, *ty, n, k, &bytes)?)),
        }))
    }

    /// `[n, k]` of the weight.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Linear::Dense(t) => (t.shape[0], t.shape[1]),
            Linear::Quant(w) => (w.n, w.k),
        }
    }

    /// Device bytes of the weight (what one GEMV reads).
    pub fn bytes(&self) -> u64 {
        match self {
            Linear::Dense(t) => t.parts.iter().map(|p| p.bytes).sum(),
            Linear::Quant(w) => w.bytes(),
        }
    }

    /// `x [.., k] -> [.., n]`.
    pub fn forward(&self, g: &mut Graph, x: TensorId, bias: Option<&GpuTensor>) -> Result<TensorId> {
        let bias = bias.map(|b| g.external(b));
        match self {
            Linear::Dense(w) => {
                let w = g.external(w);
                g.matmul(x, w, bias)
            }
            Linear::Quant(w) => g.matmul_q(x, w, bias),
        }
    }

    /// Rows of the matrix for token ids (the embedding lookup; a tied LM head shares this copy).
    pub fn gather(&self, g: &mut Graph, ids: TensorId) -> Result<TensorId> {
        match self {
            Linear::Dense(w) => {
                let w = g.external(w);
                g.embedding(ids, w)
            }
            Linear::Quant(w) => g.embedding_q(ids, w),
        }
    }
}

/// A vector weight (norm scale or bias) as f32 on the device.
pub fn load_vector(gpu: &Gpu, t: &HostTensor<'_>, len: usize) -> Result<GpuTensor> {
    let v = t.to_f32()?;
    if v.len() != len {
        return Err(Error::shape(
            "weights",
            format!("{}: {} values, expected {len}", t.name, v.len()),
        ));
    }
    GpuTensor::upload_f32(gpu, &t.name, &[len], &v)
}
