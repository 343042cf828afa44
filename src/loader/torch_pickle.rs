//! PyTorch `torch.save` files (FR-Spec's `freq_N.pt`, EAGLE's `pytorch_model.bin`), read without running pickle
//! code: the zip archive's `*/data.pkl` is interpreted by a restricted machine that knows only the opcodes torch
//! writes for tensors and dicts of tensors, and builds only numbers, strings, tuples, lists, dicts, storages and
//! tensors; any other global (a class, a function) is an error that names it. Each tensor's bytes are its storage's
//! (`*/data/<key>`), little-endian, contiguous.

use super::zip::StoredZip;
use crate::error::{Error, Result};
use std::path::Path;

/// Element types of the storages torch writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchDtype {
    F32,
    F16,
    BF16,
    I64,
    I32,
    U8,
    Bool,
}

impl TorchDtype {
    fn of_storage(name: &str) -> Option<TorchDtype> {
        Some(match name.strip_prefix("torch.")? {
            "FloatStorage" => TorchDtype::F32,
            "HalfStorage" => TorchDtype::F16,
            "BFloat16Storage" => TorchDtype::BF16,
            "LongStorage" => TorchDtype::I64,
            "IntStorage" => TorchDtype::I32,
            "ByteStorage" => TorchDtype::U8,
            "BoolStorage" => TorchDtype::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            TorchDtype::F32 | TorchDtype::I32 => 4,
            TorchDtype::F16 | TorchDtype::BF16 => 2,
            TorchDtype::I64 => 8,
            TorchDtype::U8 | TorchDtype::Bool => 1,
        }
    }
}

/// One tensor: its type, row-major shape and little-endian bytes.
#[derive(Clone, Debug)]
pub struct TorchTensor {
    pub dtype: TorchDtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl TorchTensor {
    /// Integer values (I64 or I32 tensors).
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        match self.dtype {
            TorchDtype::I64 => Some(
                self.data
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().expect("8")))
                    .collect(),
            ),
            TorchDtype::I32 => Some(
                self.data
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().expect("4")) as i64)
                    .collect(),
            ),
            _ => None,
        }
    }
}

/// What the machine builds.
#[derive(Clone, Debug)]
enum V {
    Mark,
    /// None, booleans, floats, bytes: read past, never used.
    Other,
    Int(i64),
    Str(String),
    Tuple(Vec<V>),
    List(Vec<V>),
    Dict(Vec<(V, V)>),
    Global(String),
    Storage {
        dtype: TorchDtype,
        key: String,
    },
    Tensor {
        dtype: TorchDtype,
        key: String,
        offset: usize,
        shape: Vec<usize>,
        stride: Vec<usize>,
    },
}

/// Most values on the stack or in the memo (a guard against hostile files).
const MAX_VALUES: usize = 1 << 20;

