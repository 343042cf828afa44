//! Weights from any file format, as the model uses them on the device: `Linear` over any weight format,
//! vectors (norms, biases), and the embedding table (shared with a tied LM head). GPTQ / AWQ layers of a
//! safetensors checkpoint are served as `X.weight`, repacked into ggml blocks ([`crate::quant::gptq`]).

use crate::error::{Error, Result};
use crate::gpu::packed::PackedWeight;
use crate::gpu::{DType, Gpu, GpuTensor};
use crate::graph::{Graph, TensorId};
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::{to_f32, SafetensorsModel, StDtype};
use crate::ops::silu_mul::Glu;
use crate::quant::gptq::{self, GptqTensors, Method, RawTensor};
use crate::quant::GgmlType;

/// A tensor as a file stores it.
pub enum HostData<'a> {
    F32(Vec<f32>),
    /// Little-endian IEEE halves.
    F16(&'a [u8]),
    /// ggml blocks (Q4_0, Q4_1, Q8_0, ...), rows of `shape[1]` weights.
    Quant(GgmlType, &'a [u8]),
    /// ggml blocks made at load (GPTQ / AWQ repacked). With `perm` (act-order), column `j` of the blocks holds
    /// column `perm[j]` of the matrix: the layer gathers `x[.., perm]` before its matmul.
    Repacked {
        ty: GgmlType,
        raw: Vec<u8>,
        perm: Option<Vec<u32>>,
    },
}

/// Block-quantized data: (type, blocks, column permutation).
type Blocks<'b> = (GgmlType, &'b [u8], Option<&'b [u32]>);

impl HostData<'_> {
    /// The blocks of block-quantized data.
    fn blocks(&self) -> Option<Blocks<'_>> {
        match self {
            HostData::Quant(t, b) => Some((*t, b, None)),
            HostData::Repacked { ty, raw, perm } => Some((*ty, raw, perm.as_deref())),
            _ => None,
        }
    }
}

pub struct HostTensor<'a> {
    pub name: String,
    /// Row-major: `[rows, cols]` for matrices, `[n]` for vectors.
    pub shape: Vec<usize>,
    pub data: HostData<'a>,
}

