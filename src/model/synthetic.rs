//! Random-weight GGUF models at the shapes of published ones, for benchmarking an adapter without downloading a
//! model (`shaderlm bench --synthetic llama-8b`). The weights are valid blocks of the chosen type but meaningless;
//! the tokenizer is a byte-level one padded to the vocabulary size. Only speed can be read from such a model.

use crate::error::{Error, Result};
use crate::loader::gguf::{Value, ValueType};
use crate::loader::gguf_write::GgufWriter;
use crate::quant::GgmlType;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::path::Path;

/// A model shape: the hyper-parameters a Llama-family GGUF needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub name: &'static str,
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// The LM head shares the embedding table.
    pub tied: bool,
}

/// The shapes `--synthetic` knows, by name.
pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "smollm2-135m",
        layers: 30,
        hidden: 576,
        ffn: 1536,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        vocab: 49152,
        tied: true,
    },
    Shape {
        name: "qwen2.5-0.5b",
        layers: 24,
        hidden: 896,
        ffn: 4864,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        vocab: 151936,
        tied: true,
    },
    Shape {
        name: "llama-1b",
        layers: 16,
        hidden: 2048,
        ffn: 8192,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        vocab: 128256,
        tied: true,
    },
    Shape {
        name: "llama-8b",
        layers: 32,
        hidden: 4096,
        ffn: 14336,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        vocab: 128256,
        tied: false,
    },
];

/// The shape called `name`, or an error listing the known ones.
pub fn shape(name: &str) -> Result<Shape> {
    SHAPES.iter().find(|s| s.name == name).copied().ok_or_else(|| {
        let known: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        Error::Invalid(format!("unknown synthetic model {name:?}; known: {}", known.join(", ")))
    })
}

/// Weights per pattern block: valid blocks of the type are made once from random values and tiled over each
/// tensor (at a different offset per tensor), so writing an 8B model takes seconds.
const PATTERN: usize = 1 << 16;

/// Writes a random-weight Llama GGUF of `shape` with matrices in `ty` (norms in F32) to `path`.
pub fn write_gguf(path: &Path, shape: &Shape, ty: GgmlType, seed: u64) -> Result<()> {
    let block = ty.block_size();
    if !shape.hidden.is_multiple_of(block) || !shape.ffn.is_multiple_of(block) {
        return Err(Error::Invalid(format!(
            "{ty} needs rows that are multiples of {block}; {} has {} and {}",
            shape.name, shape.hidden, shape.ffn
        )));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f32> = (0..PATTERN)
        .map(|_| (rng.next_u32() as f32 / u32::MAX as f32 - 0.5) * 0.04)
        .collect();
    let pattern = crate::quant::quantize(ty, &values)?;
    let block_bytes = ty.type_size();
    let blocks_in_pattern = PATTERN / block;
    let mut salt = 0usize;
    let mut matrix = |rows: usize, cols: usize| -> Vec<u8> {
        salt += 1;
        let blocks = rows * cols / block;
        let mut data = Vec::with_capacity(blocks * block_bytes);
        for b in 0..blocks {
            let at = (b + salt * 977) % blocks_in_pattern * block_bytes;
            data.extend_from_slice(&pattern[at..at + block_bytes]);
        }
        data
    };

    let mut w = GgufWriter::new();
    let k = |s: &str| format!("llama.{s}");
    let u = |v: usize| Value::U32(v as u32);
    w.add_metadata("general.architecture", Value::String("llama".into()))?;
    w.add_metadata("general.name", Value::String(format!("synthetic {}", shape.name)))?;
    w.add_metadata(k("block_count"), u(shape.layers))?;
    w.add_metadata(k("context_length"), u(131072))?;
    w.add_metadata(k("embedding_length"), u(shape.hidden))?;
    w.add_metadata(k("feed_forward_length"), u(shape.ffn))?;
    w.add_metadata(k("attention.head_count"), u(shape.heads))?;
    w.add_metadata(k("attention.head_count_kv"), u(shape.kv_heads))?;
    w.add_metadata(k("attention.key_length"), u(shape.head_dim))?;
    w.add_metadata(k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))?;
    w.add_metadata(k("rope.freq_base"), Value::F32(500000.0))?;
    w.add_metadata(k("rope.dimension_count"), u(shape.head_dim))?;
    // A byte-level vocabulary padded with plain tokens up to the embedding's rows.
    let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    tokens.extend((tokens.len()..shape.vocab - 1).map(|i| format!("tok{i}")));
    tokens.push("</s>".into());
    let mut types = vec![Value::I32(6); 256];
    types.resize(shape.vocab - 1, Value::I32(1));
    types.push(Value::I32(3));
    w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()))?;
    w.add_str_array("tokenizer.ggml.tokens", &tokens)?;
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types))?;
    let scores = (0..shape.vocab).map(|i| Value::F32(-(i as f32))).collect();
    w.add_metadata("tokenizer.ggml.scores", Value::Array(ValueType::F32, scores))?;
    w.add_metadata("tokenizer.ggml.eos_token_id", u(shape.vocab - 1))?;
    w.add_metadata("tokenizer.ggml.bos_token_id", u(shape.vocab - 1))?;

    let (h, f, q, kv) = (
        shape.hidden,
        shape.ffn,
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    let ones = |n: usize| vec![1f32; n];
    w.add_tensor_bytes("token_embd.weight", &[shape.vocab, h], ty, matrix(shape.vocab, h))?;
    for i in 0..shape.layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(n("attn_norm"), &[h], GgmlType::F32, &ones(h))?;
        w.add_tensor_bytes(n("attn_q"), &[q, h], ty, matrix(q, h))?;
        w.add_tensor_bytes(n("attn_k"), &[kv, h], ty, matrix(kv, h))?;
        w.add_tensor_bytes(n("attn_v"), &[kv, h], ty, matrix(kv, h))?;
        w.add_tensor_bytes(n("attn_output"), &[h, q], ty, matrix(h, q))?;
        w.add_tensor(n("ffn_norm"), &[h], GgmlType::F32, &ones(h))?;
        w.add_tensor_bytes(n("ffn_gate"), &[f, h], ty, matrix(f, h))?;
        w.add_tensor_bytes(n("ffn_up"), &[f, h], ty, matrix(f, h))?;
        w.add_tensor_bytes(n("ffn_down"), &[h, f], ty, matrix(h, f))?;
    }
    w.add_tensor("output_norm.weight", &[h], GgmlType::F32, &ones(h))?;
    if !shape.tied {
        w.add_tensor_bytes("output.weight", &[shape.vocab, h], ty, matrix(shape.vocab, h))?;
    }
    w.write(path)
}