struct Machine<'a> {
    code: &'a [u8],
    at: usize,
    stack: Vec<V>,
    memo: std::collections::HashMap<u32, V>,
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let s = self.code.get(self.at..self.at.saturating_add(n)).ok_or("truncated")?;
        self.at += n;
        Ok(s)
    }
    fn uint(&mut self, n: usize) -> std::result::Result<u64, String> {
        Ok(self.take(n)?.iter().rev().fold(0u64, |a, &b| (a << 8) | b as u64))
    }
    fn line(&mut self) -> std::result::Result<String, String> {
        let rest = &self.code[self.at.min(self.code.len())..];
        let end = rest.iter().position(|&b| b == b'\n').ok_or("truncated")?;
        self.at += end + 1;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
    fn pop(&mut self) -> std::result::Result<V, String> {
        self.stack.pop().ok_or_else(|| "stack underflow".to_string())
    }
    /// The values above the topmost mark, which is removed.
    fn pop_mark(&mut self) -> std::result::Result<Vec<V>, String> {
        let m = self.stack.iter().rposition(|v| matches!(v, V::Mark)).ok_or("no mark")?;
        let items = self.stack.split_off(m + 1);
        self.stack.pop();
        Ok(items)
    }
    fn push(&mut self, v: V) -> std::result::Result<(), String> {
        if self.stack.len() >= MAX_VALUES {
            return Err("too many values".into());
        }
        self.stack.push(v);
        Ok(())
    }

    fn run(&mut self) -> std::result::Result<V, String> {
        loop {
            let op = self.take(1)?[0];
            match op {
                0x80 => {
                    self.take(1)?; // PROTO
                }
                0x95 => {
                    self.take(8)?; // FRAME
                }
                b'}' => self.push(V::Dict(Vec::new()))?,
                b']' => self.push(V::List(Vec::new()))?,
                b')' => self.push(V::Tuple(Vec::new()))?,
                b'(' => self.push(V::Mark)?,
                b'N' | 0x88 | 0x89 => self.push(V::Other)?,
                b'K' => {
                    let v = self.uint(1)? as i64;
                    self.push(V::Int(v))?
                }
                b'M' => {
                    let v = self.uint(2)? as i64;
                    self.push(V::Int(v))?
                }
                b'J' => {
                    let v = self.uint(4)? as u32 as i32 as i64;
                    self.push(V::Int(v))?
                }
                0x8a => {
                    let n = self.uint(1)? as usize;
                    let b = self.take(n)?;
                    if n > 8 {
                        return Err("integer too large".into());
                    }
                    let mut v: i64 = 0;
                    for (i, &x) in b.iter().enumerate() {
                        v |= (x as i64) << (8 * i);
                    }
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.push(V::Int(v))?
                }
                b'G' => {
                    self.take(8)?;
                    self.push(V::Other)?
                }
                b'X' | 0x8c => {
                    let n = if op == b'X' { self.uint(4)? } else { self.uint(1)? } as usize;
                    let s = String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string that is not UTF-8")?;
                    self.push(V::Str(s))?
                }
                b'C' | b'B' => {
                    let n = if op == b'B' { self.uint(4)? } else { self.uint(1)? } as usize;
                    self.take(n)?;
                    self.push(V::Other)?
                }
                b'q' | b'r' => {
                    let k = if op == b'q' { self.uint(1)? } else { self.uint(4)? } as u32;
                    let top = self.stack.last().ok_or("stack underflow")?.clone();
                    if self.memo.len() >= MAX_VALUES {
                        return Err("too many memo entries".into());
                    }
                    self.memo.insert(k, top);
                }
                0x94 => {
                    let top = self.stack.last().ok_or("stack underflow")?.clone();
                    let k = self.memo.len() as u32;
                    self.memo.insert(k, top);
                }
                b'h' | b'j' => {
                    let k = if op == b'h' { self.uint(1)? } else { self.uint(4)? } as u32;
                    let v = self.memo.get(&k).ok_or("a memo key that was never set")?.clone();
                    self.push(v)?
                }
                b'c' => {
                    let (module, name) = (self.line()?, self.line()?);
                    self.push(V::Global(format!("{module}.{name}")))?
                }
                0x93 => {
                    let (name, module) = (self.pop()?, self.pop()?);
                    match (module, name) {
                        (V::Str(m), V::Str(n)) => self.push(V::Global(format!("{m}.{n}")))?,
                        _ => return Err("STACK_GLOBAL of non-strings".into()),
                    }
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(V::Tuple(items))?
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err("stack underflow".into());
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(V::Tuple(items))?
                }
                b'Q' => {
                    let pid = self.pop()?;
                    self.push(storage(pid)?)?
                }
                b'R' | 0x81 => {
                    let (args, f) = (self.pop()?, self.pop()?);
                    self.push(call(f, args)?)?
                }
                b'b' => {
                    self.pop()?; // BUILD: the state (a state dict's `_metadata`) is dropped
                }
                b's' => {
                    let (v, k) = (self.pop()?, self.pop()?);
                    match self.stack.last_mut() {
                        Some(V::Dict(d)) => d.push((k, v)),
                        _ => return Err("SETITEM without a dict".into()),
                    }
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let Some(V::Dict(d)) = self.stack.last_mut() else {
                        return Err("SETITEMS without a dict".into());
                    };
                    let mut it = items.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        d.push((k, v));
                    }
                }
                b'a' => {
                    let v = self.pop()?;
                    match self.stack.last_mut() {
                        Some(V::List(l)) => l.push(v),
                        _ => return Err("APPEND without a list".into()),
                    }
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    match self.stack.last_mut() {
                        Some(V::List(l)) => l.extend(items),
                        _ => return Err("APPENDS without a list".into()),
                    }
                }
                b'.' => return self.pop(),
                other => {
                    return Err(format!(
                        "pickle opcode 0x{other:02x} is not one torch.save writes for tensors"
                    ))
                }
            }
        }
    }
}

/// A persistent id `('storage', torch.<T>Storage, key, location, numel)`.
fn storage(pid: V) -> std::result::Result<V, String> {
    let V::Tuple(t) = pid else {
        return Err("a persistent id that is not a tuple".into());
    };
    match &t[..] {
        [V::Str(kind), V::Global(ty), V::Str(key), ..] if kind == "storage" => {
            let dtype = TorchDtype::of_storage(ty).ok_or_else(|| format!("storage type {ty} is not supported"))?;
            Ok(V::Storage {
                dtype,
                key: key.clone(),
            })
        }
        _ => Err("a persistent id that is not a storage".into()),
    }
}

fn usizes(v: &V) -> std::result::Result<Vec<usize>, String> {
    match v {
        V::Tuple(t) => t
            .iter()
            .map(|x| match x {
                V::Int(i) if *i >= 0 => Ok(*i as usize),
                _ => Err("a size that is not a non-negative integer".to_string()),
            })
            .collect(),
        _ => Err("sizes that are not a tuple".into()),
    }
}

