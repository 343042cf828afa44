//! shaderlm: a portable LLM inference engine whose hot paths are WGSL compute shaders run through wgpu.

pub mod error;
pub mod generate;
pub mod gpu;
pub mod graph;
pub mod loader;
pub mod model;
pub mod ops;
pub mod quant;
pub mod quantize;
pub mod sampling;
pub mod server;
pub mod tokenizer;

pub use error::{Error, Result};