impl<'a> HostTensor<'a> {
    /// Rows `r0 .. r0 + n` of a matrix `[rows, cols]`, named `name` (a fused q|k|v or gate|up matrix served in
    /// parts). Rows of every format are whole blocks, so this is a slice of the data.
    pub fn rows(&self, name: &str, r0: usize, n: usize) -> Result<HostTensor<'a>> {
        let [rows, cols] = self.shape[..] else {
            return Err(Error::shape(
                "weights",
                format!("{}: {:?} is not a matrix", self.name, self.shape),
            ));
        };
        if r0 + n > rows {
            return Err(Error::shape(
                "weights",
                format!("{}: rows {r0}..{} of {rows}", self.name, r0 + n),
            ));
        }
        let data = match &self.data {
            HostData::F32(v) => HostData::F32(v[r0 * cols..(r0 + n) * cols].to_vec()),
            HostData::F16(b) => HostData::F16(&b[r0 * cols * 2..(r0 + n) * cols * 2]),
            HostData::Quant(t, b) => {
                let row = b.len() / rows;
                HostData::Quant(*t, &b[r0 * row..(r0 + n) * row])
            }
            HostData::Repacked { ty, raw, perm } => {
                let row = raw.len() / rows;
                HostData::Repacked {
                    ty: *ty,
                    raw: raw[r0 * row..(r0 + n) * row].to_vec(),
                    perm: perm.clone(),
                }
            }
        };
        Ok(HostTensor {
            name: name.into(),
            shape: vec![n, cols],
            data,
        })
    }

    /// Values as f32 (dequantized on the CPU for quantized data): for vectors and CPU references.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        Ok(match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::F16(b) => to_f32(StDtype::F16, b).unwrap_or_default(),
            HostData::Quant(t, b) => crate::quant::dequantize(*t, b)?,
            HostData::Repacked { ty, raw, perm } => {
                let blocks = crate::quant::dequantize(*ty, raw)?;
                match perm {
                    None => blocks,
                    Some(p) => {
                        let k = p.len();
                        let mut w = vec![0f32; blocks.len()];
                        for (row, out) in blocks.chunks_exact(k).zip(w.chunks_exact_mut(k)) {
                            for (&x, &i) in row.iter().zip(p) {
                                out[i as usize] = x;
                            }
                        }
                        w
                    }
                }
            }
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
            return match name.strip_suffix(".weight") {
                Some(prefix) if self.get(&format!("{prefix}.qweight")).is_some() => {
                    load_gptq(self, prefix, name).map(Some)
                }
                _ => Ok(None),
            };
        };
        let data = match dtype {
            StDtype::F16 => HostData::F16(bytes),
            StDtype::F32 | StDtype::BF16 => HostData::F32(to_f32(dtype, bytes).unwrap_or_default()),
            StDtype::I32 | StDtype::I64 | StDtype::Bool => {
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

/// The GPTQ / AWQ layer `prefix` (`prefix.qweight`, `.qzeros`, `.scales`, `.g_idx`) as the quantized `[N, K]`
/// matrix `name`, repacked into ggml blocks; errors name the tensor and its file.
fn load_gptq<'a>(st: &'a SafetensorsModel, prefix: &str, name: &str) -> Result<HostTensor<'a>> {
    let qweight_name = format!("{prefix}.qweight");
    let (_, _, _, qpath) = st.get(&qweight_name).expect("the caller found the qweight tensor");
    let in_file = |e: Error, path: &std::path::Path| match e {
        Error::Invalid(message) => Error::File {
            path: path.into(),
            message,
        },
        e => e,
    };
    let Some(q) = st.quant() else {
        return Err(Error::File {
            path: qpath.into(),
            message: format!(
                "{qweight_name} is a GPTQ/AWQ tensor, but the model has no quantization_config in config.json \
                 (nor a quantize_config.json)"
            ),
        });
    };
    let scheme = q.scheme;
    let part = |suffix: &str, want: StDtype, required: bool| -> Result<Option<RawTensor<'a>>> {
        let full = format!("{prefix}.{suffix}");
        match st.get(&full) {
            Some((dtype, shape, bytes, path)) => {
                if dtype != want {
                    return Err(Error::File {
                        path: path.into(),
                        message: format!("{full}: dtype {dtype:?}, expected {want:?}"),
                    });
                }
                Ok(Some(RawTensor { shape, bytes }))
            }
            None if required => Err(Error::File {
                path: qpath.into(),
                message: format!(
                    "{full} is missing ({} layer {prefix}{})",
                    q.describe(),
                    if suffix == "g_idx" {
                        ": act-order (desc_act) checkpoints need it"
                    } else {
                        ""
                    }
                ),
            }),
            None => Ok(None),
        }
    };
    let qweight = part("qweight", StDtype::I32, true)?.expect("required");
    let qzeros = part("qzeros", StDtype::I32, true)?.expect("required");
    let scales = part("scales", StDtype::F16, true)?.expect("required");
    let g_idx = match scheme.method {
        Method::Gptq => part("g_idx", StDtype::I32, q.desc_act)?,
        Method::Awq => None,
    };
    let t = GptqTensors::from_raw(&scheme, prefix, qweight, qzeros, scales, g_idx).map_err(|e| in_file(e, qpath))?;
    let r = gptq::repack(&scheme, &t, prefix).map_err(|e| in_file(e, qpath))?;
    Ok(HostTensor {
        name: name.into(),
        shape: vec![t.n, t.k],
        data: HostData::Repacked {
            ty: r.ty,
            raw: r.raw,
            perm: r.perm,
        },
    })
}

/// A `[n, k]` weight matrix in whatever format it came in, on the device (a clone shares the buffers).
#[derive(Clone)]
pub enum Linear {
    /// f32 or f16 rows.
    Dense(GpuTensor),
    /// ggml blocks repacked for the adapter, dequantized inside the kernels. With `perm` (u32 `[k]`, GPTQ
    /// act-order) the blocks' column `j` is input `perm[j]`: `forward` gathers `x[.., perm]` first.
    Quant {
        w: Box<PackedWeight>,
        perm: Option<GpuTensor>,
    },
}

