//! Model file readers: GGUF, safetensors, Hugging Face directories.

pub mod gguf;
