//! Llama-family hyper-parameters and their checks; read from GGUF metadata (`gguf.rs`) or a Hugging Face
//! `config.json` (`hf.rs`).

mod gguf;
mod hf;

use crate::error::{Error, Result};
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
        // Bounds far past any published model that keep every size product (parameters, KV cache) in 64 bits.
        let limits = [
            ("n_layers", c.n_layers, 4096),
            ("hidden", c.hidden, 1 << 17),
            ("n_heads", c.n_heads, 4096),
            ("head_dim", c.head_dim, 1024),
            ("ffn", c.ffn, 1 << 20),
            ("vocab", c.vocab, 1 << 24),
            ("context", c.context, 1 << 24),
        ];
        for (name, v, max) in limits {
            if v > max {
                return Err(bad(
                    path,
                    format!("implausible model size: {name} = {v} (at most {max})"),
                ));
            }
        }
        if !(c.rms_eps.is_finite() && c.rms_eps > 0.0 && c.rms_eps < 1.0) {
            return Err(bad(path, format!("norm epsilon {} is not in (0, 1)", c.rms_eps)));
        }
        if !(c.rope_theta.is_finite() && c.rope_theta > 0.0) {
            return Err(bad(path, format!("rope theta {} is not positive", c.rope_theta)));
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
