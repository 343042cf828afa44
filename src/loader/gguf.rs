//! GGUF reader (versions 2 and 3): header, typed metadata, tensor infos and memory-mapped tensor data.
//!
//! File layout (all integers little-endian):
//! ```text
//! "GGUF"  u32 version  u64 n_tensors  u64 n_kv
//! n_kv x      { string key, u32 value_type, value }
//! n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//! padding to `general.alignment` (default 32), then the data section; each tensor's `offset` is relative to it
//! string = u64 byte length + UTF-8 bytes;  array = u32 element type + u64 count + elements (arrays may nest)
//! ```
//! Dimensions are listed fastest-first as in ggml: `ne[0]` is the row length. [`TensorInfo::dims`] keeps that order;
//! [`TensorInfo::shape`] gives the row-major (PyTorch) order, so a `[n_embd, n_vocab]` ggml token embedding has
//! shape `[n_vocab, n_embd]`.
//!
//! Opening validates everything the rest of the engine relies on (sizes, alignment, bounds, no overlaps, no
//! duplicates), so a bad file is an [`Error::File`] naming the file and the fault, never a panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
pub use crate::quant::GgmlType;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
/// Nested arrays deeper than this are rejected (guards the recursive parser's stack).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Magic, version, tensor count, metadata count.
pub const HEADER_BYTES: usize = 24;

pub use super::gguf_value::{FromValue, Value, ValueType};

/// One tensor's description from the file header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order, fastest-varying first: `dims[0]` is the row length (`ne[0]`).
    pub dims: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Byte offset inside the data section (a multiple of the file's alignment).
    pub offset: u64,
    /// Product of `dims` (1 for a 0-dimensional tensor).
    pub n_elements: usize,
    /// Bytes of data.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Row-major (PyTorch) shape: `dims` reversed, slowest-varying first.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// Elements per row (`ne[0]`; 1 for a 0-dimensional tensor).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Rows: the product of all dimensions but the first.
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product()
    }
}

enum Data {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Data {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Mmap(m) => m,
            Data::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed metadata and tensor infos over the memory-mapped bytes.
///
/// The file is mapped read-only; it must not be modified while open (as with any memory-mapped file).
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
    data: Data,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("len", &self.data.bytes().len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates `path`, mapping it into memory.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = super::open_regular(path)?;
        let len = file.metadata().map_err(io)?.len();
        let data = if len < HEADER_BYTES as u64 {
            // Too short to be valid; read it (mapping an empty file fails) so the parser names the fault.
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io)?;
            Data::Owned(bytes)
        } else {
            // SAFETY: the map is read-only and private to this value; like every mmap reader we rely on the file
            // not being truncated or rewritten while it is open (documented on `GgufFile`).
            Data::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::parse(path.to_path_buf(), data)
    }

    /// Parses a GGUF image held in memory; `name` stands for the file in error messages.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(name.into(), Data::Owned(bytes))
    }

