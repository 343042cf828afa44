//! Model file readers: GGUF, safetensors, Hugging Face directories.

pub mod gguf;
pub mod gguf_value;
pub mod gguf_write;
pub mod quant_config;
pub mod safetensors;

use crate::error::{Error, Result};
use std::path::Path;

/// A JSON file (config.json, tokenizer_config.json, ...), with errors naming it.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::File {
        path: path.into(),
        message: format!("not valid JSON: {e}"),
    })
}
