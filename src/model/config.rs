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
    /// MiniCPM / MiniCPM4: muP scalings ([`Mup`]), longrope, InfLLM-v2 sparse attention ([`SparseConfig`]).
    MiniCpm,
}

/// MiniCPM's muP scalings: `h0 = embed * emb`, each residual branch times `residual`, logits from the final norm
/// times `logit`. All 1 for other architectures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mup {
    /// `scale_emb`.
    pub emb: f32,
    /// `scale_depth / sqrt(num_hidden_layers)`.
    pub residual: f32,
    /// `dim_model_base / hidden_size` (the HF code divides by `hidden_size / dim_model_base`).
    pub logit: f32,
}

impl Default for Mup {
    fn default() -> Self {
        Mup {
            emb: 1.0,
            residual: 1.0,
            logit: 1.0,
        }
    }
}

/// `rope_scaling` of type `longrope` (MiniCPM4, Phi-3): per-frequency divisors for short and long contexts, and
/// the attention factor that multiplies cos and sin.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// `[rope_dim / 2]` divisors used while the context fits `original_max`.
    pub short: Vec<f32>,
    /// `[rope_dim / 2]` divisors used for contexts past it.
    pub long: Vec<f32>,
    pub original_max: usize,
    /// `sqrt(1 + ln(s) / ln(original_max))`, `s = max_position_embeddings / original_max` (1 when s <= 1), unless
    /// the config gives `attention_factor`.
    pub attn_factor: f32,
}

impl LongRope {
    /// The divisors for a KV cache of `max_ctx` positions. The choice is made once per session from its context
    /// size (as llama.cpp does), not per step as the HF code does from the running sequence length: keys already
    /// in the cache keep the rotation they were written with.
    pub fn factors(&self, max_ctx: usize) -> &[f32] {
        if max_ctx > self.original_max {
            &self.long
        } else {
            &self.short
        }
    }
}

/// BlockFFN's mixture of experts (thunlp/BlockFFN, `BlockMLP`) in place of the SwiGLU FFN: a ReLU router with a
/// norm picks, per token, the experts whose (ungated) SiLU FFNs are summed, each weighted by its router value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// `num_experts`.
    pub experts: usize,
    /// `expert_size`: rows of each expert's up projection.
    pub expert_size: usize,
    /// `ffn_type` `block` (`up_proj [E, de, hidden]`, `down_proj [E, hidden, de]`) rather than `block_linear`
    /// (`up_proj [E*de, hidden]`, `down_proj [hidden, E*de]`).
    pub per_expert_tensors: bool,
    pub norm: RouterNormKind,
}

/// `norm_after_router`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterNormKind {
    None,
    /// `r / (sum(r) * norm_scale + eps)`.
    Sum {
        scale: f32,
    },
    /// RMSNorm with `router_norm.weight` and the model's `rms_norm_eps`.
    Rms,
}

/// InfLLM-v2 trainable sparse attention (`sparse_config` in a MiniCPM4 config.json), also applied training-free to
/// other models by `--sparse-attention`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseConfig {
    /// Compressed-key window (32) and stride (16).
    pub kernel_size: usize,
    pub kernel_stride: usize,
    /// Tokens per selectable KV block (64).
    pub block_size: usize,
    /// Leading blocks always selected (1).
    pub init_blocks: usize,
    /// Recent tokens always attended (2048): window / block_size local blocks.
    pub window_size: usize,
    /// Blocks chosen by score (64).
    pub topk: usize,
    /// KV lengths below this use dense attention (8192).
    pub dense_len: usize,
}

impl SparseConfig {
    /// MiniCPM4's published values.
    pub const MINICPM4: SparseConfig = SparseConfig {
        kernel_size: 32,
        kernel_stride: 16,
        block_size: 64,
        init_blocks: 1,
        window_size: 2048,
        topk: 64,
        dense_len: 8192,
    };