    fn parse(path: PathBuf, data: Data) -> Result<GgufFile> {
        match parse_header(data.bytes()) {
            Ok(h) => {
                let metadata_index = h
                    .metadata
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (k.clone(), i))
                    .collect();
                let tensor_index = h.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
                Ok(GgufFile {
                    path,
                    version: h.version,
                    alignment: h.alignment,
                    metadata: h.metadata,
                    metadata_index,
                    tensors: h.tensors,
                    tensor_index,
                    data_offset: h.data_offset,
                    data,
                })
            }
            Err(message) => Err(Error::File { path, message }),
        }
    }

    fn err(&self, message: impl Into<String>) -> Error {
        Error::File {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and of each tensor's offset.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// All metadata, in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The value of `key` converted to `T`; an error names the file and key when it is missing or of another type.
    pub fn get<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<T> {
        self.get_opt(key)?
            .ok_or_else(|| self.err(format!("missing metadata key {key:?}")))
    }

    /// Like [`GgufFile::get`], but a missing key is `Ok(None)` (a key of the wrong type is still an error).
    pub fn get_opt<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<Option<T>> {
        let Some(v) = self.metadata(key) else {
            return Ok(None);
        };
        match T::from_value(v) {
            Some(t) => Ok(Some(t)),
            None => Err(self.err(format!(
                "metadata key {key:?} is {:?} {v}, expected {}",
                v.value_type(),
                T::expected()
            ))),
        }
    }

    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get(key)
    }
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get(key)
    }
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.get(key)
    }
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get(key)
    }
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.get(key)
    }
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get(key)
    }
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get(key)
    }
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.get(key)
    }
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.get(key)
    }

    /// `general.architecture` (`llama`, `qwen2`, ...): the prefix of the model's hyperparameter keys.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor `name`, or an error naming the file and the tensor.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| self.err(format!("no tensor named {name:?}")))
    }

    /// Errors unless shaderlm can use the tensor's type.
    pub fn check_supported(&self, info: &TensorInfo) -> Result<()> {
        if info.ggml_type.is_supported() {
            return Ok(());
        }
        Err(self.err(format!(
            "tensor {:?} has type {}, not supported yet (supported: {})",
            info.name,
            info.ggml_type,
            GgmlType::supported_names()
        )))
    }

    /// The raw bytes of a tensor of this file (for any type whose layout is known).
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        if self.tensor(&info.name) != Some(info) {
            return Err(self.err(format!("tensor {:?} is not a tensor of this file", info.name)));
        }
        let bytes = self.data.bytes();
        // Validated at open; checked again so no info can ever index out of bounds.
        self.data_offset
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| bytes.get(s..s.checked_add(info.n_bytes)?))
            .ok_or_else(|| self.err(format!("tensor {:?} data lies outside the file", info.name)))
    }

    /// A tensor's values dequantized to f32, in memory order (row-major over [`TensorInfo::shape`]).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.require_tensor(name)?;
        self.check_supported(info)?;
        let bytes = self.tensor_data(info)?;
        crate::quant::dequantize(info.ggml_type, bytes).map_err(|e| self.err(format!("tensor {name:?}: {e}")))
    }
}

struct Header {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

/// A bounds-checked little-endian reader; every failure is a message saying what was being read.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

type Msg<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Msg<&'a [u8]> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: {} needs {n} bytes at offset {}, but the file ends at {}",
                what(),
                self.pos,
                self.b.len()
            ));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Msg<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Msg<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Msg<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count that must fit in what is left of the file at `min_bytes` per item.
    fn count(&mut self, min_bytes: usize, what: &dyn Fn() -> String) -> Msg<usize> {
        let n = self.u64(what)?;
        self.fits(n, min_bytes, what)
    }

    /// Checks that `n` items of at least `min_bytes` each fit in what is left of the file.
    fn fits(&self, n: u64, min_bytes: usize, what: &dyn Fn() -> String) -> Msg<usize> {
        let fits = n
            .checked_mul(min_bytes as u64)
            .is_some_and(|b| b <= self.remaining() as u64);
        if !fits {
            return Err(format!(
                "{} is {n}, more than the {} bytes left in the file can hold",
                what(),
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Msg<String> {
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{} at offset {at} is not valid UTF-8: {e}", what()))
    }

    fn value(&mut self, ty: ValueType, depth: usize, what: &dyn Fn() -> String) -> Msg<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("{} is a bool of byte value {b} (expected 0 or 1)", what())),
            },
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("{} nests arrays deeper than {MAX_ARRAY_DEPTH} levels", what()));
                }
                let id = self.u32(&|| format!("element type of {}", what()))?;
                let elem =
                    ValueType::from_id(id).ok_or_else(|| format!("{} has unknown element type id {id}", what()))?;
                let n = self.count(elem.min_bytes(), &|| format!("element count of {}", what()))?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                Value::Array(elem, items)
            }
        })
    }
}

