//! Model file readers: GGUF, safetensors, Hugging Face directories.

pub mod gguf;
pub mod gguf_write;
pub mod quant_config;
pub mod safetensors;