/// A column permutation on the device, `[k]` u32.
fn upload_perm(gpu: &Gpu, name: &str, perm: Option<&[u32]>) -> Result<Option<GpuTensor>> {
    perm.map(|p| {
        GpuTensor::upload(
            gpu,
            &format!("{name}.perm"),
            &[p.len()],
            DType::U32,
            bytemuck::cast_slice(p),
        )
    })
    .transpose()
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
            data @ (HostData::Quant(..) | HostData::Repacked { .. }) => {
                let (ty, raw, perm) = data.blocks().expect("block-quantized data");
                if perm.is_some_and(|p| p.len() != k) {
                    return Err(Error::shape(
                        "linear",
                        format!("{}: a permutation of another length", t.name),
                    ));
                }
                Ok(Linear::Quant {
                    w: Box::new(PackedWeight::upload(gpu, &t.name, ty, n, k, raw)?),
                    perm: upload_perm(gpu, &t.name, perm)?,
                })
            }
            _ => Err(Error::shape(
                "linear",
                format!("{}: data does not match {:?}", t.name, t.shape),
            )),
        }
    }

    /// Matrices of one width and storage type stacked by rows into one (q, k and v: one matmul instead of three,
    /// the output holding each part's columns side by side). `None` when the parts differ in type, width or
    /// column permutation (act-order GPTQ layers quantized with different orders).
    pub fn load_stacked(gpu: &Gpu, name: &str, parts: &[HostTensor<'_>]) -> Result<Option<Linear>> {
        Self::load_joined(gpu, name, &parts.iter().collect::<Vec<_>>(), false)
    }

    /// Gate and up, stored alike, as one matrix of (gate, up) row pairs: row 2i is gate row i, row 2i + 1 up row
    /// i, the layout of the matmuls' GLU epilogue ([`Linear::forward_glu`]), in which the rows of one output are
    /// summed by one invocation. `None` as for [`Linear::load_stacked`], for shapes that differ, and for a dense
    /// matrix whose binding-sized row parts would split a pair.
    pub fn load_paired(gpu: &Gpu, name: &str, gate: &HostTensor<'_>, up: &HostTensor<'_>) -> Result<Option<Linear>> {
        if gate.shape != up.shape {
            return Ok(None);
        }
        let paired = Self::load_joined(gpu, name, &[gate, up], true)?;
        Ok(paired.filter(Linear::pairs_whole))
    }

    /// Whether every row part starts at an even row (so no part splits a (gate, up) pair).
    fn pairs_whole(&self) -> bool {
        match self {
            Linear::Dense(t) => t.parts.iter().all(|p| p.row0 % 2 == 0),
            Linear::Quant { w, .. } => w.parts().iter().all(|p| p.0 % 2 == 0),
        }
    }

    /// [`Linear::load_stacked`], or with `pair` the parts' rows interleaved one by one (parts of equal rows).
    fn load_joined(gpu: &Gpu, name: &str, parts: &[&HostTensor<'_>], pair: bool) -> Result<Option<Linear>> {
        let Some(first) = parts.first() else { return Ok(None) };
        let k = first.shape.get(1).copied().unwrap_or(0);
        if parts.iter().any(|t| t.shape.len() != 2 || t.shape[1] != k) {
            return Ok(None);
        }
        let rows: Vec<usize> = parts.iter().map(|t| t.shape[0]).collect();
        let n: usize = rows.iter().sum();
        let shape = [n, k];
        let mut bytes = Vec::new();
        let mut floats = Vec::new();
        for t in parts {
            match (&first.data, &t.data) {
                (HostData::F32(_), HostData::F32(v)) => floats.push(v.as_slice()),
                (HostData::F16(_), HostData::F16(b)) if k % 2 == 0 => bytes.push(*b),
                (a, b) => match (a.blocks(), b.blocks()) {
                    (Some((ta, _, pa)), Some((tb, raw, pb))) if ta == tb && pa == pb => bytes.push(raw),
                    _ => return Ok(None),
                },
            }
        }
        let (bytes, floats) = (join_rows(&bytes, &rows, pair), join_rows(&floats, &rows, pair));
        Ok(Some(match first.data.blocks() {
            Some((ty, _, perm)) => {
                if perm.is_some_and(|p| p.len() != k) {
                    return Err(Error::shape(
                        "linear",
                        format!("{name}: a permutation of another length"),
                    ));
                }
                Linear::Quant {
                    w: Box::new(PackedWeight::upload(gpu, name, ty, n, k, &bytes)?),
                    perm: upload_perm(gpu, name, perm)?,
                }
            }
            None if matches!(first.data, HostData::F32(_)) => {
                Linear::Dense(GpuTensor::upload_f32(gpu, name, &shape, &floats)?)
            }
            None => Linear::Dense(GpuTensor::upload(gpu, name, &shape, DType::F16, &bytes)?),
        }))
    }

    /// `act(x W_gate^T) * (x W_up^T)` `[.., n / 2]` of a [`Linear::load_paired`] weight: one matmul with a GLU
    /// epilogue.
    pub fn forward_glu(&self, g: &mut Graph, x: TensorId, act: Glu) -> Result<TensorId> {
        match self {
            Linear::Dense(w) => {
                let w = g.external(w);
                g.matmul_glu(x, w, act)
            }
            Linear::Quant { w, perm } => {
                let x = gather_perm(g, x, perm.as_ref())?;
                g.matmul_q_glu(x, w, act)
            }
        }
    }

    /// `[n, k]` of the weight.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Linear::Dense(t) => (t.shape[0], t.shape[1]),
            Linear::Quant { w, .. } => (w.n, w.k),
        }
    }

    /// Device bytes of the weight (what one GEMV reads).
    pub fn bytes(&self) -> u64 {
        match self {
            Linear::Dense(t) => t.parts.iter().map(|p| p.bytes).sum(),
            Linear::Quant { w, perm } => w.bytes() + perm.as_ref().map_or(0, |p| 4 * p.numel() as u64),
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
            Linear::Quant { w, perm } => {
                let x = gather_perm(g, x, perm.as_ref())?;
                g.matmul_q(x, w, bias)
            }
        }
    }

    /// Rows of the matrix for token ids (the embedding lookup; a tied LM head shares this copy).
    pub fn gather(&self, g: &mut Graph, ids: TensorId) -> Result<TensorId> {
        match self {
            Linear::Dense(w) => {
                let w = g.external(w);
                g.embedding(ids, w)
            }
            Linear::Quant { w, perm: None } => g.embedding_q(ids, w),
            // No checkpoint quantizes its embedding with act-order; supporting it would need the inverse gather.
            Linear::Quant { w, perm: Some(_) } => Err(Error::Invalid(format!(
                "{}: an embedding table with act-order (permuted) columns is not supported",
                w.name
            ))),
        }
    }
}