fn parse_header(b: &[u8]) -> Msg<Header> {
    let mut c = Cursor { b, pos: 0 };
    if b.len() < 4 || b[..4] != MAGIC {
        let got = &b[..b.len().min(4)];
        return Err(format!(
            "not a GGUF file: it starts with bytes {got:02x?}, expected \"GGUF\""
        ));
    }
    c.pos = 4;
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        let hint = if matches!(version.swap_bytes(), 2 | 3) {
            " (this looks like a big-endian GGUF file; only little-endian files are supported)"
        } else if version == 1 {
            " (version 1 is an early draft of GGUF; convert the model again with a recent llama.cpp)"
        } else {
            ""
        };
        return Err(format!(
            "unsupported GGUF version {version}: only versions 2 and 3 are read{hint}"
        ));
    }
    // The smallest tensor info is 24 bytes (empty name, no dims); the smallest key/value is 13.
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    let n_tensors = c.fits(n_tensors, 24, &|| "the tensor count".into())?;
    let n_kv = c.fits(n_kv, 13, &|| "the metadata count".into())?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut seen = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata value {key:?}");
        let id = c.u32(&|| format!("type of {}", what()))?;
        let ty = ValueType::from_id(id).ok_or_else(|| format!("{} has unknown value type id {id}", what()))?;
        let value = c.value(ty, 0, &what)?;
        if seen.insert(key.clone(), i).is_some() {
            return Err(format!("metadata key {key:?} appears twice"));
        }
        metadata.push((key, value));
    }

    let alignment = match seen.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(&Value::U32(a)) if a.is_power_of_two() => a as u64,
        Some(v) => {
            return Err(format!(
                "general.alignment is {:?} {v}, expected a u32 power of two",
                v.value_type()
            ))
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors);
    let mut names = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let what = || format!("tensor {name:?}");
        let n_dims = c.u32(&|| format!("dimension count of {}", what()))? as usize;
        if n_dims > MAX_DIMS {
            return Err(format!(
                "{} has {n_dims} dimensions, at most {MAX_DIMS} are allowed",
                what()
            ));
        }
        let mut dims = Vec::with_capacity(n_dims);
        let mut n_elements: u64 = 1;
        for d in 0..n_dims {
            let ne = c.u64(&|| format!("dimension {d} of {}", what()))?;
            n_elements = n_elements
                .checked_mul(ne)
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| {
                    format!(
                        "{}: the element count overflows (dimensions so far {dims:?} x {ne})",
                        what()
                    )
                })?;
            dims.push(ne);
        }
        let id = c.u32(&|| format!("type of {}", what()))?;
        let ggml_type = GgmlType::from_id(id).ok_or_else(|| format!("{} has unknown ggml type id {id}", what()))?;
        let offset = c.u64(&|| format!("offset of {}", what()))?;

        let row = dims.first().copied().unwrap_or(1);
        if row % ggml_type.block_size() as u64 != 0 {
            return Err(format!(
                "{} has type {ggml_type} but its row length {row} is not a multiple of the block size {}",
                what(),
                ggml_type.block_size()
            ));
        }
        let n_bytes = ggml_type
            .bytes_for(n_elements)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("{}: the byte size overflows", what()))?;
        let (Ok(n_elements), Ok(n_bytes), Ok(dims)) = (
            usize::try_from(n_elements),
            usize::try_from(n_bytes),
            dims.iter()
                .map(|&d| usize::try_from(d))
                .collect::<std::result::Result<Vec<usize>, _>>(),
        ) else {
            return Err(format!("{} is too large for this machine's address space", what()));
        };
        if offset % alignment != 0 {
            return Err(format!(
                "{} has offset {offset}, not a multiple of the alignment {alignment}",
                what()
            ));
        }
        if names.insert(name.clone(), i).is_some() {
            return Err(format!("tensor name {name:?} appears twice"));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_elements,
            n_bytes,
        });
    }

    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let file_len = b.len() as u64;
    for t in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes as u64));
        if end.is_none_or(|e| e > file_len) {
            return Err(format!(
                "tensor {:?} ({} bytes at data offset {}) runs past the end of the file ({file_len} bytes, data \
                 section at {data_offset}); the file is truncated or corrupt",
                t.name, t.n_bytes, t.offset
            ));
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for w in by_offset.windows(2) {
        if w[0].offset + w[0].n_bytes as u64 > w[1].offset {
            return Err(format!(
                "tensors {:?} (bytes {}..{}) and {:?} (from {}) overlap in the data section",
                w[0].name,
                w[0].offset,
                w[0].offset + w[0].n_bytes as u64,
                w[1].name,
                w[1].offset
            ));
        }
    }
    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
    })
}
