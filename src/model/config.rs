//! Llama-family hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use crate::ops::rope::RopeStyle;
use std::path::Path;

/// Architectures one Llama-family implementation serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, SmolLM, Mistral, TinyLlama.
    Llama,
    /// q/k/v biases.
    Qwen2,
    /// RMSNorm on q and k per head.
    Qwen3,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    /// Rotated dims per head (head_dim unless partial rotary).
    pub rope_dim: usize,
    /// Linear position scaling (1 / factor).
    pub rope_freq_scale: f32,
    /// Trained context length.
    pub context: usize,
    pub tie_embeddings: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::File {
        path: path.into(),
        message: message.into(),
    }
}

impl LlamaConfig {
    fn check(self, path: &Path) -> Result<Self> {
        let c = &self;
        let positive = [
            c.n_layers,
            c.hidden,
            c.ffn,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab,
            c.context,
        ];
        if positive.contains(&0) {
            return Err(bad(path, format!("a size in the model config is zero: {c:?}")));
        }
        if !c.n_heads.is_multiple_of(c.n_kv_heads) {
            return Err(bad(
                path,
                format!("{} heads do not divide into {} KV heads", c.n_heads, c.n_kv_heads),
            ));
        }
        if c.rope_dim > c.head_dim || !c.rope_dim.is_multiple_of(2) {
            return Err(bad(
                path,
                format!("rope dim {} does not fit head dim {}", c.rope_dim, c.head_dim),
            ));
        }
        if c.n_layers > 4096 || c.hidden > 1 << 17 || c.n_heads > 4096 || c.head_dim > 1024 {
            return Err(bad(path, format!("implausible model sizes: {c:?}")));
        }
        Ok(self)
    }

    /// From GGUF metadata (`general.architecture` = llama, qwen2 or qwen3).
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig> {
        let arch_name = f.architecture()?.to_string();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            other => {
                return Err(bad(
                    f.path(),
                    format!("unknown architecture {other:?}: this build runs llama, mistral, qwen2 and qwen3"),
                ))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&key(k))? as usize) };
        let n_heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        let head_dim = match f.get_opt::<u64>(&key("attention.key_length"))? {
            Some(d) => d as usize,
            None => hidden / n_heads.max(1),
        };
        let vocab = match f.tensor("token_embd.weight") {
            Some(t) => t.shape()[0],
            None => return Err(bad(f.path(), "missing tensor token_embd.weight")),
        };
        let scale = match f.get_opt::<f32>(&key("rope.scaling.factor"))? {
            Some(s) if s > 0.0 && f.get_opt::<&str>(&key("rope.scaling.type"))? == Some("linear") => 1.0 / s,
            _ => 1.0,
        };
        LlamaConfig {
            arch,
            n_layers: u("block_count")?,
            hidden,
            ffn: u("feed_forward_length")?,
            n_heads,
            n_kv_heads: f
                .get_opt::<u64>(&key("attention.head_count_kv"))?
                .map_or(n_heads, |v| v as usize),
            head_dim,
            vocab,
            rms_eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: f.get_opt::<f32>(&key("rope.freq_base"))?.unwrap_or(10000.0),
            // llama.cpp's converter permutes Llama q/k rows for ggml's interleaved rope; Qwen keeps HF's order.
            rope_style: if arch == Arch::Llama {
                RopeStyle::Interleaved
            } else {
                RopeStyle::RotateHalf
            },
            rope_dim: f
                .get_opt::<u64>(&key("rope.dimension_count"))?
                .map_or(head_dim, |v| v as usize),
            rope_freq_scale: scale,
            context: u("context_length")?,
            tie_embeddings: f.tensor("output.weight").is_none(),
            qkv_bias: f.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some(),
        }
        .check(f.path())
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf(path: &Path) -> Result<LlamaConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(path, format!("not valid JSON: {e}")))?;
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        let arch = match archs.first().copied() {
            Some("LlamaForCausalLM" | "MistralForCausalLM") => Arch::Llama,
            Some("Qwen2ForCausalLM") => Arch::Qwen2,
            Some("Qwen3ForCausalLM") => Arch::Qwen3,
            other => {
                return Err(bad(
                    path,
                    format!(
                        "unknown architecture {other:?}: this build runs LlamaForCausalLM, MistralForCausalLM, \
                         Qwen2ForCausalLM and Qwen3ForCausalLM"
                    ),
                ))
            }
        };
        let num = |k: &str| v.get(k).and_then(|x| x.as_f64());
        let need = |k: &str| {
            num(k)
                .map(|x| x as usize)
                .ok_or_else(|| bad(path, format!("missing {k}")))
        };
        let hidden = need("hidden_size")?;
        let n_heads = need("num_attention_heads")?;
        let head_dim = num("head_dim").map_or(hidden / n_heads.max(1), |x| x as usize);
        let scaling = v.get("rope_scaling").filter(|s| !s.is_null());
        let rope_freq_scale = match scaling {
            None => 1.0,
            Some(s) => match s.get("rope_type").or(s.get("type")).and_then(|t| t.as_str()) {
                Some("linear") => 1.0 / s.get("factor").and_then(|f| f.as_f64()).unwrap_or(1.0).max(1e-6) as f32,
                Some("default") | None => 1.0,
                Some(other) => return Err(bad(path, format!("rope_scaling type {other:?} is not supported yet"))),
            },
        };
        LlamaConfig {
            arch,
            n_layers: need("num_hidden_layers")?,
            hidden,
            ffn: need("intermediate_size")?,
            n_heads,
            n_kv_heads: num("num_key_value_heads").map_or(n_heads, |x| x as usize),
            head_dim,
            vocab: need("vocab_size")?,
            rms_eps: num("rms_norm_eps").unwrap_or(1e-6) as f32,
            rope_theta: num("rope_theta").unwrap_or(10000.0) as f32,
            rope_style: RopeStyle::RotateHalf,
            rope_dim: head_dim,
            rope_freq_scale,
            context: num("max_position_embeddings").map_or(4096, |x| x as usize),
            tie_embeddings: v.get("tie_word_embeddings").and_then(|t| t.as_bool()).unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || v.get("attention_bias").and_then(|b| b.as_bool()).unwrap_or(false),
            qk_norm: arch == Arch::Qwen3,
        }
        .check(path)
    }

    /// Weight bytes are not known here; this is the parameter count of the matmuls and embedding.
    pub fn n_params(&self) -> usize {
        let q = self.n_heads * self.head_dim;
        let kv = self.n_kv_heads * self.head_dim;
        let layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.ffn;
        let head = if self.tie_embeddings {
            0
        } else {
            self.vocab * self.hidden
        };
        self.n_layers * layer + self.vocab * self.hidden + head
    }
}
