//! Llama-family hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use crate::ops::rope::RopeStyle;
pub use crate::ops::silu_mul::Glu;
use std::path::Path;

pub use super::rope_scaling::{LongRope, RopeScaling};

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
    /// Gemma 3 (text): sliding-window and global layers, q/k norms, GeGLU, the embedding scaled by sqrt(hidden),
    /// norms after attention and FFN as well as before.
    Gemma3,
    /// Phi-3 / Phi-4-mini: Llama with q|k|v and gate|up fused in the files (see `model::fused`), longrope,
    /// partial rotary (Phi-4-mini), a sliding window on every layer where the config sets one.
    Phi3,
}

impl Arch {
    /// The architectures a GGUF `general.architecture` names.
    const GGUF: [(&'static str, Arch); 7] = [
        ("llama", Arch::Llama),
        ("minicpm", Arch::MiniCpm),
        ("mistral", Arch::Llama),
        ("qwen2", Arch::Qwen2),
        ("qwen3", Arch::Qwen3),
        ("gemma3", Arch::Gemma3),
        ("phi3", Arch::Phi3),
    ];
    /// Hugging Face `architectures[0]` and `model_type` names.
    const HF: [(&'static str, &'static str, Arch); 7] = [
        ("LlamaForCausalLM", "llama", Arch::Llama),
        ("MistralForCausalLM", "mistral", Arch::Llama),
        ("Qwen2ForCausalLM", "qwen2", Arch::Qwen2),
        ("Qwen3ForCausalLM", "qwen3", Arch::Qwen3),
        ("MiniCPMForCausalLM", "minicpm", Arch::MiniCpm),
        ("Gemma3ForCausalLM", "gemma3_text", Arch::Gemma3),
        ("Phi3ForCausalLM", "phi3", Arch::Phi3),
    ];
}

/// Sliding-window attention: layers marked local attend to the last `window` keys (a query at position p sees
/// keys p - window + 1 ..= p, as transformers' `sliding_window` mask and llama.cpp's standard SWA), with their own
/// rope base and scaling (Gemma 3: base 10000, no scaling); the other layers attend to everything.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// `[n_layers]`: true for a sliding-window layer.
    pub local: Vec<bool>,
    pub local_theta: f32,
    pub local_scaling: RopeScaling,
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
    /// Frequency scaling of the (global) layers.
    pub rope_scaling: RopeScaling,
    /// Trained context length.
    pub context: usize,
    pub tie_embeddings: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub mup: Mup,
    /// Query scale before softmax: 1/sqrt(head_dim), or Gemma's `query_pre_attn_scalar^-0.5`.
    pub attn_scale: f32,
    /// The FFN's gate activation: `down(act(gate x) * up x)` (SwiGLU, or Gemma's GeGLU).
    pub ffn_act: Glu,
    /// RMSNorms on the attention and FFN outputs before the residual adds (Gemma 3).
    pub post_norms: bool,
    pub sliding: Option<SlidingWindow>,
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
        if let Some(s) = &c.sliding {
            if s.local.len() != c.n_layers || s.window == 0 || !(s.local_theta.is_finite() && s.local_theta > 1.0) {
                return Err(bad(
                    path,
                    format!("sliding-window settings do not fit the model: {s:?}"),
                ));
            }
        }
        if !(c.attn_scale.is_finite() && c.attn_scale > 0.0) {
            return Err(bad(path, format!("attention scale {} is not positive", c.attn_scale)));
        }
        Ok(self)
    }

    /// From GGUF metadata (`general.architecture` = llama, mistral, qwen2, qwen3 or gemma3).
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig> {
        let arch_name = f.architecture()?.to_string();
        let Some(arch) = Arch::GGUF.iter().find(|a| a.0 == arch_name).map(|a| a.1) else {
            let known: Vec<&str> = Arch::GGUF.iter().map(|a| a.0).collect();
            return Err(bad(
                f.path(),
                format!(
                    "unknown architecture {arch_name:?} (general.architecture): this build runs {}",
                    known.join(", ")
                ),
            ));
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&key(k))? as usize) };
        let n_heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        let n_layers = u("block_count")?;
        let head_dim = match f.get_opt::<u64>(&key("attention.key_length"))? {
            Some(d) => d as usize,
            None => hidden / n_heads.max(1),
        };
        let vocab = match f.tensor("token_embd.weight") {
            Some(t) if t.shape().len() == 2 => t.shape()[0],
            Some(t) => return Err(bad(f.path(), format!("token_embd.weight has shape {:?}", t.shape()))),
            None => return Err(bad(f.path(), "missing tensor token_embd.weight")),
        };
        let rope_dim = f
            .get_opt::<u64>(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        let context = u("context_length")?;
        let mut rope_scaling = gguf_rope_scaling(f, &arch_name, rope_dim)?;
        if let (Arch::MiniCpm, RopeScaling::LongRope(l)) = (arch, &mut rope_scaling) {
            // As from config.json: MiniCPM's own longrope table is built for the trained context.
            l.fixed_ctx = Some(context);
        }
        let gemma = arch == Arch::Gemma3;
        // A window of 0 is none (llama.cpp's converter writes 0 for Phi-3 models without one).
        let window = f.get_opt::<u64>(&key("attention.sliding_window"))?.filter(|&w| w > 0);
        let sliding = match window {
            // llama.cpp's gemma3: every 6th layer global, local layers at base 10000 without scaling.
            Some(w) if gemma => Some(SlidingWindow {
                window: w as usize,
                local: (0..n_layers).map(|i| (i + 1) % 6 != 0).collect(),
                local_theta: 10000.0,
                local_scaling: RopeScaling::None,
            }),
            // Phi-3: every layer, with the model's own rope.
            Some(w) if arch == Arch::Phi3 => Some(SlidingWindow {
                window: w as usize,
                local: vec![true; n_layers],
                local_theta: f.get_opt::<f32>(&key("rope.freq_base"))?.unwrap_or(10000.0),
                local_scaling: rope_scaling.clone(),
            }),
            Some(_) => {
                return Err(bad(
                    f.path(),
                    format!("{} is not supported for {arch_name}", key("attention.sliding_window")),
                ))
            }
            None => None,
        };
        if gemma && sliding.is_none() {
            return Err(bad(f.path(), format!("missing {}", key("attention.sliding_window"))));
        }
        LlamaConfig {
            arch,
            n_layers,
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
            // llama.cpp's converter permutes Llama (and MiniCPM) q/k rows for ggml's interleaved rope; Qwen, Gemma
            // and Phi-3 keep HF's order.
            rope_style: if matches!(arch, Arch::Llama | Arch::MiniCpm) {
                RopeStyle::Interleaved
            } else {
                RopeStyle::RotateHalf
            },
            rope_dim,
            rope_scaling,
            context,
            tie_embeddings: f.tensor("output.weight").is_none(),
            qkv_bias: f.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some(),
            mup: gguf_mup(f, &arch_name, arch, hidden)?,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            ffn_act: if gemma { Glu::GeluTanh } else { Glu::Silu },
            post_norms: gemma,
            sliding,
            sparse: None,
            moe: None,
        }
        .check(f.path())
    }

    /// From a Hugging Face `config.json`, as transformers 4.x and 5.x write it.
    pub fn from_hf(path: &Path) -> Result<LlamaConfig> {
        let v = crate::loader::read_json(path)?;
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        let model_type = v.get("model_type").and_then(|t| t.as_str());
        let found = match archs.first() {
            Some(a) => Arch::HF.iter().find(|e| e.0 == *a),
            None => Arch::HF.iter().find(|e| Some(e.1) == model_type),
        };
        let Some(&(_, _, arch)) = found else {
            let known: Vec<&str> = Arch::HF.iter().map(|e| e.0).collect();
            let named = archs
                .first()
                .map_or(format!("model_type {model_type:?}"), |a| format!("{a:?}"));
            return Err(bad(
                path,
                format!("unknown architecture {named}: this build runs {}", known.join(", ")),
            ));
        };
        let num = |k: &str| v.get(k).and_then(|x| x.as_f64());
        let need = |k: &str| {
            num(k)
                .map(|x| x as usize)
                .ok_or_else(|| bad(path, format!("missing {k}")))
        };
        let set = |k: &str| v.get(k).is_some_and(|x| !x.is_null());
        let gemma = arch == Arch::Gemma3;
        for k in ["attn_logit_softcapping", "final_logit_softcapping"] {
            if set(k) {
                return Err(bad(path, format!("{k} is not supported")));
            }
        }
        if v.get("mlp_bias").and_then(|b| b.as_bool()) == Some(true) {
            return Err(bad(path, "mlp_bias = true is not supported"));
        }
        let act = v
            .get("hidden_activation")
            .filter(|a| !a.is_null())
            .or(v.get("hidden_act"))
            .and_then(|a| a.as_str());
        let ffn_act = match act {
            None if gemma => Glu::GeluTanh,
            None | Some("silu" | "swish") => Glu::Silu,
            Some("gelu_pytorch_tanh" | "gelu_tanh") => Glu::GeluTanh,
            Some(other) => {
                return Err(bad(
                    path,
                    format!("hidden_act {other:?} is not supported (silu, gelu_pytorch_tanh)"),
                ))
            }
        };
        let hidden = need("hidden_size")?;
        let n_heads = need("num_attention_heads")?;
        let head_dim = num("head_dim").map_or(hidden / n_heads.max(1), |x| x as usize);
        let rope_dim = match num("partial_rotary_factor") {
            Some(f) if f > 0.0 && f <= 1.0 => ((head_dim as f64 * f) as usize) & !1,
            Some(f) => return Err(bad(path, format!("partial_rotary_factor {f} is not in (0, 1]"))),
            None => head_dim,
        };
        let context = num("max_position_embeddings").map_or(4096, |x| x as usize);
        let n_layers = need("num_hidden_layers")?;
        let mut rope = HfRope::read(path, &v, rope_dim, context)?;
        if let (Arch::MiniCpm, RopeScaling::LongRope(l)) = (arch, &mut rope.scaling) {
            l.fixed_ctx = Some(context);
        }
        let sliding = hf_sliding(path, &v, arch, n_layers, &rope)?;
        let mup = if arch == Arch::MiniCpm {
            let dim_base = num("dim_model_base").unwrap_or(hidden as f64);
            Mup {
                emb: num("scale_emb").unwrap_or(1.0) as f32,
                residual: (num("scale_depth").unwrap_or(1.0) / (n_layers as f64).sqrt()) as f32,
                logit: (dim_base / hidden as f64) as f32,
            }
        } else if gemma {
            Mup {
                emb: (hidden as f32).sqrt(),
                ..Mup::default()
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
        let attn_scale = match num("query_pre_attn_scalar") {
            Some(q) if gemma && q > 0.0 => (1.0 / q.sqrt()) as f32,
            Some(q) if gemma => return Err(bad(path, format!("query_pre_attn_scalar {q} is not positive"))),
            _ => 1.0 / (head_dim as f32).sqrt(),
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
            rope_theta: rope.theta,
            rope_style: RopeStyle::RotateHalf,
            rope_dim,
            rope_scaling: rope.scaling,
            context,
            tie_embeddings: v.get("tie_word_embeddings").and_then(|t| t.as_bool()).unwrap_or(gemma),
            qkv_bias: arch == Arch::Qwen2 || v.get("attention_bias").and_then(|b| b.as_bool()).unwrap_or(false),
            qk_norm: arch == Arch::Qwen3 || gemma,
            mup,
            attn_scale,
            ffn_act,
            post_norms: gemma,
            sliding,
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

    /// The KV window of layer `i`: `Some(window)` for a sliding-window layer.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        self.sliding.as_ref().filter(|s| s.local[i]).map(|s| s.window)
    }

    /// Rope base and scaling of layer `i`.
    pub fn layer_rope(&self, i: usize) -> (f32, &RopeScaling) {
        match &self.sliding {
            Some(s) if s.local[i] => (s.local_theta, &s.local_scaling),
            _ => (self.rope_theta, &self.rope_scaling),
        }
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

/// RoPE settings of a Hugging Face config: transformers 5's `rope_parameters` (one object, or one per layer type
/// for Gemma 3) or the older `rope_theta` + `rope_scaling` (+ Gemma 3's `rope_local_base_freq`).
struct HfRope {
    theta: f32,
    scaling: RopeScaling,
    /// Sliding-window layers' base and scaling, where the config gives them apart.
    local: Option<(f32, RopeScaling)>,
}

impl HfRope {
    fn read(path: &Path, v: &serde_json::Value, rope_dim: usize, context: usize) -> Result<HfRope> {
        let base = |t: f64| -> Result<f32> {
            if t.is_finite() && t > 1.0 {
                Ok(t as f32)
            } else {
                Err(bad(path, format!("rope_theta {t} is not a base above 1")))
            }
        };
        let theta_of =
            |o: &serde_json::Value, default: f64| base(o.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(default));
        let default_theta = v.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(10000.0);
        if let Some(p) = v.get("rope_parameters").filter(|p| !p.is_null()) {
            // Per layer type (Gemma 3 under transformers 5): {"full_attention": {..}, "sliding_attention": {..}}.
            if let Some(full) = p.get("full_attention") {
                let local = match p.get("sliding_attention") {
                    Some(l) => Some((theta_of(l, 10000.0)?, RopeScaling::from_hf(path, l, rope_dim, context)?)),
                    None => None,
                };
                return Ok(HfRope {
                    theta: theta_of(full, default_theta)?,
                    scaling: RopeScaling::from_hf(path, full, rope_dim, context)?,
                    local,
                });
            }
            return Ok(HfRope {
                theta: theta_of(p, default_theta)?,
                scaling: RopeScaling::from_hf(path, p, rope_dim, context)?,
                local: None,
            });
        }
        let scaling = match v.get("rope_scaling").filter(|s| !s.is_null()) {
            Some(s) => {
                // Phi-3 writes original_max_position_embeddings beside rope_scaling, not in it.
                let mut s = s.clone();
                if let (Some(o), Some(top)) = (s.as_object_mut(), v.get("original_max_position_embeddings")) {
                    o.entry("original_max_position_embeddings")
                        .or_insert_with(|| top.clone());
                }
                RopeScaling::from_hf(path, &s, rope_dim, context)?
            }
            None => RopeScaling::None,
        };
        let local = match v.get("rope_local_base_freq").and_then(|x| x.as_f64()) {
            Some(b) => Some((base(b)?, RopeScaling::None)),
            None => None,
        };
        Ok(HfRope {
            theta: theta_of(v, default_theta)?,
            scaling,
            local,
        })
    }
}

/// Sliding-window layers of a Hugging Face config: `layer_types` where transformers writes it, else Gemma 3's
/// `sliding_window_pattern` (every n-th layer global, default 6), Mistral's window on every layer, or Qwen2's
/// `use_sliding_window` on layers from `max_window_layers` on.
fn hf_sliding(
    path: &Path,
    v: &serde_json::Value,
    arch: Arch,
    n_layers: usize,
    rope: &HfRope,
) -> Result<Option<SlidingWindow>> {
    // null, absent or 0: no window (transformers tests the value's truth).
    let window = match v
        .get("sliding_window")
        .filter(|w| !w.is_null() && w.as_u64() != Some(0))
    {
        None => {
            if arch == Arch::Gemma3 {
                return Err(bad(path, "a Gemma 3 config needs sliding_window"));
            }
            return Ok(None);
        }
        Some(w) => w
            .as_u64()
            .filter(|w| *w > 0)
            .ok_or_else(|| bad(path, "sliding_window must be a positive number"))? as usize,
    };
    let uses = v.get("use_sliding_window").and_then(|u| u.as_bool());
    let local: Vec<bool> = if let Some(types) = v.get("layer_types").filter(|t| !t.is_null()) {
        let list = types
            .as_array()
            .filter(|l| l.len() == n_layers)
            .ok_or_else(|| bad(path, format!("layer_types must list {n_layers} layer types")))?;
        list.iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                other => Err(bad(
                    path,
                    format!("layer type {other:?} is not supported (sliding_attention, full_attention)"),
                )),
            })
            .collect::<Result<_>>()?
    } else {
        match arch {
            Arch::Gemma3 => {
                let n = v.get("sliding_window_pattern").and_then(|x| x.as_u64()).unwrap_or(6) as usize;
                if n == 0 {
                    return Err(bad(path, "sliding_window_pattern must be positive"));
                }
                (0..n_layers).map(|i| (i + 1) % n != 0).collect()
            }
            Arch::Qwen2 | Arch::Qwen3 if uses != Some(true) => return Ok(None),
            Arch::Qwen2 | Arch::Qwen3 => {
                let from = v.get("max_window_layers").and_then(|x| x.as_u64()).unwrap_or(0) as usize;
                (0..n_layers).map(|i| i >= from).collect()
            }
            _ if uses == Some(false) => return Ok(None),
            _ => vec![true; n_layers],
        }
    };
    if !local.contains(&true) {
        return Ok(None);
    }
    let (local_theta, local_scaling) = match (&rope.local, arch) {
        (Some(l), _) => l.clone(),
        // transformers' Gemma 3 default rope_local_base_freq.
        (None, Arch::Gemma3) => (10000.0, RopeScaling::None),
        (None, _) => (rope.theta, rope.scaling.clone()),
    };
    Ok(Some(SlidingWindow {
        window,
        local,
        local_theta,
        local_scaling,
    }))
}

/// The embedding, residual and logit scalings of a GGUF: MiniCPM's muP factors as llama.cpp's converter writes
/// them (`embedding_scale` = scale_emb, `residual_scale` = scale_depth / sqrt(layers), `logit_scale` =
/// hidden / dim_model_base, by which the logits are divided), Gemma's sqrt(hidden) (llama.cpp scales in f32 too).
fn gguf_mup(f: &GgufFile, arch_name: &str, arch: Arch, hidden: usize) -> Result<Mup> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let mut m = Mup::default();
    match arch {
        Arch::Gemma3 => m.emb = (hidden as f32).sqrt(),
        Arch::MiniCpm => {
            m.emb = f.get_opt::<f32>(&key("embedding_scale"))?.unwrap_or(1.0);
            m.residual = f.get_opt::<f32>(&key("residual_scale"))?.unwrap_or(1.0);
            let logit = f.get_opt::<f32>(&key("logit_scale"))?.unwrap_or(1.0);
            if !(logit.is_finite() && logit > 0.0) {
                return Err(bad(f.path(), format!("{} {logit} is not positive", key("logit_scale"))));
            }
            m.logit = 1.0 / logit;
        }
        _ => {}
    }
    for (name, v) in [("embedding_scale", m.emb), ("residual_scale", m.residual)] {
        if !v.is_finite() {
            return Err(bad(f.path(), format!("{} {v} is not finite", key(name))));
        }
    }
    Ok(m)
}

/// RoPE scaling from GGUF keys: `rope_freqs.weight` (llama3-style divisors stored by llama.cpp), or
/// `{arch}.rope.scaling.type` none / linear / yarn with `.factor`, `.original_context_length` and `.attn_factor`.
fn gguf_rope_scaling(f: &GgufFile, arch: &str, rope_dim: usize) -> Result<RopeScaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    if f.tensor("rope_freqs.weight").is_some() {
        let d = f.tensor_f32("rope_freqs.weight")?;
        return RopeScaling::Divisors(d).check(f.path(), rope_dim);
    }
    let factor = f.get_opt::<f32>(&key("factor"))?;
    let original = f.get_opt::<u64>(&key("original_context_length"))?.map(|x| x as usize);
    // Phi-3's longrope as llama.cpp's converter stores it: both factor lists as tensors, the attention factor
    // under rope.scaling.attn_factor.
    if f.tensor("rope_factors_long.weight").is_some() {
        // llama.cpp's default for a file without the key: the trained context.
        let context = f.get_u64(&format!("{arch}.context_length"))? as f64;
        let original_max = original.unwrap_or(context as usize);
        let scale = context / original_max.max(2) as f64;
        let attn_default = if scale <= 1.0 {
            1.0
        } else {
            (1.0 + scale.ln() / (original_max as f64).ln()).sqrt()
        };
        let l = LongRope {
            short: f.tensor_f32("rope_factors_short.weight")?,
            long: f.tensor_f32("rope_factors_long.weight")?,
            original_max,
            attn_factor: f.get_opt::<f32>(&key("attn_factor"))?.unwrap_or(attn_default as f32),
            fixed_ctx: None,
        };
        return RopeScaling::LongRope(l).check(f.path(), rope_dim);
    }
    let scaling = match f.get_opt::<&str>(&key("type"))? {
        None | Some("none") => RopeScaling::None,
        Some("linear") => match factor {
            Some(factor) if factor != 1.0 => RopeScaling::Linear { factor },
            _ => RopeScaling::None,
        },
        Some("yarn") => {
            let factor = factor.ok_or_else(|| bad(f.path(), format!("yarn needs {}", key("factor"))))?;
            let original_max =
                original.ok_or_else(|| bad(f.path(), format!("yarn needs {}", key("original_context_length"))))?;
            // ggml's rope_yarn: cos and sin times attn_factor * (1 + 0.1 ln(factor)).
            let attn = f.get_opt::<f32>(&key("attn_factor"))?.unwrap_or(1.0);
            RopeScaling::Yarn {
                factor,
                original_max,
                beta_fast: f
                    .get_opt::<f32>(&format!("{arch}.rope.scaling.yarn_beta_fast"))?
                    .unwrap_or(32.0),
                beta_slow: f
                    .get_opt::<f32>(&format!("{arch}.rope.scaling.yarn_beta_slow"))?
                    .unwrap_or(1.0),
                attn_factor: attn * if factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 },
            }
        }
        Some(other) => {
            return Err(bad(
                f.path(),
                format!("{} {other:?} is not supported (none, linear, yarn)", key("type")),
            ))
        }
    };
    scaling.check(f.path(), rope_dim)
}
