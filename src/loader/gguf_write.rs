//! GGUF v3 writer: metadata of every type and F32/F16/BF16/Q4_0/Q4_1/Q8_0 tensors, aligned like llama.cpp's files.
//! Used by tests to build tiny models in the real layout, and by the quantizer.
//!
//! The `put_*` functions encode single header items with no validation, so tests can also build malformed files.

use std::io::Write;
use std::path::Path;

use super::gguf::{Value, ValueType, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::error::{Error, Result};
use crate::quant::{self, GgmlType};

/// Appends the 24-byte header.
pub fn put_header(buf: &mut Vec<u8>, version: u32, n_tensors: u64, n_kv: u64) {
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&version.to_le_bytes());
    buf.extend_from_slice(&n_tensors.to_le_bytes());
    buf.extend_from_slice(&n_kv.to_le_bytes());
}

/// Appends a GGUF string: u64 length, then the bytes.
pub fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// Appends a value's payload (no type id). Array elements are written as they are, whatever the declared type.
pub fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.push(*x as u8),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => put_string(buf, s),
        Value::Array(t, items) => {
            buf.extend_from_slice(&t.id().to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(buf, item);
            }
        }
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Appends one metadata entry: key, type id, value.
pub fn put_kv(buf: &mut Vec<u8>, key: &str, v: &Value) {
    put_string(buf, key);
    buf.extend_from_slice(&v.value_type().id().to_le_bytes());
    put_value(buf, v);
}

/// Appends one tensor info; `dims` in ggml order (row length first).
pub fn put_tensor_info(buf: &mut Vec<u8>, name: &str, dims: &[u64], type_id: u32, offset: u64) {
    put_string(buf, name);
    buf.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        buf.extend_from_slice(&d.to_le_bytes());
    }
    buf.extend_from_slice(&type_id.to_le_bytes());
    buf.extend_from_slice(&offset.to_le_bytes());
}

struct PendingTensor {
    name: String,
    /// ggml order.
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes a GGUF v3 file.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

/// Whether every element of an array (recursively) has the declared type.
fn well_typed(v: &Value) -> bool {
    match v {
        Value::Array(t, items) => items.iter().all(|i| i.value_type() == *t && well_typed(i)),
        _ => true,
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a metadata entry. `general.alignment` must be a u32 power of two; it sets the alignment.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<()> {
        let key = key.into();
        if !well_typed(&value) {
            return Err(Error::Invalid(format!(
                "metadata {key:?}: array elements differ from the declared type"
            )));
        }
        if key == "general.alignment" && !matches!(value, Value::U32(a) if a.is_power_of_two()) {
            return Err(Error::Invalid(format!(
                "general.alignment must be a u32 power of two, not {value}"
            )));
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        Ok(())
    }

    /// Shorthand for a string array (tokenizer vocabularies, merges).
    pub fn add_str_array<S: AsRef<str>>(&mut self, key: impl Into<String>, items: &[S]) -> Result<()> {
        let items = items.iter().map(|s| Value::String(s.as_ref().to_string())).collect();
        self.add_metadata(key, Value::Array(ValueType::String, items))
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => *a as u64,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Adds a tensor of row-major `shape` (PyTorch order) from f32 values, converted or quantized to `ty`.
    pub fn add_tensor(&mut self, name: impl Into<String>, shape: &[usize], ty: GgmlType, values: &[f32]) -> Result<()> {
        let name = name.into();
        let n: usize = shape.iter().product();
        if values.len() != n {
            return Err(Error::Invalid(format!(
                "tensor {name:?}: {} values for shape {shape:?}",
                values.len()
            )));
        }
        self.check(&name, shape, ty)?;
        let data = quant::quantize(ty, values).map_err(|e| Error::Invalid(format!("tensor {name:?}: {e}")))?;
        self.push(name, shape, ty, data)
    }

    /// Adds a tensor of row-major `shape` from bytes already in `ty`'s layout.
    pub fn add_tensor_bytes(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<()> {
        let name = name.into();
        self.check(&name, shape, ty)?;
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        if ty.bytes_for(n) != Some(data.len() as u64) {
            return Err(Error::Invalid(format!(
                "tensor {name:?}: {} bytes do not hold {n} {ty} elements",
                data.len()
            )));
        }
        self.push(name, shape, ty, data)
    }

    fn check(&self, name: &str, shape: &[usize], ty: GgmlType) -> Result<()> {
        if !ty.is_supported() {
            return Err(Error::Invalid(format!(
                "tensor {name:?}: writing {ty} is not supported"
            )));
        }
        if shape.len() > MAX_DIMS {
            return Err(Error::Invalid(format!(
                "tensor {name:?}: shape {shape:?} has more than {MAX_DIMS} dims"
            )));
        }
        let row = shape.last().copied().unwrap_or(1);
        if row % ty.block_size() != 0 {
            return Err(Error::Invalid(format!(
                "tensor {name:?}: row length {row} is not a multiple of the {ty} block size {}",
                ty.block_size()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(Error::Invalid(format!("tensor {name:?} added twice")));
        }
        Ok(())
    }

    fn push(&mut self, name: String, shape: &[usize], ty: GgmlType, data: Vec<u8>) -> Result<()> {
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push(PendingTensor { name, dims, ty, data });
        Ok(())
    }

    /// Header, metadata, tensor infos and the padding up to the data section.
    fn head(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut buf = Vec::new();
        put_header(&mut buf, 3, self.tensors.len() as u64, self.metadata.len() as u64);
        for (k, v) in &self.metadata {
            put_kv(&mut buf, k, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_tensor_info(&mut buf, &t.name, &t.dims, t.ty.id(), offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(align);
        }
        buf.resize((buf.len() as u64).next_multiple_of(align) as usize, 0);
        buf
    }

    /// Writes the file to `w`, streaming the tensor data (each tensor padded to the alignment).
    pub fn write_to(&self, mut w: impl Write) -> std::io::Result<()> {
        let align = self.alignment() as usize;
        w.write_all(&self.head())?;
        let zeros = vec![0u8; align];
        for t in &self.tensors {
            w.write_all(&t.data)?;
            w.write_all(&zeros[..t.data.len().next_multiple_of(align) - t.data.len()])?;
        }
        Ok(())
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        self.write_to(&mut buf).expect("writing to a Vec cannot fail");
        buf
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        self.write_to(&mut w).map_err(io)?;
        w.flush().map_err(io)
    }
}
