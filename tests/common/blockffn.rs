//! A tiny BlockFFN checkpoint with random weights in the Hugging Face layout of thunlp/BlockFFN's modeling code:
//! a MiniCPM config.json with `ffn_type`, `num_experts`, `expert_size`, `norm_after_router`, `norm_scale`; each
//! layer's `mlp.router_proj.weight`, `mlp.router_norm.weight` and the bare expert parameters `mlp.up_proj` and
//! `mlp.down_proj` (`[E, de, hidden]` / `[E, hidden, de]` for `block`, `[E*de, hidden]` / `[hidden, E*de]` for
//! `block_linear`); attention and norms under transformers' Llama names; tokenizer.json and a ChatML template.

#![allow(dead_code)]

use super::tiny::{random, weights, write_hf_chat, Tiny};
use std::path::Path;

pub const EXPERTS: usize = 12;
pub const EXPERT_SIZE: usize = 32;

/// Writes the checkpoint into `dir` with `ffn_type` ("block" or "block_linear") and `norm` ("rms", "sum", "none").
pub fn write_blockffn(dir: &Path, seed: u64, ffn_type: &str, norm: &str) -> Tiny {
    let mut t = write_hf_chat(dir, seed, true);
    t.tied = false;
    let config = serde_json::json!({
        "architectures": ["MiniCPMForCausalLM"],
        "model_type": "minicpm",
        "hidden_size": t.hidden,
        "num_hidden_layers": t.layers,
        "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads,
        "head_dim": t.head_dim,
        "vocab_size": t.vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "scale_emb": 4,
        "scale_depth": 0.7,
        "dim_model_base": 32,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "ffn_type": ffn_type,
        "num_experts": EXPERTS,
        "expert_size": EXPERT_SIZE,
        "num_shared_experts": 0,
        "router_act": "relu",
        "norm_after_router": norm,
        "norm_scale": 1.5,
        "bos_token_id": t.vocab - 2,
        "eos_token_id": t.vocab - 1,
    });
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let (e, de, h) = (EXPERTS, EXPERT_SIZE, t.hidden);
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = weights(&t, seed)
        .into_iter()
        .filter(|(hf, ..)| !hf.contains(".mlp."))
        .map(|(hf, _, shape, v)| (hf, shape, v))
        .collect();
    let block = ffn_type == "block";
    for i in 0..t.layers {
        let s = seed * 1000 + 500 + 10 * i as u64;
        let name = |n: &str| format!("model.layers.{i}.mlp.{n}");
        tensors.push((name("router_proj.weight"), vec![e, h], random(s, e * h, 0.3)));
        let norm_w = random(s + 1, e, 0.5).into_iter().map(|x| x + 1.0).collect();
        tensors.push((name("router_norm.weight"), vec![e], norm_w));
        let up_shape = if block { vec![e, de, h] } else { vec![e * de, h] };
        let down_shape = if block { vec![e, h, de] } else { vec![h, e * de] };
        tensors.push((name("up_proj"), up_shape, random(s + 2, e * de * h, 0.3)));
        tensors.push((name("down_proj"), down_shape, random(s + 3, e * de * h, 0.3)));
    }
    super::tiny::write_safetensors(&dir.join("model.safetensors"), &tensors, false);
    t
}
