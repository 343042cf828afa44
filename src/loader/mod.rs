//! Model file readers: GGUF, safetensors, Hugging Face directories.

pub mod gguf;
pub mod gguf_value;
pub mod gguf_write;
pub mod quant_config;
pub mod safetensors;
pub mod torch_pickle;
pub mod zip;

use crate::error::{Error, Result};
use std::path::Path;

/// Largest text file read whole (tokenizer.json of a 256k vocabulary is about 20 MiB).
pub const MAX_TEXT_BYTES: u64 = 512 << 20;

/// Opens `path` for reading only if it is a regular file (after links): a FIFO, socket or device would block or
/// never end, so it is an error naming the path, decided before anything is opened.
pub fn open_regular(path: &Path) -> Result<std::fs::File> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    if !meta.is_file() {
        return Err(Error::File {
            path: path.into(),
            message: "not a regular file".into(),
        });
    }
    std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })
}

/// A regular text file of at most [`MAX_TEXT_BYTES`], read whole, with errors naming it.
pub fn read_text(path: &Path) -> Result<String> {
    use std::io::Read;
    let file = open_regular(path)?;
    let mut text = String::new();
    let io = |source| Error::Io {
        path: path.into(),
        source,
    };
    let n = file.take(MAX_TEXT_BYTES + 1).read_to_string(&mut text).map_err(io)?;
    if n as u64 > MAX_TEXT_BYTES {
        return Err(Error::File {
            path: path.into(),
            message: format!("larger than {MAX_TEXT_BYTES} bytes, too large for a text file the loader reads"),
        });
    }
    Ok(text)
}

/// A JSON file (config.json, tokenizer_config.json, ...), with errors naming it.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| Error::File {
        path: path.into(),
        message: format!("not valid JSON: {e}"),
    })
}
