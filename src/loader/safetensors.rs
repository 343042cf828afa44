//! Hugging Face safetensors weights: one `model.safetensors` or shards listed in `model.safetensors.index.json`,
//! memory-mapped; tensors come back as raw little-endian bytes with their dtype and row-major shape. A GPTQ / AWQ
//! checkpoint's quantization config is read at open (the layers themselves are repacked in `model::weights`).

use super::quant_config::QuantConfig;
use crate::error::{Error, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Element types the engine reads from safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F32,
    F16,
    BF16,
    I32,
    /// Index tensors (an EAGLE-3 head's `d2t`).
    I64,
    /// Masks (an EAGLE-3 head's `t2d`).
    Bool,
}

struct Shard {
    path: PathBuf,
    map: Mmap,
    /// name -> (dtype, shape, byte range in the file)
    tensors: HashMap<String, (StDtype, Vec<usize>, std::ops::Range<usize>)>,
}

/// All safetensors files of a model directory.
pub struct SafetensorsModel {
    shards: Vec<Shard>,
    index: HashMap<String, usize>,
    /// GPTQ / AWQ: how the `.qweight` layers are stored.
    quant: Option<QuantConfig>,
}

fn file_err(path: &Path, message: impl Into<String>) -> Error {
    Error::File {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn open_shard(path: &Path) -> Result<Shard> {
    let file = super::open_regular(path)?;
    // SAFETY: the file is opened read-only; like every mmap reader we assume nobody truncates it meanwhile.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    let st = safetensors::SafeTensors::deserialize(&map)
        .map_err(|e| file_err(path, format!("not a valid safetensors file: {e}")))?;
    let base = map.as_ptr() as usize;
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => StDtype::F32,
            safetensors::Dtype::F16 => StDtype::F16,
            safetensors::Dtype::BF16 => StDtype::BF16,
            safetensors::Dtype::I32 => StDtype::I32,
            safetensors::Dtype::I64 => StDtype::I64,
            safetensors::Dtype::BOOL => StDtype::Bool,
            other => {
                return Err(file_err(
                    path,
                    format!("tensor {name} has dtype {other:?}, not supported"),
                ))
            }
        };
        let start = view.data().as_ptr() as usize - base;
        tensors.insert(name, (dtype, view.shape().to_vec(), start..start + view.data().len()));
    }
    Ok(Shard {
        path: path.into(),
        map,
        tensors,
    })
}

impl SafetensorsModel {
    /// Open `dir/model.safetensors`, or the shards named by `dir/model.safetensors.index.json`, with the
    /// quantization config of the directory (config.json's `quantization_config`, or `quantize_config.json`).
    pub fn open(dir: &Path) -> Result<SafetensorsModel> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text = super::read_text(&index_path)?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| file_err(&index_path, format!("not valid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| file_err(&index_path, "no weight_map object"))?;
            let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_string)).collect();
            files.sort();
            files.dedup();
            if files
                .iter()
                .any(|f| f.contains('/') || f.contains('\\') || f.contains(".."))
            {
                return Err(file_err(&index_path, "shard names must be plain file names"));
            }
            files.into_iter().map(|f| dir.join(f)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(file_err(dir, "no model.safetensors or model.safetensors.index.json"));
        };
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for f in files {
            let shard = open_shard(&f)?;
            for name in shard.tensors.keys() {
                if index.insert(name.clone(), shards.len()).is_some() {
                    return Err(file_err(&f, format!("tensor {name} appears in two shards")));
                }
            }
            shards.push(shard);
        }
        let quant = QuantConfig::from_dir(dir)?;
        if let Some(q) = &quant {
            if !index.keys().any(|n| n.ends_with(".qweight")) {
                return Err(file_err(
                    &q.path,
                    format!(
                        "the quantization config says {}, but the safetensors files in {} hold no .qweight tensor",
                        q.describe(),
                        dir.display()
                    ),
                ));
            }
        }
        Ok(SafetensorsModel { shards, index, quant })
    }

    /// The checkpoint's GPTQ / AWQ quantization, if any.
    pub fn quant(&self) -> Option<&QuantConfig> {
        self.quant.as_ref()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// (dtype, row-major shape, bytes, file) of a tensor, or None.
    pub fn get(&self, name: &str) -> Option<(StDtype, &[usize], &[u8], &Path)> {
        let shard = &self.shards[*self.index.get(name)?];
        let (dtype, shape, range) = shard.tensors.get(name)?;
        Some((*dtype, shape, &shard.map[range.clone()], &shard.path))
    }

    /// An integer tensor (I64 or I32) as i64 values, or None when absent; an error for another dtype.
    pub fn i64s(&self, name: &str) -> Result<Option<(Vec<usize>, Vec<i64>)>> {
        let Some((dtype, shape, bytes, path)) = self.get(name) else {
            return Ok(None);
        };
        let values = match dtype {
            StDtype::I64 => bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            StDtype::I32 => bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                .collect(),
            other => return Err(file_err(path, format!("{name}: {other:?}, expected an integer tensor"))),
        };
        Ok(Some((shape.to_vec(), values)))
    }

    /// The tensor as f32 values (converting f16/bf16), for norms, biases and CPU references.
    pub fn f32(&self, name: &str) -> Result<Option<(Vec<usize>, Vec<f32>)>> {
        let Some((dtype, shape, bytes, path)) = self.get(name) else {
            return Ok(None);
        };
        Ok(Some((
            shape.to_vec(),
            to_f32(dtype, bytes).ok_or_else(|| file_err(path, format!("{name}: not a float tensor")))?,
        )))
    }
}

/// Little-endian float bytes to f32 values.
pub fn to_f32(dtype: StDtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        StDtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        StDtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        StDtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        StDtype::I32 | StDtype::I64 | StDtype::Bool => return None,
    })
}