/// `x[.., perm]` with an act-order permutation, else `x`.
fn gather_perm(g: &mut Graph, x: TensorId, perm: Option<&GpuTensor>) -> Result<TensorId> {
    match perm {
        Some(p) => {
            let p = g.external(p);
            g.gather_cols(x, p)
        }
        None => Ok(x),
    }
}

/// The rows of `parts` (row-major matrices of `rows[i]` rows each, as elements of any size) one part after the
/// other, or with `pair` row i of every part in turn (parts of equal rows).
fn join_rows<T: Copy>(parts: &[&[T]], rows: &[usize], pair: bool) -> Vec<T> {
    if !pair || parts.is_empty() {
        return parts.concat();
    }
    let widths: Vec<usize> = parts.iter().zip(rows).map(|(p, &r)| p.len() / r.max(1)).collect();
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for i in 0..rows[0] {
        for (p, &w) in parts.iter().zip(&widths) {
            out.extend_from_slice(&p[i * w..(i + 1) * w]);
        }
    }
    out
}

/// Vectors (the biases or norms of stacked parts) concatenated into one f32 tensor `[sum of lens]`, `f` applied to
/// every value; a missing part reads as zeros (an exact no-op for a bias). `None` when every part is missing.
pub fn load_concat(
    gpu: &Gpu,
    name: &str,
    parts: &[(Option<HostTensor<'_>>, usize)],
    f: impl Fn(f32) -> f32,
) -> Result<Option<GpuTensor>> {
    if parts.iter().all(|(t, _)| t.is_none()) {
        return Ok(None);
    }
    let mut v = Vec::new();
    for (t, len) in parts {
        match t {
            Some(t) => {
                let part = t.to_f32()?;
                if part.len() != *len {
                    return Err(Error::shape(
                        "weights",
                        format!("{}: {} values, expected {len}", t.name, part.len()),
                    ));
                }
                v.extend(part.into_iter().map(&f));
            }
            None => v.resize(v.len() + len, 0.0),
        }
    }
    GpuTensor::upload_f32(gpu, name, &[v.len()], &v).map(Some)
}

/// A vector weight (norm scale or bias) as f32 on the device.
pub fn load_vector(gpu: &Gpu, t: &HostTensor<'_>, len: usize) -> Result<GpuTensor> {
    load_vector_with(gpu, t, len, |w| w)
}

/// [`load_vector`] with `f` applied to every value first (Gemma's `1 + w` norms, a scale folded into a norm).
pub fn load_vector_with(gpu: &Gpu, t: &HostTensor<'_>, len: usize, f: impl Fn(f32) -> f32) -> Result<GpuTensor> {
    let v: Vec<f32> = t.to_f32()?.into_iter().map(f).collect();
    if v.len() != len {
        return Err(Error::shape(
            "weights",
            format!("{}: {} values, expected {len}", t.name, v.len()),
        ));
    }
    GpuTensor::upload_f32(gpu, &t.name, &[len], &v)
}