/// The callables the machine runs: tensor rebuilds and empty ordered dicts; anything else is refused by name.
fn call(f: V, args: V) -> std::result::Result<V, String> {
    let V::Global(name) = f else {
        return Err("a call of something that is not a global".into());
    };
    let V::Tuple(a) = args else {
        return Err(format!("{name}: arguments that are not a tuple"));
    };
    match name.as_str() {
        "torch._utils._rebuild_tensor_v2" | "torch._utils._rebuild_tensor" => match &a[..] {
            [V::Storage { dtype, key }, V::Int(offset), size, stride, ..] if *offset >= 0 => Ok(V::Tensor {
                dtype: *dtype,
                key: key.clone(),
                offset: *offset as usize,
                shape: usizes(size)?,
                stride: usizes(stride)?,
            }),
            _ => Err(format!("{name}: unexpected arguments")),
        },
        "torch._utils._rebuild_parameter" => match a.into_iter().next() {
            Some(t @ V::Tensor { .. }) => Ok(t),
            _ => Err(format!("{name}: unexpected arguments")),
        },
        "collections.OrderedDict" if a.is_empty() => Ok(V::Dict(Vec::new())),
        _ => Err(format!(
            "the file calls {name}, which a tensor file has no need of (refused)"
        )),
    }
}

/// The tensors of the `torch.save` file at `path`: a lone tensor (named ""), or a dict of tensors (nested dicts
/// flattened with dotted names; entries that are not tensors skipped).
pub fn read(path: &Path) -> Result<Vec<(String, TorchTensor)>> {
    let bad = |message: String| Error::File {
        path: path.into(),
        message,
    };
    let file = super::open_regular(path)?;
    // SAFETY: read-only map; like every mmap reader we assume nobody truncates the file meanwhile.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    let zip = StoredZip::index(&map, path)?;
    let (pkl, prefix) = zip
        .entries
        .iter()
        .find_map(|(name, r)| Some((r.clone(), name.strip_suffix("data.pkl")?.to_string())))
        .ok_or_else(|| bad("no data.pkl in the archive: not a torch.save file".into()))?;
    if let Some(r) = zip.entries.get(&format!("{prefix}byteorder")) {
        if &map[r.clone()] != b"little" {
            return Err(bad("big-endian tensors are not supported".into()));
        }
    }
    let mut m = Machine {
        code: &map[pkl],
        at: 0,
        stack: Vec::new(),
        memo: Default::default(),
    };
    let top = m.run().map_err(|e| bad(format!("data.pkl: {e}")))?;
    let mut out = Vec::new();
    collect(String::new(), top, &mut out);
    out.into_iter()
        .map(|(name, v)| {
            let V::Tensor {
                dtype,
                key,
                offset,
                shape,
                stride,
            } = v
            else {
                unreachable!("collect keeps tensors only")
            };
            let n: usize = shape.iter().product();
            let mut want = 1;
            for (i, &d) in shape.iter().enumerate().rev() {
                if d > 1 && stride[i] != want {
                    return Err(bad(format!(
                        "tensor {name:?}: strides {stride:?} of shape {shape:?} are not contiguous"
                    )));
                }
                want *= d;
            }
            let r = zip
                .entries
                .get(&format!("{prefix}data/{key}"))
                .ok_or_else(|| bad(format!("tensor {name:?}: storage {key} missing")))?;
            let (from, len) = (offset * dtype.size(), n * dtype.size());
            let bytes = map[r.clone()]
                .get(from..from + len)
                .ok_or_else(|| bad(format!("tensor {name:?}: {n} values past the end of storage {key}")))?;
            Ok((
                name,
                TorchTensor {
                    dtype,
                    shape,
                    data: bytes.to_vec(),
                },
            ))
        })
        .collect()
}

fn collect(name: String, v: V, out: &mut Vec<(String, V)>) {
    match v {
        t @ V::Tensor { .. } => out.push((name, t)),
        V::Dict(d) => {
            for (k, v) in d {
                if let V::Str(k) = k {
                    let full = if name.is_empty() { k } else { format!("{name}.{k}") };
                    collect(full, v, out);
                }
            }
        }
        _ => {}
    }
}

/// Write `tensors` as a safetensors file at `out` (a `pytorch_model.bin` converted for the loaders that map
/// safetensors).
pub fn write_safetensors(tensors: &[(String, TorchTensor)], out: &Path) -> Result<()> {
    use safetensors::Dtype;
    let views = tensors
        .iter()
        .map(|(name, t)| {
            let dtype = match t.dtype {
                TorchDtype::F32 => Dtype::F32,
                TorchDtype::F16 => Dtype::F16,
                TorchDtype::BF16 => Dtype::BF16,
                TorchDtype::I64 => Dtype::I64,
                TorchDtype::I32 => Dtype::I32,
                TorchDtype::U8 => Dtype::U8,
                TorchDtype::Bool => Dtype::BOOL,
            };
            safetensors::tensor::TensorView::new(dtype, t.shape.clone(), &t.data)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Invalid(format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, out).map_err(|e| Error::File {
        path: out.into(),
        message: e.to_string(),
    })
}
