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

/// Most values on the stack or in the memo, and the deepest nesting of containers (guards against hostile files:
/// state dicts nest a few levels).
const MAX_VALUES: usize = 1 << 20;
const MAX_DEPTH: u16 = 64;

/// A value with the nesting depth of its containers (0 for a leaf).
type Slot = (V, u16);

struct Machine<'a> {
    code: &'a [u8],
    at: usize,
    stack: Vec<Slot>,
    memo: std::collections::HashMap<u32, Slot>,
}

type Step<T> = std::result::Result<T, String>;

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        let s = self.code.get(self.at..self.at.saturating_add(n)).ok_or("truncated")?;
        self.at += n;
        Ok(s)
    }
    fn uint(&mut self, n: usize) -> Step<u64> {
        Ok(self.take(n)?.iter().rev().fold(0u64, |a, &b| (a << 8) | b as u64))
    }
    fn line(&mut self) -> Step<String> {
        let rest = &self.code[self.at.min(self.code.len())..];
        let end = rest.iter().position(|&b| b == b'\n').ok_or("truncated")?;
        self.at += end + 1;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
    fn pop(&mut self) -> Step<Slot> {
        self.stack.pop().ok_or_else(|| "stack underflow".to_string())
    }
    /// The values above the topmost mark, which is removed.
    fn pop_mark(&mut self) -> Step<Vec<Slot>> {
        let m = self
            .stack
            .iter()
            .rposition(|v| matches!(v.0, V::Mark))
            .ok_or("no mark")?;
        let items = self.stack.split_off(m + 1);
        self.stack.pop();
        Ok(items)
    }
    fn push_at(&mut self, v: V, depth: u16) -> Step<()> {
        if self.stack.len() >= MAX_VALUES {
            return Err("too many values".into());
        }
        if depth > MAX_DEPTH {
            return Err(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        self.stack.push((v, depth));
        Ok(())
    }
    fn push(&mut self, v: V) -> Step<()> {
        self.push_at(v, 0)
    }
    /// A container of `items`, one level above the deepest of them.
    fn push_container(&mut self, items: Vec<Slot>, make: impl FnOnce(Vec<V>) -> V) -> Step<()> {
        let depth = items.iter().map(|s| s.1).max().unwrap_or(0) + 1;
        self.push_at(make(items.into_iter().map(|s| s.0).collect()), depth)
    }
    /// Add `items` to the container on top of the stack (`add` puts them in), which then nests as deep as they do.
    fn extend_top(&mut self, items: Vec<Slot>, add: impl FnOnce(&mut V, Vec<V>) -> Step<()>) -> Step<()> {
        let depth = items.iter().map(|s| s.1 + 1).max().unwrap_or(0);
        let top = self.stack.last_mut().ok_or("stack underflow")?;
        top.1 = top.1.max(depth);
        if top.1 > MAX_DEPTH {
            return Err(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        add(&mut top.0, items.into_iter().map(|s| s.0).collect())
    }

    fn run(&mut self) -> Step<V> {
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
                b'q' | b'r' | 0x94 => {
                    let k = match op {
                        b'q' => self.uint(1)? as u32,
                        b'r' => self.uint(4)? as u32,
                        _ => self.memo.len() as u32,
                    };
                    let top = self.stack.last().ok_or("stack underflow")?;
                    // Containers are memoized only while small (sizes, strides): a reference to a large one could
                    // multiply it (the "billion laughs" of pickles).
                    let leaf_or_small = match &top.0 {
                        V::Tuple(t) | V::List(t) => t.len() <= 64 && top.1 <= 1,
                        V::Dict(d) => d.is_empty(),
                        _ => true,
                    };
                    if self.memo.len() >= MAX_VALUES {
                        return Err("too many memo entries".into());
                    }
                    let put = if leaf_or_small { top.clone() } else { (V::Other, 0) };
                    self.memo.insert(k, put);
                }
                b'h' | b'j' => {
                    let k = if op == b'h' { self.uint(1)? } else { self.uint(4)? } as u32;
                    let (v, d) = self.memo.get(&k).ok_or("a memo key that was never set")?.clone();
                    self.push_at(v, d)?
                }
                b'c' => {
                    let (module, name) = (self.line()?, self.line()?);
                    self.push(V::Global(format!("{module}.{name}")))?
                }
                0x93 => {
                    let (name, module) = (self.pop()?.0, self.pop()?.0);
                    match (module, name) {
                        (V::Str(m), V::Str(n)) => self.push(V::Global(format!("{m}.{n}")))?,
                        _ => return Err("STACK_GLOBAL of non-strings".into()),
                    }
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push_container(items, V::Tuple)?
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err("stack underflow".into());
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push_container(items, V::Tuple)?
                }
                b'Q' => {
                    let pid = self.pop()?.0;
                    self.push(storage(pid)?)?
                }
                b'R' | 0x81 => {
                    let (args, f) = (self.pop()?.0, self.pop()?.0);
                    self.push(call(f, args)?)?
                }
                b'b' => {
                    self.pop()?; // BUILD: the state (a state dict's `_metadata`) is dropped
                }
                b's' | b'u' => {
                    let items = if op == b's' {
                        let (v, k) = (self.pop()?, self.pop()?);
                        vec![k, v]
                    } else {
                        self.pop_mark()?
                    };
                    self.extend_top(items, |top, items| {
                        let V::Dict(d) = top else {
                            return Err("SETITEM without a dict".into());
                        };
                        let mut it = items.into_iter();
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            d.push((k, v));
                        }
                        Ok(())
                    })?
                }
                b'a' | b'e' => {
                    let items = if op == b'a' {
                        vec![self.pop()?]
                    } else {
                        self.pop_mark()?
                    };
                    self.extend_top(items, |top, items| match top {
                        V::List(l) => {
                            l.extend(items);
                            Ok(())
                        }
                        _ => Err("APPEND without a list".into()),
                    })?
                }
                b'.' => return Ok(self.pop()?.0),
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
            let too_big = || bad(format!("tensor {name:?}: shape {shape:?} is too large"));
            let n = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(too_big)?;
            if stride.len() != shape.len() {
                return Err(bad(format!(
                    "tensor {name:?}: {} strides for shape {shape:?}",
                    stride.len()
                )));
            }
            let mut want = 1usize;
            for (i, &d) in shape.iter().enumerate().rev() {
                if d > 1 && stride[i] != want {
                    return Err(bad(format!(
                        "tensor {name:?}: strides {stride:?} of shape {shape:?} are not contiguous"
                    )));
                }
                want = want.checked_mul(d).ok_or_else(too_big)?;
            }
            let r = zip
                .entries
                .get(&format!("{prefix}data/{key}"))
                .ok_or_else(|| bad(format!("tensor {name:?}: storage {key} missing")))?;
            let from = offset.checked_mul(dtype.size()).ok_or_else(too_big)?;
            let len = n.checked_mul(dtype.size()).ok_or_else(too_big)?;
            let bytes = map[r.clone()]
                .get(from..from.checked_add(len).ok_or_else(too_big)?)
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