    fn check(self, path: &Path) -> Result<Self> {
        let s = &self;
        let ok = s.kernel_size > 0
            && s.kernel_stride > 0
            && s.kernel_size.is_multiple_of(s.kernel_stride)
            && s.block_size > 0
            && s.block_size.is_multiple_of(s.kernel_stride)
            && s.window_size.is_multiple_of(s.block_size)
            && s.topk > 0
            && s.block_size <= 1 << 16
            && s.topk + s.init_blocks + s.window_size / s.block_size <= 1 << 16;
        if ok {
            Ok(self)
        } else {
            Err(bad(
                path,
                format!("sparse attention settings do not fit together: {s:?}"),
            ))
        }
    }
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
    pub mup: Mup,
    pub longrope: Option<LongRope>,
    /// Sparse attention (InfLLM-v2): from the model's config, or asked for on the command line.
    pub sparse: Option<SparseConfig>,
    /// BlockFFN experts instead of the SwiGLU FFN (`ffn` is then unused).
    pub moe: Option<MoeConfig>,
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
            mup: Mup::default(),
            longrope: None,
            sparse: None,
            moe: None,
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
            Some("MiniCPMForCausalLM") => Arch::MiniCpm,
            other => {
                return Err(bad(
                    path,
                    format!(
                        "unknown architecture {other:?}: this build runs LlamaForCausalLM, MistralForCausalLM, \
                         Qwen2ForCausalLM, Qwen3ForCausalLM and MiniCPMForCausalLM"
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
        let context = num("max_position_embeddings").map_or(4096, |x| x as usize);
        let scaling = v.get("rope_scaling").filter(|s| !s.is_null());
        let mut longrope = None;
        let rope_freq_scale = match scaling {
            None => 1.0,
            Some(s) => match s.get("rope_type").or(s.get("type")).and_then(|t| t.as_str()) {
                Some("linear") => 1.0 / s.get("factor").and_then(|f| f.as_f64()).unwrap_or(1.0).max(1e-6) as f32,
                Some("longrope") => {
                    longrope = Some(long_rope(path, s, head_dim, context)?);
                    1.0
                }
                Some("default") | None => 1.0,
                Some(other) => return Err(bad(path, format!("rope_scaling type {other:?} is not supported yet"))),
            },
        };
        let n_layers = need("num_hidden_layers")?;
        let mup = if arch == Arch::MiniCpm {
            let dim_base = num("dim_model_base").unwrap_or(hidden as f64);
            Mup {
                emb: num("scale_emb").unwrap_or(1.0) as f32,
                residual: (num("scale_depth").unwrap_or(1.0) / (n_layers as f64).sqrt()) as f32,
                logit: (dim_base / hidden as f64) as f32,
            }
        } else {
            Mup::default()
        };
        let moe = match v.get("ffn_type").and_then(|t| t.as_str()) {
            Some("block" | "block_linear") if arch == Arch::MiniCpm => Some(moe_config(path, &v)?),
            None | Some("dense" | "mlp") => None,
            Some(other) => return Err(bad(path, format!("ffn_type {other:?} is not supported"))),
        };
        let sparse = match v.get("sparse_config").filter(|s| !s.is_null()) {
            Some(s) if arch == Arch::MiniCpm => Some(sparse_config(path, s)?),
            _ => None,
        };
        LlamaConfig {
            arch,
            n_layers,
            hidden,
            ffn: if moe.is_some() {
                num("intermediate_size").map_or(1, |x| x as usize)
            } else {
                need("intermediate_size")?
            },
            n_heads,
            n_kv_heads: num("num_key_value_heads").map_or(n_heads, |x| x as usize),
            head_dim,
            vocab: need("vocab_size")?,
            rms_eps: num("rms_norm_eps").unwrap_or(1e-6) as f32,
            rope_theta: num("rope_theta").unwrap_or(10000.0) as f32,
            rope_style: RopeStyle::RotateHalf,
            rope_dim: head_dim,
            rope_freq_scale,
            context,
            tie_embeddings: v.get("tie_word_embeddings").and_then(|t| t.as_bool()).unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || v.get("attention_bias").and_then(|b| b.as_bool()).unwrap_or(false),
            qk_norm: arch == Arch::Qwen3,
            mup,
            longrope,
            sparse,
            moe,
        }
        .check(path)
    }

    /// Sets sparse attention (InfLLM-v2) for models that were not trained with it.
    pub fn with_sparse(mut self, sparse: SparseConfig) -> Result<Self> {
        self.sparse = Some(sparse.check(Path::new("--sparse-attention"))?);
        Ok(self)
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

/// `rope_scaling: {"rope_type": "longrope", "long_factor": [..], "short_factor": [..],
/// "original_max_position_embeddings": N}` (the original max may also sit at the top level of config.json).
fn long_rope(path: &Path, s: &serde_json::Value, head_dim: usize, context: usize) -> Result<LongRope> {
    let factors = |key: &str| -> Result<Vec<f32>> {
        let v: Vec<f32> = s
            .get(key)
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_f64()).map(|x| x as f32).collect())
            .unwrap_or_default();
        if v.len() != head_dim / 2 || v.iter().any(|f| !f.is_finite() || *f <= 0.0) {
            return Err(bad(
                path,
                format!("rope_scaling.{key}: want {} positive numbers", head_dim / 2),
            ));
        }
        Ok(v)
    };
    let original_max =
        s.get("original_max_position_embeddings")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| bad(path, "longrope needs rope_scaling.original_max_position_embeddings"))? as usize;
    if original_max < 2 {
        return Err(bad(
            path,
            "rope_scaling.original_max_position_embeddings must be at least 2",
        ));
    }
    let scale = context as f64 / original_max as f64;
    let attn_factor = match s.get("attention_factor").and_then(|x| x.as_f64()) {
        Some(f) => f,
        None if scale <= 1.0 => 1.0,
        None => (1.0 + scale.ln() / (original_max as f64).ln()).sqrt(),
    };
    Ok(LongRope {
        short: factors("short_factor")?,
        long: factors("long_factor")?,
        original_max,
        attn_factor: attn_factor as f32,
    })
}

/// `sparse_config` of a MiniCPM4 config.json; missing fields take MiniCPM4's published values.
fn sparse_config(path: &Path, s: &serde_json::Value) -> Result<SparseConfig> {
    let d = SparseConfig::MINICPM4;
    let get = |k: &str, default: usize| s.get(k).and_then(|x| x.as_u64()).map_or(default, |x| x as usize);
    if s.get("use_nope").and_then(|x| x.as_bool()) == Some(true) {
        return Err(bad(path, "sparse_config.use_nope = true is not supported"));
    }
    SparseConfig {
        kernel_size: get("kernel_size", d.kernel_size),
        kernel_stride: get("kernel_stride", d.kernel_stride),
        block_size: get("block_size", d.block_size),
        init_blocks: get("init_blocks", d.init_blocks),
        window_size: get("window_size", d.window_size),
        topk: get("topk", d.topk),
        dense_len: get("dense_len", d.dense_len),
    }
    .check(path)
}

/// BlockFFN's fields of config.json (`ffn_type` block / block_linear). The `BlockMLP` class defaults
/// (`norm_after_router` "sum", `norm_scale` 1) apply where the file says nothing.
fn moe_config(path: &Path, v: &serde_json::Value) -> Result<MoeConfig> {
    let num = |k: &str| v.get(k).and_then(|x| x.as_u64()).map(|x| x as usize);
    let text = |k: &str| v.get(k).and_then(|x| x.as_str());
    let (Some(experts), Some(expert_size)) = (num("num_experts"), num("expert_size")) else {
        return Err(bad(path, "a BlockFFN config needs num_experts and expert_size"));
    };
    if experts == 0 || experts > crate::ops::moe_common::MAX_EXPERTS || expert_size == 0 {
        return Err(bad(
            path,
            format!("{experts} experts of size {expert_size}: unsupported"),
        ));
    }
    if !expert_size.is_multiple_of(crate::ops::moe_common::DE_ALIGN) {
        return Err(bad(path, format!("expert_size {expert_size} is not a multiple of 32")));
    }
    if num("num_shared_experts").unwrap_or(0) > 0 {
        return Err(bad(path, "BlockFFN shared experts are not supported"));
    }
    if let Some(act) = text("router_act").filter(|a| *a != "relu") {
        return Err(bad(path, format!("router_act {act:?} is not supported (relu only)")));
    }
    if let Some(act) = text("hidden_act").filter(|a| *a != "silu") {
        return Err(bad(
            path,
            format!("hidden_act {act:?} is not supported for experts (silu only)"),
        ));
    }
    let norm = match text("norm_after_router").unwrap_or("sum") {
        "none" => RouterNormKind::None,
        "sum" => RouterNormKind::Sum {
            scale: v.get("norm_scale").and_then(|x| x.as_f64()).unwrap_or(1.0) as f32,
        },
        "rms" => RouterNormKind::Rms,
        other => return Err(bad(path, format!("norm_after_router {other:?} is not supported"))),
    };
    Ok(MoeConfig {
        experts,
        expert_size,
        per_expert_tensors: text("ffn_type") == Some("block"),
        norm,
    })
}
