//! A tiny MiniCPM4 checkpoint with random weights in the published Hugging Face layout: `MiniCPMForCausalLM` in
//! config.json with the muP fields (`scale_emb`, `scale_depth`, `dim_model_base`), `rope_scaling` of type longrope
//! and an optional `sparse_config`; safetensors under transformers' Llama names; tokenizer.json and a ChatML
//! tokenizer_config.json.

#![allow(dead_code)]

use super::tiny::{write_hf_chat, Tiny};
use std::path::Path;

/// Longrope's original context in the tiny config: caches longer than this use the long factors.
pub const ORIGINAL_MAX: usize = 32;

/// Writes the checkpoint into `dir`; `sparse` is the `sparse_config` object (None: dense attention only).
pub fn write_minicpm(dir: &Path, seed: u64, sparse: Option<serde_json::Value>) -> Tiny {
    let t = write_hf_chat(dir, seed, true);
    let half = t.head_dim / 2;
    let short: Vec<f64> = (0..half).map(|j| 1.0 + j as f64 * 0.05).collect();
    let long: Vec<f64> = (0..half).map(|j| 1.0 + j as f64 * 0.9).collect();
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
