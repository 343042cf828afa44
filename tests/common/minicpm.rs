//! A tiny MiniCPM4 checkpoint with random weights in the published Hugging Face layout: `MiniCPMForCausalLM` in
//! config.json with the muP fields (`scale_emb`, `scale_depth`, `dim_model_base`), `rope_scaling` of type longrope
//! and an optional `sparse_config`; safetensors under transformers' Llama names; tokenizer.json and a ChatML
//! tokenizer_config.json.

#![allow(dead_code)]

use super::tiny::{longrope_factors, longrope_factors_f32, write_hf_chat, Tiny};
use std::path::Path;

/// Longrope's original context in the tiny config: caches longer than this use the long factors.
pub const ORIGINAL_MAX: usize = 32;

/// Writes the checkpoint into `dir`; `sparse` is the `sparse_config` object (None: dense attention only).
pub fn write_minicpm(dir: &Path, seed: u64, sparse: Option<serde_json::Value>) -> Tiny {
    let t = write_hf_chat(dir, seed, true);
    let (short, long) = longrope_factors(t.head_dim / 2);
    let mut config = serde_json::json!({
        "architectures": ["MiniCPMForCausalLM"],
        "model_type": "minicpm",
        "hidden_size": t.hidden,
        "intermediate_size": t.ffn,
        "num_hidden_layers": t.layers,
        "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads,
        "head_dim": t.head_dim,
        "vocab_size": t.vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "rope_scaling": {
            "rope_type": "longrope",
            "long_factor": long,
            "short_factor": short,
            "original_max_position_embeddings": ORIGINAL_MAX,
        },
        "scale_emb": 12,
        "scale_depth": 0.35,
        "dim_model_base": 16,
        "tie_word_embeddings": t.tied,
        "torch_dtype": "float32",
        "bos_token_id": t.vocab - 2,
        "eos_token_id": t.vocab - 1,
    });
    if let Some(s) = sparse {
        config["sparse_config"] = s;
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    t
}

/// The checkpoint [`write_minicpm`] writes for `seed` (dense), as llama.cpp's converter writes it to GGUF
/// (`minicpm`): q/k rows permuted within each head for ggml's interleaved rope, the muP factors as
/// `embedding_scale`, `residual_scale` and `logit_scale` (= hidden / dim_model_base), the longrope factor lists as
/// `rope_factors_long` / `rope_factors_short` tensors.
pub fn write_minicpm_gguf(path: &Path, t: &Tiny, seed: u64) {
    use shaderlm::loader::gguf::Value;
    use shaderlm::quant::GgmlType;
    let mut w = shaderlm::loader::gguf_write::GgufWriter::new();
    let k = |s: &str| format!("minicpm.{s}");
    let u = |x: usize| Value::U32(x as u32);
    let meta = [
        ("general.architecture".to_string(), Value::String("minicpm".into())),
        (k("block_count"), u(t.layers)),
        (k("context_length"), u(256)),
        (k("embedding_length"), u(t.hidden)),
        (k("feed_forward_length"), u(t.ffn)),
        (k("attention.head_count"), u(t.heads)),
        (k("attention.head_count_kv"), u(t.kv_heads)),
        (k("attention.key_length"), u(t.head_dim)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (k("rope.freq_base"), Value::F32(10000.0)),
        (k("rope.dimension_count"), u(t.head_dim)),
        (k("rope.scaling.original_context_length"), u(ORIGINAL_MAX)),
        (k("embedding_scale"), Value::F32(12.0)),
        (k("residual_scale"), Value::F32(0.35 / (t.layers as f32).sqrt())),
        (k("logit_scale"), Value::F32(t.hidden as f32 / 16.0)),
    ];
    for (key, v) in meta {
        w.add_metadata(key, v).unwrap();
    }
    let (short, long) = longrope_factors_f32(t.head_dim / 2);
    w.add_tensor("rope_factors_short.weight", &[short.len()], GgmlType::F32, &short)
        .unwrap();
    w.add_tensor("rope_factors_long.weight", &[long.len()], GgmlType::F32, &long)
        .unwrap();
    let permute = |v: &[f32], heads: usize| super::tiny::to_interleaved(v, heads, t.hidden);
    for (_, gg, shape, v) in super::tiny::weights(t, seed) {
        let v = if gg.ends_with("attn_q.weight") {
            permute(&v, t.heads)
        } else if gg.ends_with("attn_k.weight") {
            permute(&v, t.kv_heads)
        } else {
            v
        };
        w.add_tensor(gg, &shape, GgmlType::F32, &v).unwrap();
    }
    w.write(path).unwrap();
}
